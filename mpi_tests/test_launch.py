"""The silent-singleton check (ccl.launch), without Slurm: environments are faked.

The same check under a real ``srun --mpi=none`` is in test_slurm.py.
"""

import numpy as np
import pytest
from mpi4py import MPI

import ccl
from ccl import launch
from ccl.bench.__main__ import main as bench_main

LAUNCH_VARIABLES = [name for name, _ in launch.LAUNCH_VARIABLES]


@pytest.fixture
def clean_env(monkeypatch):
    """No launcher variables and no override, whatever launched this test."""
    for name in LAUNCH_VARIABLES + ["SLURM_NTASKS", "SLURM_NPROCS", "CCL_SKIP_LAUNCH_CHECK"]:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("env, expected", [
    ({}, (None, None)),
    # sbatch/salloc describe the allocation, not this process's launch: ignored
    ({"SLURM_NTASKS": "4", "SLURM_NPROCS": "4"}, (None, None)),
    ({"SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "2"}, (2, "SLURM_STEP_NUM_TASKS")),
    ({"PMI_SIZE": "3"}, (3, "PMI_SIZE")),
    ({"OMPI_COMM_WORLD_SIZE": "5"}, (5, "OMPI_COMM_WORLD_SIZE")),
    ({"MV2_COMM_WORLD_SIZE": "6"}, (6, "MV2_COMM_WORLD_SIZE")),
    # mpiexec inside a one-task srun step: the innermost launcher wins
    ({"SLURM_STEP_NUM_TASKS": "1", "PMI_SIZE": "4"}, (4, "PMI_SIZE")),
    # garbage is not a size
    ({"PMI_SIZE": "", "OMPI_COMM_WORLD_SIZE": "x", "SLURM_STEP_NUM_TASKS": "0"}, (None, None)),
    ({"PMI_SIZE": " 2 "}, (2, "PMI_SIZE")),
])
def test_launcher_world_size(env, expected):
    assert launch.launcher_world_size(env) == expected


@pytest.mark.parametrize("env, world, raises", [
    ({}, 1, False),
    ({"SLURM_NTASKS": "4"}, 1, False),               # `python x.py` inside a 4-task sbatch
    ({"SLURM_STEP_NUM_TASKS": "1"}, 1, False),       # srun -n 1
    ({"SLURM_STEP_NUM_TASKS": "4"}, 4, False),       # srun --mpi=pmi2 -n 4, working
    ({"SLURM_STEP_NUM_TASKS": "1", "PMI_SIZE": "4"}, 4, False),
    ({"SLURM_STEP_NUM_TASKS": "4"}, 2, False),       # not a singleton: not this check's job
    ({"SLURM_STEP_NUM_TASKS": "4"}, 1, True),        # srun --mpi=none -n 4
    ({"SLURM_STEP_NUM_TASKS": "2", "PMI_SIZE": "2"}, 1, True),  # srun --mpi=pmi2, Open MPI
    ({"PMI_SIZE": "3"}, 1, True),                    # hydra's mpiexec, Open MPI library
    ({"OMPI_COMM_WORLD_SIZE": "3"}, 1, True),        # Open MPI's mpiexec, MPICH library
    ({"SLURM_STEP_NUM_TASKS": "4", "CCL_SKIP_LAUNCH_CHECK": "1"}, 1, False),
    ({"SLURM_STEP_NUM_TASKS": "4", "CCL_SKIP_LAUNCH_CHECK": "0"}, 1, True),
])
def test_check_launch_fires_only_on_the_singleton_trap(env, world, raises):
    if not raises:
        launch.check_launch(world, env)
        return
    with pytest.raises(ccl.LaunchError) as info:
        launch.check_launch(world, env)
    error = info.value
    assert isinstance(error, ccl.CCLError) and isinstance(error, RuntimeError)
    assert error.world_size == 1 and error.expected == launch.launcher_world_size(env)[0]
    assert error.variable in env and f"{error.variable}={error.expected}" in str(error)


@pytest.mark.parametrize("library, lead", [("MPICH Version: 5.0.2", "--mpi=pmi2"),
                                           ("Open MPI v5.0.11", "--mpi=pmix")])
def test_message_names_the_fix_for_the_loaded_library(monkeypatch, library, lead):
    monkeypatch.setattr(launch, "_library", lambda: library)
    with pytest.raises(ccl.LaunchError) as info:
        launch.check_launch(1, {"SLURM_STEP_NUM_TASKS": "4"})
    message = str(info.value)
    fix = message.split("Likely fix: ", 1)[1]
    assert fix.startswith(f"with srun, {lead}")
    for hint in ("--mpi=pmi2", "--mpi=pmix", "mpiexec", "--mpi-library", "CCL_SKIP_LAUNCH_CHECK"):
        assert hint in message
    with pytest.raises(ccl.LaunchError) as info:
        launch.check_launch(1, {"PMI_SIZE": "4"})
    # under an mpiexec, the mpiexec/library mismatch is the likelier cause
    assert str(info.value).split("Likely fix: ", 1)[1].startswith("launch with the mpiexec")
    # srun --mpi=pmi2 sets PMI_SIZE too: then it is srun's plugin that is wrong
    with pytest.raises(ccl.LaunchError) as info:
        launch.check_launch(1, {"PMI_SIZE": "4", "SLURM_STEP_NUM_TASKS": "4"})
    assert "(set by srun)" in str(info.value)
    assert str(info.value).split("Likely fix: ", 1)[1].startswith(f"with srun, {lead}")


@pytest.mark.serial
def test_the_first_collective_raises_on_the_trap(clean_env):
    clean_env.setattr(launch, "_PASSED", False)
    clean_env.setenv("SLURM_STEP_NUM_TASKS", "4")
    x = np.ones(5, np.float32)
    for _ in range(2):  # still raises on the next call: the check is not marked passed
        with pytest.raises(ccl.LaunchError, match="SLURM_STEP_NUM_TASKS=4"):
            ccl.compressed_allreduce(x, "fp16", comm=MPI.COMM_SELF, algorithm="ring")
    clean_env.setenv("CCL_SKIP_LAUNCH_CHECK", "1")
    y = ccl.compressed_allreduce(x, "none", comm=MPI.COMM_SELF, algorithm="ring")
    np.testing.assert_array_equal(y, x)
    assert launch._PASSED


@pytest.mark.serial
def test_bench_cli_refuses_to_measure_singletons(clean_env, capsys):
    clean_env.setenv("PMI_SIZE", "4")
    assert bench_main(["allreduce", "--quick"]) == 2
    assert bench_main(["accuracy", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("PMI_SIZE=4") == 2 and "silent-singleton" in err


@pytest.mark.mpi
def test_launcher_variables_describe_this_world():
    """Under a real mpiexec the variable the check trusts equals the world size."""
    size, variable = launch.launcher_world_size()
    if size is None:
        pytest.skip("not started by a launcher that sets one of " + ", ".join(LAUNCH_VARIABLES))
    assert size == MPI.COMM_WORLD.size, f"{variable}={size} but the world has " \
                                        f"{MPI.COMM_WORLD.size} ranks"
    launch.check_launch()


@pytest.mark.mpi
def test_node_local_rank(comm):
    local, local_size = launch.node_local_rank(comm)
    assert 0 <= local < local_size <= comm.size
    # every rank of a node has a distinct local rank, and the counts add up
    rows = comm.allgather((MPI.Get_processor_name(), local, local_size))
    by_node = {}
    for node, r, n in rows:
        by_node.setdefault(node, []).append((r, n))
    assert sum(len(v) for v in by_node.values()) == comm.size
    for members in by_node.values():
        assert sorted(r for r, _ in members) == list(range(len(members)))
        assert {n for _, n in members} == {len(members)}


# ------------------------------------------------------------------ nodes
@pytest.mark.parametrize("value, expected", [(None, None), ("", None), ("1", 1), (" 4 ", 4)])
def test_local_size_override(value, expected):
    env = {} if value is None else {"CCL_LOCAL_SIZE": value}
    assert launch.local_size_override(env) == expected


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_local_size_override_rejects(value):
    with pytest.raises(ValueError, match="CCL_LOCAL_SIZE"):
        launch.local_size_override({"CCL_LOCAL_SIZE": value})


@pytest.mark.mpi
@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_node_comm_blocks_of_local_size(comm, k):
    node = launch.node_comm(comm, {"CCL_LOCAL_SIZE": str(k)})
    try:
        members = node.allgather(MPI.COMM_WORLD.rank)
        ranks_in_comm = node.allgather(comm.rank)
    finally:
        node.Free()
    first = MPI.COMM_WORLD.rank // k * k
    # consecutive world ranks, the last block cut short (uneven nodes)
    assert members == list(range(first, min(first + k, MPI.COMM_WORLD.size)))
    assert ranks_in_comm == sorted(ranks_in_comm)


@pytest.mark.mpi
def test_node_comm_without_override_is_the_shared_memory_split(comm):
    node = launch.node_comm(comm, {})
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        assert node.allgather(comm.rank) == shared.allgather(comm.rank)
    finally:
        node.Free()
        shared.Free()


@pytest.mark.mpi
def test_node_comm_bad_local_size_raises_on_every_rank(comm):
    # rank 0 alone has a bad value: it raises ValueError, the others MismatchError
    env = {"CCL_LOCAL_SIZE": "zero" if comm.rank == 0 else "2"}
    expected = ValueError if comm.rank == 0 else ccl.MismatchError
    with pytest.raises(expected, match="CCL_LOCAL_SIZE"):
        launch.node_comm(comm, env)


@pytest.mark.mpi(min_size=2)
def test_node_comm_ranks_with_different_local_sizes_raise(comm):
    env = {"CCL_LOCAL_SIZE": "1" if comm.rank == 0 else "2"}
    with pytest.raises(ccl.MismatchError, match="CCL_LOCAL_SIZE"):
        launch.node_comm(comm, env)
