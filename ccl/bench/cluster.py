"""An emulated cluster on one machine, for benchmarks: one host per rank, rate-limited links.

``python -m ccl.bench.cluster --hosts 4 --rate 1gbit -- python -m mpi4py -m ccl.bench``

Each host is a network namespace with one interface, ``eth0``
(``10.200.0.<rank+1>/24``), joined by a veth pair to a bridge in a separate
"switch" namespace. A token-bucket filter (``tbf``) on *both* ends of every
veth limits each host's send and receive rate. The command then runs under
the MPICH ``mpiexec`` of the running Python's environment, one rank per
host: each rank enters its host through a generated wrapper, and MPICH is
told to use TCP sockets and no shared memory, so every byte between ranks
crosses an emulated link.

This emulates **bandwidth, not latency**: there is no propagation delay
(netem is not used), only the serialisation time of the link rate.

Creating namespaces needs root (or ``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN``)
and iproute2. The namespaces are always removed again: after the command,
when it fails, when setup fails halfway, and on SIGINT or SIGTERM.
``--rate none`` (or ``shm``) runs the same command without namespaces, over
shared memory, for comparison; that needs no privileges.
"""

import argparse
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

__all__ = ["EmulatedCluster", "ClusterUnavailable", "parse_rate", "rate_bits_per_s",
           "unavailable_reason", "netns_list", "netns_pids", "remove_stale"]

NO_NETWORK = ("none", "shm")
MAX_HOSTS = 254  # one /24 of host addresses
SUBNET = "10.200.0"  # private; only ever configured inside namespaces made here
MTU = 9000
# tbf needs a bucket larger than the MTU; these are the verified recipe's settings.
TBF = ("burst", "512kb", "latency", "20ms")
# MPICH: no shared memory between ranks on one machine, TCP sockets through libfabric.
NETWORK_ENV = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}

_RATE = re.compile(r"^(\d+(?:\.\d+)?)((?:[kmgt]i?)?(?:bit|bps))$")
_PREFIX = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
           "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_NAME = re.compile(r"^ccl(\d+)-\d+-(?:h\d+|sw)$")
_CAP_NET_ADMIN, _CAP_SYS_ADMIN = 12, 21
_serial = itertools.count()


class ClusterUnavailable(RuntimeError):
    """This machine or user cannot create the emulated network (no root, no iproute2, ...)."""


def parse_rate(text):
    """Validate a link rate.

    Parameters
    ----------
    text : str
        A ``tc`` rate such as ``100mbit``, ``1gbit``, ``10gbit``, ``500mbps``
        (bytes per second), or ``none``/``shm`` for no emulated network.

    Returns
    -------
    str or None
        The rate in lower case, as ``tc`` will be given it; None for no network.

    Raises
    ------
    ValueError
        If ``text`` is not a positive rate in one of those forms.

    Examples
    --------
    >>> parse_rate("1Gbit"), parse_rate("shm")
    ('1gbit', None)
    """
    rate = str(text).strip().lower()
    if rate in NO_NETWORK:
        return None
    match = _RATE.match(rate)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"rate must be a tc rate such as 100mbit, 1gbit or 10gbit, "
                         f"or 'none'/'shm'; got {text!r}")
    return rate


def rate_bits_per_s(rate):
    """The link rate in bits per second (tc's units: ``k`` = 1000, ``ki`` = 1024).

    Examples
    --------
    >>> rate_bits_per_s("1gbit"), rate_bits_per_s("100mbps")
    (1000000000.0, 800000000.0)
    """
    number, unit = _RATE.match(parse_rate(rate)).groups()
    prefix = unit[:-3]
    return float(number) * _PREFIX[prefix] * (8 if unit.endswith("bps") else 1)


def _ip():
    path = shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip") if os.path.exists(p)), None)
    if path is None:
        raise ClusterUnavailable("the emulated cluster needs iproute2 ('ip' and 'tc'); "
                                 "install it, e.g. apt-get install iproute2")
    return path


def _has_capabilities():
    """Whether this process may create namespaces: it holds both capabilities that needs.

    Root normally does; root inside a container or under ``setpriv`` may not.
    """
    try:
        with open("/proc/self/status") as f:
            line = next(l for l in f if l.startswith("CapEff:"))
    except (OSError, StopIteration):
        return os.geteuid() == 0
    caps = int(line.split()[1], 16)
    return all(caps >> bit & 1 for bit in (_CAP_NET_ADMIN, _CAP_SYS_ADMIN))


def _check(args, what):
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        raise ClusterUnavailable(f"{what} failed: {' '.join(args)}: "
                                 f"{(result.stderr or result.stdout).strip()}")
    return result.stdout


def netns_list():
    """Names of the network namespaces that exist now (``ip netns list``)."""
    out = subprocess.run([_ip(), "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def netns_pids(name):
    """Ids of the processes inside network namespace ``name`` (none if it does not exist)."""
    out = subprocess.run([_ip(), "netns", "pids", name], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def _delete_namespace(name):
    # A process still inside keeps the namespace (and its links) alive after `ip netns del`.
    for pid in netns_pids(name):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run([_ip(), "netns", "del", name], capture_output=True)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def remove_stale():
    """Remove namespaces left by clusters whose process is gone (killed with SIGKILL, say).

    Only names of the form this module creates, ``ccl<pid>-<n>-h<rank>`` or
    ``ccl<pid>-<n>-sw``, whose ``<pid>`` no longer runs, are touched. Pids are
    looked up in this process's PID namespace: do not run it where another
    container shares ``/run/netns``.

    Returns
    -------
    list of str
        The namespaces removed.
    """
    stale = sorted(name for name in netns_list()
                   if (m := _NAME.match(name)) and not _pid_alive(int(m.group(1))))
    for name in stale:
        _delete_namespace(name)
    return stale


def unavailable_reason():
    """Why an emulated cluster cannot be built here, or None if it can.

    Builds and removes a one-namespace probe with a bridge, a veth pair and a
    tbf qdisc, so a kernel missing any of them is found before a real run.

    Returns
    -------
    str or None
    """
    try:
        ip = _ip()
        if not _has_capabilities():
            return "the emulated cluster needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN)"
        name = f"ccl{os.getpid()}-{next(_serial)}-sw"  # a name remove_stale() recognises
        _check([ip, "netns", "add", name], "creating a network namespace")
        try:
            for args in (["link", "add", "name", "br0", "type", "bridge"],
                         ["link", "add", "name", "veth0", "type", "veth", "peer", "name",
                          "veth1"]):
                _check([ip, "-n", name, *args], "creating a network device")
            _check([ip, "netns", "exec", name, "tc", "qdisc", "add", "dev", "veth0", "root",
                    "tbf", "rate", "1gbit", *TBF], "adding a tbf qdisc")
        finally:
            subprocess.run([ip, "netns", "del", name], capture_output=True)
    except ClusterUnavailable as exc:
        return str(exc)
    return None


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


class _SignalsBlocked:
    """Defer SIGINT/SIGTERM while the network is being torn down, so teardown completes."""

    _SIGNALS = {signal.SIGINT, signal.SIGTERM}

    def __enter__(self):
        self._old = signal.pthread_sigmask(signal.SIG_BLOCK, self._SIGNALS)

    def __exit__(self, *exc):
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old)


class EmulatedCluster:
    """``hosts`` network namespaces joined through a switch by links of rate ``rate``.

    Use it as a context manager: entering builds the network, leaving removes
    it, whatever happened in between.

    Parameters
    ----------
    hosts : int
        Number of hosts, 1 to 254; :meth:`run` starts one MPI rank on each.
    rate : str
        Link rate, a ``tc`` rate such as ``100mbit`` or ``1gbit``, applied on
        both ends of every link (each host sends *and* receives at most this
        fast); ``none`` or ``shm`` builds nothing and runs over shared memory.

    Attributes
    ----------
    prefix : str
        Start of every namespace name: ``ccl<pid>-<n>``, unique per process and
        per cluster, so parallel runs never collide.
    namespaces : list of str
        The hosts' namespace names, ``<prefix>-h<rank>`` (empty for ``none``).
    switch : str or None
        The switch namespace's name, ``<prefix>-sw``.

    Examples
    --------
    >>> with EmulatedCluster(2, "100mbit") as cluster:  # doctest: +SKIP
    ...     result = cluster.run(["python", "-m", "mpi4py", "train.py"])
    >>> result.returncode  # doctest: +SKIP
    0
    """

    def __init__(self, hosts, rate="1gbit"):
        hosts = int(hosts)
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"hosts must be 1 to {MAX_HOSTS}, got {hosts}")
        self.hosts = hosts
        self.rate = parse_rate(rate)
        self.prefix = f"ccl{os.getpid()}-{next(_serial)}"
        if self.rate is None:
            self.namespaces, self.switch = [], None
        else:
            self.namespaces = [f"{self.prefix}-h{i}" for i in range(hosts)]
            self.switch = f"{self.prefix}-sw"
        self._created = []  # namespaces that may exist, in creation order
        self._tmpdir = None
        self._wrapper = None

    @property
    def emulated(self):
        """Whether ranks talk over emulated links (False for ``none``/``shm``)."""
        return self.rate is not None

    def address(self, rank):
        """Host ``rank``'s IPv4 address inside its namespace."""
        return f"{SUBNET}.{rank + 1}"

    def __enter__(self):
        self.up()
        return self

    def __exit__(self, *exc):
        self.down()

    def up(self):
        """Build the network; on any failure remove what was built and raise.

        Raises
        ------
        ClusterUnavailable
            Without the privileges or tools the network needs.
        """
        if not self.emulated:
            return
        ip = _ip()
        if not _has_capabilities():
            raise ClusterUnavailable("the emulated cluster needs root (or CAP_NET_ADMIN and "
                                     "CAP_SYS_ADMIN) to create network namespaces; run it "
                                     "with sudo, or use --rate none for shared memory")
        try:
            self._add_switch(ip)
            for rank in range(self.hosts):
                self._add_host(ip, rank)
            self._write_wrapper(ip)
        except BaseException:
            self.down()
            raise

    def _add_namespace(self, ip, name):
        # Recorded before it exists: a signal between the two steps must not leak it.
        self._created.append(name)
        _check([ip, "netns", "add", name], f"creating network namespace {name}")

    def _add_switch(self, ip):
        self._add_namespace(ip, self.switch)
        _check([ip, "-n", self.switch, "link", "add", "name", "br0", "type", "bridge"],
               "creating the switch")
        _check([ip, "-n", self.switch, "link", "set", "br0", "up"], "creating the switch")

    def _add_host(self, ip, rank):
        host, port = self.namespaces[rank], f"p{rank}"
        self._add_namespace(ip, host)
        steps = [
            # created directly inside the namespaces, so no name is ever taken in the caller's
            [ip, "link", "add", "name", "eth0", "netns", host, "type", "veth",
             "peer", "name", port, "netns", self.switch],
            [ip, "-n", self.switch, "link", "set", port, "master", "br0"],
            [ip, "-n", self.switch, "link", "set", port, "mtu", str(MTU), "up"],
            [ip, "-n", host, "addr", "add", f"{self.address(rank)}/24", "dev", "eth0"],
            [ip, "-n", host, "link", "set", "eth0", "mtu", str(MTU), "up"],
            [ip, "-n", host, "link", "set", "lo", "up"],
            # tbf on the host side limits what it sends, on the switch side what it receives
            [ip, "netns", "exec", host, "tc", "qdisc", "add", "dev", "eth0", "root",
             "tbf", "rate", self.rate, *TBF],
            [ip, "netns", "exec", self.switch, "tc", "qdisc", "add", "dev", port, "root",
             "tbf", "rate", self.rate, *TBF],
        ]
        for args in steps:
            _check(args, f"setting up host {rank}")

    def _write_wrapper(self, ip):
        # hydra's fork launcher starts every rank here with PMI_RANK set; the PMI socket is
        # an inherited file descriptor, so it still works inside the namespace.
        self._tmpdir = tempfile.mkdtemp(prefix="ccl-cluster-")
        self._wrapper = os.path.join(self._tmpdir, "enter-host")
        with open(self._wrapper, "w") as f:
            f.write(f'#!/bin/sh\nexec {ip} netns exec "{self.prefix}-h${{PMI_RANK:?}}" "$@"\n')
        os.chmod(self._wrapper, 0o755)

    def down(self):
        """Remove every namespace this cluster created, killing what still runs inside.

        Idempotent; reports namespaces it could not remove on stderr instead of raising.
        """
        with _SignalsBlocked():
            if self._created:
                for name in reversed(self._created):
                    _delete_namespace(name)
                left = netns_list().intersection(self._created)
                if left:
                    print(f"ccl.bench.cluster: could not remove namespaces {sorted(left)}; "
                          f"remove them with: ip netns del NAME", file=sys.stderr)
                self._created = []
            if self._tmpdir is not None:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
                self._tmpdir = self._wrapper = None

    def tx_bytes(self, rank):
        """Bytes host ``rank`` has sent on its link so far (its ``eth0`` counter)."""
        out = _check([_ip(), "-n", self.namespaces[rank], "-j", "-s", "link", "show", "eth0"],
                     "reading link statistics")
        return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])

    def command(self, cmd):
        """The ``mpiexec`` command line that runs ``cmd`` with one rank per host."""
        launch = [_mpiexec(), "-launcher", "fork", "-n", str(self.hosts)]
        if self.emulated:
            if self._wrapper is None:
                raise RuntimeError("the cluster is not up; use it as a context manager")
            launch.append(self._wrapper)
        return launch + list(cmd)

    def environment(self, env=None):
        """The environment for :meth:`run`: ``env`` (default: this process's) plus MPICH's
        settings for TCP without shared memory when the network is emulated."""
        merged = dict(os.environ if env is None else env, HYDRA_LAUNCHER="fork")
        if self.emulated:
            merged.update(NETWORK_ENV)
        return merged

    def run(self, cmd, timeout=None, env=None, **kwargs):
        """Run ``cmd`` under ``mpiexec``, one rank per host, and wait for it.

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
                    "namespace per rank behind rate-limited links (bandwidth, not latency). "
                    "Needs root. Example: python -m ccl.bench.cluster --hosts 4 --rate 1gbit "
                    "-- python -m mpi4py -m ccl.bench --quick")
    parser.add_argument("--hosts", type=int, help="hosts, one MPI rank each")
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
    # SIGTERM becomes an exception, so the namespaces are removed as on Ctrl-C.
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    cluster = EmulatedCluster(args.hosts, args.rate)
    try:
        with cluster:
            where = (f"{args.hosts} hosts at {cluster.rate} (namespaces {cluster.prefix}-*)"
                     if cluster.emulated else f"{args.hosts} ranks over shared memory")
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
