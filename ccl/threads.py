"""The thread budget: how many numba threads a rank's codec kernels may use.

Numba starts one worker per core in every process. Four ranks on a
two-core machine then run eight workers, plus torch's threads and the MPI
library's busy polling, on two cores, and a parallel 3LC kernel that should
take milliseconds waits for a core instead. ccl therefore gives each rank a
**fair share** of the cores it may run on:

``threads = max(1, cores // ranks_on_this_machine)``

* ``cores`` is what the rank may run on: its CPU affinity
  (``os.sched_getaffinity``), so a launcher that binds ranks to cores is
  respected;
* ``ranks_on_this_machine`` counts the ranks of the communicator that run
  on the same kernel (the same boot id), whatever the MPI library thinks of
  nodes: ranks of an emulated cluster in network namespaces share the
  machine's cores all the same. It is found once per communicator, in the
  first collective call (collective, after the call's agreement);
* the thread that runs a collective (the caller's, or ``ccl.torch``'s
  communication thread) is one of the ``threads``: it waits while the
  workers run a parallel region. torch's own threads are left to torch.

With a budget of one thread the kernels run their serial variants (threads
cannot pay there). ``CCL_NUM_THREADS`` sets the budget, and an explicit
``NUMBA_NUM_THREADS`` in the environment turns the rule off (numba's own
setting is then used as it is). The budget is applied to the calling thread
for the duration of each collective (numba's thread count is per thread) and
the caller's own count is restored afterwards, so a kernel runs with the
same threads in a communication thread as in the main thread.

>>> budget(cores=16, ranks=4, environ={})
4
>>> budget(cores=2, ranks=4, environ={})
1
>>> budget(cores=2, ranks=4, environ={"NUMBA_NUM_THREADS": "2"}) is None
True
"""

import contextlib
import hashlib
import os
import sys
import time

import numba
import numpy as np
from mpi4py import MPI

from . import config

__all__ = ["available_cores", "machine_id", "budget", "fair_share", "ranks_on_machine",
           "torch_threads_kept", "budgeted", "channel_budget", "busy_cores", "cores_share",
           "LOAD_WINDOW_S"]


def available_cores():
    """The number of cores this process may run on (its affinity, else the CPU count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def machine_id():
    """A 63-bit number that is the same for every process on this machine's kernel.

    The kernel's boot id is shared by every network namespace and container
    of one machine, where host names may differ; the host name is the
    fallback where there is no boot id.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            text = f.read().strip()
    except OSError:
        text = MPI.Get_processor_name().encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1


def ranks_on_machine(comm, wait=None):
    """How many ranks of ``comm`` run on this rank's machine (collective).

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        Every rank of it must call.
    wait : callable, optional
        ``wait(request, what)`` completes the nonblocking exchange (ccl's
        channels pass theirs, which honours the timeout); default: wait.

    Returns
    -------
    int
    """
    mine = np.array([machine_id()], dtype=np.int64)
    ids = np.empty(comm.Get_size(), dtype=np.int64)
    request = comm.Iallgather([mine, MPI.INT64_T], [ids, MPI.INT64_T])
    if wait is None:
        request.Wait()
    else:
        wait(request, "the machines of every rank")
    return int(np.count_nonzero(ids == mine[0]))


def budget(cores, ranks, environ=None):
    """The numba threads of one rank; None leaves numba's own setting.

    Parameters
    ----------
    cores : int
        Cores the rank may run on (:func:`available_cores`).
    ranks : int
        Ranks sharing them (:func:`ranks_on_machine`).
    environ : mapping, optional
        Where to read ``CCL_NUM_THREADS`` and ``NUMBA_NUM_THREADS`` (default
        ``os.environ``).

    Returns
    -------
    int or None
        ``CCL_NUM_THREADS`` if set; None if ``NUMBA_NUM_THREADS`` is set;
        otherwise ``max(1, cores // ranks)``.
    """
    env = os.environ if environ is None else environ
    explicit = config.read("CCL_NUM_THREADS", env)
    if explicit is not None:
        return explicit
    if str(env.get("NUMBA_NUM_THREADS", "")).strip():
        return None
    return max(1, cores // max(1, ranks))


def fair_share(cores, ranks):
    """A rank's share of its machine's cores, at most 1 (for ``auto``'s cost model).

    ``auto``'s codec speeds are one core's; a rank with half a core runs its
    codec half as fast.

    >>> fair_share(2, 4), fair_share(16, 4)
    (0.5, 1.0)
    """
    return min(1.0, cores / max(1, ranks))


def channel_budget(channel):
    """``(threads, share)`` of ``channel``'s ranks, found once (collective the first time).

    ``threads`` is :func:`budget`'s answer for this rank, capped at numba's
    pool size (``NUMBA_NUM_THREADS``, what :func:`budgeted` can set: the
    threads the kernels really run on); ``share`` is the smallest
    :func:`fair_share` of any rank, agreed so that ``auto`` decides alike
    everywhere. Kept in the channel's measurements
    (:class:`ccl.transport.cache.Measurements`).
    """
    def find():
        cores = available_cores()
        ranks = ranks_on_machine(channel.comm, channel.wait)
        shares = np.empty(1)
        channel.wait(channel.comm.Iallreduce(np.array([fair_share(cores, ranks)]), shares,
                                             op=MPI.MIN), "the cores of every rank")
        threads = budget(cores, ranks)
        if threads is not None:
            threads = max(1, min(threads, numba.config.NUMBA_NUM_THREADS))
        return threads, float(shares[0])
    return channel.measured.thread_budget(find)


#: Seconds :func:`cores_share` watches the machine while this communicator's ranks sleep.
LOAD_WINDOW_S = 0.2
_USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_ticks(cpus):
    """``(busy, total)`` ticks of ``cpus`` from ``/proc/stat`` (None where it is unreadable)."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    busy = total = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            ticks = [int(v) for v in rest.split()]
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
            busy, total = busy + sum(ticks[:8]) - idle, total + sum(ticks[:8])
    return (busy, total) if total else None


def _watch(seconds):
    """Sleep ``seconds``; return ``(busy, own, window)`` seconds, or None off Linux.

    ``busy`` is the CPU time all work spent on this process's cores (its
    affinity) meanwhile, from ``/proc/stat``; ``own`` this process's CPU time
    (every thread); ``window`` the seconds the kernel counted.
    """
    try:
        cpus = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None
    own = time.process_time()
    before = _cpu_ticks(cpus)
    time.sleep(seconds)
    after = _cpu_ticks(cpus)
    own = time.process_time() - own
    if before is None or after is None or after[1] <= before[1]:
        return None
    # total ticks / cores is the window as the kernel counted it
    return ((after[0] - before[0]) / _USER_HZ, own,
            (after[1] - before[1]) / _USER_HZ / len(cpus))


def busy_cores(seconds=LOAD_WINDOW_S):
    """The cores of this process's affinity that other processes keep busy, over ``seconds``.

    Sleeps for ``seconds`` and reads the busy time of the process's cores
    from ``/proc/stat`` before and after, less this process's own CPU time.
    Returns 0.0 where ``/proc/stat`` is not there (not Linux).
    """
    watched = _watch(seconds)
    if watched is None:
        return 0.0
    busy, own, window = watched
    return min(float(available_cores()), max(0.0, (busy - own) / window))


def cores_share(channel, measure=True):
    """The share of a core each rank of ``channel`` gets, agreed (collective, cached).

    ``cores / (ranks + others)``, at most 1, the smallest of any rank:
    ``cores`` is the rank's affinity, ``ranks`` the ranks of the
    communicator on its machine, and ``others`` the cores that work outside
    those ranks kept busy while they slept for :data:`LOAD_WINDOW_S` after a
    barrier (the busy time of the cores from ``/proc/stat``, less the CPU
    time of the ranks of the machine): the kernel shares the cores among
    every runnable thread, so two busy processes beside four ranks on two
    cores leave each rank a third of a core. With ``measure=False`` other
    work is not looked for (``others`` is 0, :func:`fair_share`); off Linux
    it counts as 0. Measured once per communicator; ``auto``'s cost model
    runs the codecs at this share.

    Returns
    -------
    dict
        ``share`` (agreed), ``cores``, ``ranks_on_machine`` and
        ``other_cores`` (the most any rank measured; None when not measured).
    """
    return channel.measured.cores_share(lambda measure: _cores_share(channel, measure), measure)


def _cores_share(channel, measure):
    """:func:`cores_share`, found now (collective)."""
    cores = available_cores()
    ranks = ranks_on_machine(channel.comm, channel.wait)
    others = None
    if measure:
        channel.wait(channel.comm.Ibarrier(), "the other ranks, to watch the machine's load")
        watched = _watch(LOAD_WINDOW_S) or (0.0, 0.0, 1.0)
        # every rank's CPU time, by machine, in nanoseconds
        mine = np.array([machine_id(), int(watched[1] * 1e9)], dtype=np.int64)
        rows = np.empty((channel.size, 2), dtype=np.int64)
        channel.wait(channel.comm.Iallgather([mine, MPI.INT64_T], [rows, MPI.INT64_T]),
                     "the CPU time of every rank")
        job = rows[rows[:, 0] == mine[0], 1].sum() / 1e9
        others = min(float(cores), max(0.0, (watched[0] - job) / watched[2]))
    mine = np.array([min(1.0, cores / max(1.0, ranks + (others or 0.0))), -(others or 0.0)])
    agreed = np.empty(2)
    channel.wait(channel.comm.Iallreduce(mine, agreed, op=MPI.MIN), "the cores of every rank")
    return {"share": float(agreed[0]), "cores": cores, "ranks_on_machine": ranks,
            "other_cores": None if others is None else float(-agreed[1])}


@contextlib.contextmanager
def torch_threads_kept():
    """Run the body, then give torch back the thread count it had (if torch is loaded).

    With numba's OpenMP threading layer, numba and torch share the calling
    thread's OpenMP thread count: numba's first parallel kernel in a thread
    sets it to numba's pool size, and ``numba.set_num_threads`` sets it too.
    torch would then run one thread per core in every rank, whatever
    ``torch.set_num_threads`` said.
    """
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    try:
        yield
    finally:
        if before is not None and torch.get_num_threads() != before:
            torch.set_num_threads(before)


@contextlib.contextmanager
def budgeted(threads):
    """Run the body with ``threads`` numba threads in this thread, then restore the count.

    torch's thread count is kept (:func:`torch_threads_kept`).

    Parameters
    ----------
    threads : int or None
        None leaves the count as it is. Capped at numba's pool size.
    """
    with torch_threads_kept():
        if threads is None:
            yield
            return
        before = numba.get_num_threads()
        wanted = max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS))
        if wanted != before:
            numba.set_num_threads(wanted)
        try:
            yield
        finally:
            if wanted != before:
                numba.set_num_threads(before)
