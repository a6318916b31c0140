"""An emulated cluster on one machine, for benchmarks: MPI ranks on hosts behind rate-limited links.

``python -m ccl.bench.cluster --hosts 4 --rate 1gbit -- python -m mpi4py -m ccl.bench``
``python -m ccl.bench.cluster --hosts 2 --ranks-per-host 2 -- python -m mpi4py ...``

The hosts and links are those of :class:`ccl.bench.network.EmulatedNetwork`:
one network namespace per host, each joined by a rate-limited veth to a
switch. The command runs under the MPICH ``mpiexec`` of the running Python's
environment with ``--ranks-per-host`` ranks (default 1) in each host, rank
``r`` on host ``r // ranks_per_host``: each rank enters its host through a
generated wrapper.

MPICH learns the layout from the launcher: every host is a "node" of its
own in ``mpiexec``'s host list (hydra's fork launcher still starts all of
them on this machine). Ranks of one node talk over shared memory; ranks of
different nodes over TCP sockets (``MPIR_CVAR_CH4_NETMOD=ofi``,
``FI_PROVIDER=tcp``) on ``eth0``, so only traffic between hosts crosses an
emulated link. With one rank per host MPICH is also told to use no shared
memory at all (``MPIR_CVAR_NOLOCAL=1``). With more, ``CCL_LOCAL_SIZE`` is set
to the ranks per host, so ccl's node detection (:func:`ccl.launch.node_comm`)
sees the same layout.

Creating namespaces needs root (or ``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN``)
and iproute2. The namespaces are always removed again: after the command,
when it fails, when setup fails halfway, and on SIGINT or SIGTERM.
``--rate none`` (or ``shm``) runs the same command without namespaces, over
shared memory, for comparison; that needs no privileges.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .network import (ClusterUnavailable, EmulatedNetwork, ip_path, netns_list, netns_pids,
                      parse_rate, rate_bits_per_s, remove_stale, unavailable_reason)

__all__ = ["EmulatedCluster", "ClusterUnavailable", "parse_rate", "rate_bits_per_s",
           "unavailable_reason", "netns_list", "netns_pids", "remove_stale"]

# MPICH on the emulated network: TCP sockets through libfabric between nodes (hosts).
NETWORK_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
# ... and with one rank per host, no shared memory at all, whatever the launcher maps.
ONE_RANK_ENV = {"MPIR_CVAR_NOLOCAL": "1"}


def _mpiexec():
    # The mpiexec beside the running Python belongs to the MPI its mpi4py loads.
    candidate = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    path = candidate if os.path.exists(candidate) else shutil.which("mpiexec")
    if path is None:
        raise ClusterUnavailable(f"no mpiexec beside {sys.executable} or on PATH; "
                                 "install the mpich wheel: pip install mpich")
    return path


def _killpg(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _stop(proc, grace=5.0):
    """End ``proc`` and everything it started (its own process group)."""
    _killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    _killpg(proc.pid, signal.SIGKILL)  # whatever ignored SIGTERM or outlived mpiexec
    proc.wait()


class EmulatedCluster(EmulatedNetwork):
    """An :class:`~ccl.bench.network.EmulatedNetwork` that runs MPI jobs.

    Each host runs ``ranks_per_host`` ranks.
    Use it as a context manager: entering builds the network, leaving removes
    it, whatever happened in between.

    Parameters
    ----------
    hosts : int
        Number of hosts, 1 to 254.
    rate : str
        Link rate, a ``tc`` rate such as ``100mbit`` or ``1gbit``, applied on
        both ends of every link (each host sends *and* receives at most this
        fast); ``none`` or ``shm`` builds nothing and runs over shared memory.
    ranks_per_host : int
        MPI ranks :meth:`run` starts on each host (default 1); rank ``r`` runs
        on host ``r // ranks_per_host``.

    Attributes
    ----------
    prefix : str
        Start of every namespace name: ``ccl<pid>-<n>``, unique per process and
        per cluster, so parallel runs never collide.
    namespaces : list of str
        The hosts' namespace names, ``<prefix>-h<host>`` (empty for ``none``).
    switch : str or None
        The switch namespace's name, ``<prefix>-sw``.
    ranks : int
        ``hosts * ranks_per_host``, the size of the jobs :meth:`run` starts.

    Examples
    --------
    >>> with EmulatedCluster(2, "100mbit", ranks_per_host=2) as cluster:  # doctest: +SKIP
    ...     result = cluster.run(["python", "-m", "mpi4py", "train.py"])
    >>> result.returncode  # doctest: +SKIP
    0
    """

    def __init__(self, hosts, rate="1gbit", ranks_per_host=1):
        super().__init__(hosts, rate)
        if isinstance(ranks_per_host, bool) or not isinstance(ranks_per_host, int) \
                or ranks_per_host < 1:
            raise ValueError(f"ranks_per_host must be an int >= 1, got {ranks_per_host!r}")
        self.ranks_per_host = ranks_per_host
        self.ranks = self.hosts * ranks_per_host
        self._tmpdir = None
        self._wrapper = None

    def host_of(self, rank):
        """The host that rank ``rank`` of :meth:`run`'s jobs runs on."""
        return rank // self.ranks_per_host

    def up(self):
        """Build the network and the wrapper ranks enter it by; remove both on failure.

        Raises
        ------
        ClusterUnavailable
            Without the privileges or tools the network needs.
        """
        super().up()
        if not self.emulated:
            return
        try:
            self._write_wrapper(ip_path())
        except BaseException:
            self.down()
            raise

    def _write_wrapper(self, ip):
        # hydra's fork launcher starts every rank here with PMI_RANK set; the PMI socket is
        # an inherited file descriptor, so it still works inside the namespace.
        self._tmpdir = tempfile.mkdtemp(prefix="ccl-cluster-")
        self._wrapper = os.path.join(self._tmpdir, "enter-host")
        host = f"$((${{PMI_RANK:?}} / {self.ranks_per_host}))"
        with open(self._wrapper, "w") as f:
            f.write(f'#!/bin/sh\nexec {ip} netns exec "{self.prefix}-h{host}" "$@"\n')
        os.chmod(self._wrapper, 0o755)

    def down(self):
        """Remove every namespace this cluster created, killing what still runs inside.

        Idempotent; reports namespaces it could not remove on stderr instead of raising.
        """
        super().down()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = self._wrapper = None

    def command(self, cmd):
        """The ``mpiexec`` command line that runs ``cmd`` on every host's ranks."""
        launch = [_mpiexec(), "-launcher", "fork"]
        if self.emulated:
            if self._wrapper is None:
                raise RuntimeError("the cluster is not up; use it as a context manager")
            # one "node" per host: MPICH uses shared memory only among a host's ranks, and
            # places ranks in consecutive blocks of ranks_per_host, as the wrapper does
            launch += ["-hosts", ",".join(self.namespaces), "-ppn", str(self.ranks_per_host),
                       "-n", str(self.ranks), self._wrapper]
        else:
            launch += ["-n", str(self.ranks)]
        return launch + list(cmd)

    def environment(self, env=None):
        """The environment for :meth:`run`: ``env`` (default: this process's) plus MPICH's
        settings for the emulated network, ``CCL_LOCAL_SIZE`` for several ranks per host,
        and the links' rate in ``CCL_BENCH_WIRE_GBPS`` (the wire bound of
        ``python -m ccl.bench``; ``auto`` still measures the link itself)."""
        merged = dict(os.environ if env is None else env, HYDRA_LAUNCHER="fork")
        if self.emulated:
            merged.update(NETWORK_ENV)
            merged.setdefault("CCL_BENCH_WIRE_GBPS", f"{rate_bits_per_s(self.rate) / 1e9:g}")
            if self.ranks_per_host == 1:
                merged.update(ONE_RANK_ENV)
        if self.ranks_per_host > 1:
            merged["CCL_LOCAL_SIZE"] = str(self.ranks_per_host)
        return merged

    def run(self, cmd, timeout=None, env=None, **kwargs):
        """Run ``cmd`` under ``mpiexec``, ``ranks_per_host`` ranks per host, and wait for it.

        Parameters
        ----------
        cmd : sequence of str
            The program each rank runs, e.g. ``[sys.executable, "-m", "mpi4py", "x.py"]``.
        timeout : float, optional
            Seconds before the job and every rank are killed.
        env : dict, optional
            Environment for the ranks (default: this process's); see :meth:`environment`.
        **kwargs
            Passed to :class:`subprocess.Popen` (e.g. ``stdout=subprocess.PIPE``).

        Returns
        -------
        subprocess.CompletedProcess
            With ``mpiexec``'s exit status, and output if it was captured.

        Raises
        ------
        subprocess.TimeoutExpired
            After killing the job, if it ran longer than ``timeout``.
        """
        args = self.command(cmd)
        # Its own process group, so the whole job (mpiexec, proxy, ranks) can be ended at once.
        proc = subprocess.Popen(args, env=self.environment(env), start_new_session=True,
                                **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            _stop(proc)
            proc.communicate()
            raise
        return subprocess.CompletedProcess(args, proc.returncode, out, err)


class _Terminated(Exception):
    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, frame):
    raise _Terminated(signum)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m ccl.bench.cluster",
        description="Run an MPI command on an emulated cluster on this machine: one network "
                    "namespace per host behind rate-limited links (bandwidth, not latency), "
                    "shared memory between the ranks of one host. Needs root. Example: "
                    "python -m ccl.bench.cluster --hosts 4 --rate 1gbit "
                    "-- python -m mpi4py -m ccl.bench --quick")
    parser.add_argument("--hosts", type=int, help="number of hosts")
    parser.add_argument("--ranks-per-host", type=int, default=1,
                        help="MPI ranks on each host, rank r on host r // RANKS_PER_HOST; "
                             "sets CCL_LOCAL_SIZE when above 1 (default: %(default)s)")
    parser.add_argument("--rate", default="1gbit",
                        help="link rate per host and direction, a tc rate (100mbit, 1gbit, "
                             "10gbit, ...); 'none' or 'shm': no namespaces, shared memory "
                             "(default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="kill the job after this many seconds (exit status 124)")
    parser.add_argument("--cleanup", action="store_true",
                        help="only remove namespaces left by runs that were killed (SIGKILL)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- then the command every rank runs")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if args.cleanup:
        return args
    if args.hosts is None or not args.command:
        parser.error("give --hosts and, after --, the command to run")
    if args.ranks_per_host < 1:
        parser.error(f"--ranks-per-host must be at least 1, got {args.ranks_per_host}")
    try:
        parse_rate(args.rate)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def main(argv=None):
    """Command-line entry point; returns the command's exit status."""
    args = parse_args(argv)
    if args.cleanup:
        try:
            removed = remove_stale()
        except ClusterUnavailable as exc:
            print(f"ccl.bench.cluster: {exc}", file=sys.stderr)
            return 2
        print(f"ccl.bench.cluster: removed {len(removed)} stale namespaces {removed}",
              file=sys.stderr)
        return 0
    try:
        cluster = EmulatedCluster(args.hosts, args.rate, args.ranks_per_host)
    except ValueError as exc:
        print(f"ccl.bench.cluster: {exc}", file=sys.stderr)
        return 2
    # SIGTERM becomes an exception, so the namespaces are removed as on Ctrl-C.
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        with cluster:
            each = "" if args.ranks_per_host == 1 else f" x {args.ranks_per_host} ranks"
            where = (f"{args.hosts} hosts{each} at {cluster.rate} (namespaces "
                     f"{cluster.prefix}-*)" if cluster.emulated
                     else f"{cluster.ranks} ranks over shared memory")
            print(f"ccl.bench.cluster: {where}", file=sys.stderr, flush=True)
            start = time.monotonic()
            status = cluster.run(args.command, timeout=args.timeout).returncode
            print(f"ccl.bench.cluster: exit status {status} after "
                  f"{time.monotonic() - start:.1f} s", file=sys.stderr, flush=True)
    except ClusterUnavailable as exc:
        print(f"ccl.bench.cluster: {exc}", file=sys.stderr)
        return 2
    except subprocess.TimeoutExpired:
        print(f"ccl.bench.cluster: killed after {args.timeout:g} s", file=sys.stderr)
        return 124
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except _Terminated as exc:
        return 128 + exc.signum
    finally:
        signal.signal(signal.SIGTERM, previous)
    # mpiexec itself killed by a signal: report it as a shell does
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main())
