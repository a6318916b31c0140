"""The emulated network: hosts as network namespaces behind rate-limited links.

Each host is a network namespace with one interface, ``eth0``
(``10.200.0.<host+1>/24``), joined by a veth pair to a bridge in a separate
"switch" namespace. A token-bucket filter (``tbf``) on *both* ends of every
veth limits each host's send and receive rate, as a full-duplex NIC on a
non-blocking switch would. Traffic between processes inside one namespace
never touches the veth: it stays on the loopback (or in shared memory).

This emulates **bandwidth, not latency**: there is no propagation delay
(netem is not used), only the serialisation time of the link rate.

Creating namespaces needs root (or ``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN``)
and iproute2. :class:`EmulatedNetwork` always removes what it built: when
leaving its ``with`` block, when setup fails halfway, and with SIGINT and
SIGTERM deferred while it does. :mod:`ccl.bench.cluster` runs MPI jobs on it.
"""

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys

__all__ = ["EmulatedNetwork", "ClusterUnavailable", "parse_rate", "rate_bits_per_s",
           "unavailable_reason", "netns_list", "netns_pids", "remove_stale", "ip_path"]

NO_NETWORK = ("none", "shm")
MAX_HOSTS = 254  # one /24 of host addresses
SUBNET = "10.200.0"  # private; only ever configured inside namespaces made here
MTU = 9000
# tbf needs a bucket larger than the MTU; these are the verified recipe's settings.
TBF = ("burst", "512kb", "latency", "20ms")

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


def ip_path():
    """The ``ip`` program of iproute2; raises :class:`ClusterUnavailable` without it."""
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
            line = next(row for row in f if row.startswith("CapEff:"))
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
    out = subprocess.run([ip_path(), "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def netns_pids(name):
    """Ids of the processes inside network namespace ``name`` (none if it does not exist)."""
    out = subprocess.run([ip_path(), "netns", "pids", name], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def _delete_namespace(name):
    # A process still inside keeps the namespace (and its links) alive after `ip netns del`.
    for pid in netns_pids(name):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run([ip_path(), "netns", "del", name], capture_output=True)


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
        ip = ip_path()
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


class _SignalsBlocked:
    """Defer SIGINT/SIGTERM while the network is being torn down, so teardown completes."""

    _SIGNALS = {signal.SIGINT, signal.SIGTERM}

    def __enter__(self):
        self._old = signal.pthread_sigmask(signal.SIG_BLOCK, self._SIGNALS)

    def __exit__(self, *exc):
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old)


class EmulatedNetwork:
    """``hosts`` network namespaces joined through a switch by links of rate ``rate``.

    Use it as a context manager: entering builds the network, leaving removes
    it, whatever happened in between.

    Parameters
    ----------
    hosts : int
        Number of hosts, 1 to 254.
    rate : str
        Link rate, a ``tc`` rate such as ``100mbit`` or ``1gbit``, applied on
        both ends of every link (each host sends *and* receives at most this
        fast); ``none`` or ``shm`` builds nothing.

    Attributes
    ----------
    prefix : str
        Start of every namespace name: ``ccl<pid>-<n>``, unique per process and
        per network, so parallel runs never collide.
    namespaces : list of str
        The hosts' namespace names, ``<prefix>-h<host>`` (empty for ``none``).
    switch : str or None
        The switch namespace's name, ``<prefix>-sw``.

    Examples
    --------
    >>> with EmulatedNetwork(2, "100mbit") as net:  # doctest: +SKIP
    ...     print(net.namespaces, net.address(1), net.tx_bytes(0))
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

    @property
    def emulated(self):
        """Whether there are emulated links (False for ``none``/``shm``)."""
        return self.rate is not None

    def address(self, host):
        """Host ``host``'s IPv4 address inside its namespace."""
        return f"{SUBNET}.{host + 1}"

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
        ip = ip_path()
        if not _has_capabilities():
            raise ClusterUnavailable("the emulated cluster needs root (or CAP_NET_ADMIN and "
                                     "CAP_SYS_ADMIN) to create network namespaces; run it "
                                     "with sudo, or use --rate none for shared memory")
        try:
            self._add_switch(ip)
            for host in range(self.hosts):
                self._add_host(ip, host)
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

    def _add_host(self, ip, host):
        name, port = self.namespaces[host], f"p{host}"
        self._add_namespace(ip, name)
        steps = [
            # created directly inside the namespaces, so no name is ever taken in the caller's
            [ip, "link", "add", "name", "eth0", "netns", name, "type", "veth",
             "peer", "name", port, "netns", self.switch],
            [ip, "-n", self.switch, "link", "set", port, "master", "br0"],
            [ip, "-n", self.switch, "link", "set", port, "mtu", str(MTU), "up"],
            [ip, "-n", name, "addr", "add", f"{self.address(host)}/24", "dev", "eth0"],
            [ip, "-n", name, "link", "set", "eth0", "mtu", str(MTU), "up"],
            [ip, "-n", name, "link", "set", "lo", "up"],
            # tbf on the host side limits what it sends, on the switch side what it receives
            [ip, "netns", "exec", name, "tc", "qdisc", "add", "dev", "eth0", "root",
             "tbf", "rate", self.rate, *TBF],
            [ip, "netns", "exec", self.switch, "tc", "qdisc", "add", "dev", port, "root",
             "tbf", "rate", self.rate, *TBF],
        ]
        for args in steps:
            _check(args, f"setting up host {host}")

    def down(self):
        """Remove every namespace this network created, killing what still runs inside.

        Idempotent; reports namespaces it could not remove on stderr instead of raising.
        """
        with _SignalsBlocked():
            if self._created:
                for name in reversed(self._created):
                    _delete_namespace(name)
                left = netns_list().intersection(self._created)
                if left:
                    print(f"ccl.bench.network: could not remove namespaces {sorted(left)}; "
                          f"remove them with: ip netns del NAME", file=sys.stderr)
                self._created = []

    def tx_bytes(self, host):
        """Bytes host ``host`` has sent on its link so far (its ``eth0`` counter)."""
        out = _check([ip_path(), "-n", self.namespaces[host], "-j", "-s", "link", "show",
                      "eth0"], "reading link statistics")
        return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])
