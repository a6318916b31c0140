"""The emulated cluster (``ccl.bench.cluster``): real namespaces, real MPI jobs, always removed.

Serial tests (not MPI-marked, skipped inside an MPI job): each starts its own
``mpiexec``. Those that build namespaces skip, with the reason, without root
or without the kernel features (veth, bridge, tbf) the network needs.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from ccl.bench.cluster import (ClusterUnavailable, EmulatedCluster, netns_list, netns_pids,
                               parse_rate, rate_bits_per_s, unavailable_reason)

HERE = os.path.dirname(__file__)
SCRIPT = os.path.join(HERE, "harness", "cluster_allreduce.py")
PLACEMENT = os.path.join(HERE, "harness", "cluster_placement.py")
N = 1 << 20  # float32 elements: 4 MB per rank, 2 MB of fp16 on the wire
EXCHANGE = 8 << 20  # bytes each rank sends in each phase of the placement script
JOB_TIMEOUT = 120
CLI = [sys.executable, "-m", "ccl.bench.cluster"]
IP = shutil.which("ip") or "ip"

# `--with-mpi --only-mpi` still runs unmarked tests (pytest-mpi lets --with-mpi win); these
# start their own jobs, which a rank of an outer job must not do N times at once.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def netns():
    """Skip unless this process can build the emulated network."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"emulated cluster unavailable: {reason}")


def _ours(prefix):
    return {name for name in netns_list() if name.startswith(prefix + "-")}


@pytest.fixture(scope="module")
def allreduce_run(netns):
    """One checked fp16 ring allreduce on 2 hosts at 100 Mbit/s, and what was seen around it."""
    with EmulatedCluster(2, "100mbit") as cluster:
        during = _ours(cluster.prefix)
        before = [cluster.tx_bytes(r) for r in range(2)]
        result = cluster.run([sys.executable, "-m", "mpi4py", SCRIPT, "2", str(N)],
                             timeout=JOB_TIMEOUT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        sent = [cluster.tx_bytes(r) - before[r] for r in range(2)]
    return dict(result=result, during=during, after=_ours(cluster.prefix), sent=sent,
                expected=set(cluster.namespaces) | {cluster.switch})


def test_allreduce_on_emulated_hosts_is_exact(allreduce_run):
    result = allreduce_run["result"]
    assert result.returncode == 0, result.stdout[-3000:]
    # the script checks comm.size == 2 and the exact sum on every rank before printing this
    for rank in range(2):
        assert f"rank {rank} of 2: exact" in result.stdout


def test_namespaces_exist_while_up_and_are_gone_after(allreduce_run):
    assert allreduce_run["during"] == allreduce_run["expected"]
    assert allreduce_run["after"] == set()


def test_traffic_crosses_the_emulated_links(allreduce_run):
    # A 2-rank fp16 ring sends 2 MB per rank. Over shared memory the veth counters would only
    # see connection set-up (kilobytes), so this proves every rank really used its link.
    for rank, sent in enumerate(allreduce_run["sent"]):
        assert sent >= N, f"host {rank} sent only {sent} bytes on its link"


def _placement(hosts, per_host, rate="1gbit"):
    """Run the placement script on ``hosts`` x ``per_host``; its rows by rank, and the cluster."""
    with EmulatedCluster(hosts, rate, ranks_per_host=per_host) as cluster:
        result = cluster.run([sys.executable, "-m", "mpi4py", PLACEMENT, str(per_host),
                              str(EXCHANGE)], timeout=JOB_TIMEOUT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    assert result.returncode == 0, result.stdout[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert sorted(row["rank"] for row in rows) == list(range(hosts * per_host)), result.stdout
    return {row["rank"]: row for row in rows}, cluster


@pytest.mark.parametrize("hosts, per_host", [(2, 2), (2, 3)])
def test_ranks_per_host_placement_and_links(netns, hosts, per_host):
    rows, cluster = _placement(hosts, per_host)
    for rank, row in rows.items():
        host = rank // per_host
        block = list(range(host * per_host, (host + 1) * per_host))
        # consecutive blocks: rank r lives in host r // per_host's namespace ...
        assert row["address"] == cluster.address(host), row
        assert [rows[r]["netns"] == row["netns"] for r in rows] == \
            [r // per_host == host for r in rows], row
        # ... and MPI (from the launcher's host list) and ccl (CCL_LOCAL_SIZE) see that node
        assert row["mpi_node"] == per_host, row
        assert row["ccl_node"] == block, row
    for host in range(hosts):
        row = rows[host * per_host]
        # inside a host the ranks moved per_host * EXCHANGE bytes without touching the link
        # (what it sent then is barrier and connection chatter) ...
        assert row["local_bytes"] < EXCHANGE // 8, row
        # ... while every rank's message to the other host crossed it
        assert row["cross_bytes"] >= per_host * EXCHANGE, row


def test_one_rank_per_host_is_its_own_node(netns):
    rows, cluster = _placement(3, 1)
    for rank, row in rows.items():
        assert row["address"] == cluster.address(rank)
        assert row["mpi_node"] == 1 and row["ccl_node"] == [rank]
        assert row["cross_bytes"] >= EXCHANGE, row
    assert len({row["netns"] for row in rows.values()}) == 3


def test_ranks_per_host_over_shared_memory_set_ccl_local_size():
    rows, cluster = _placement(2, 2, rate="shm")
    assert cluster.namespaces == []
    # one machine, one namespace: MPI sees one node, CCL_LOCAL_SIZE splits it in two
    assert len({row["netns"] for row in rows.values()}) == 1
    for rank, row in rows.items():
        assert row["mpi_node"] == 4
        assert row["ccl_node"] == [rank - rank % 2, rank - rank % 2 + 1]


def test_cluster_environment_and_command():
    one, two = EmulatedCluster(2, "1gbit"), EmulatedCluster(3, "1gbit", ranks_per_host=2)
    assert one.environment({})["MPIR_CVAR_NOLOCAL"] == "1"
    assert "CCL_LOCAL_SIZE" not in one.environment({})
    env = two.environment({"CCL_LOCAL_SIZE": "5"})
    assert env["CCL_LOCAL_SIZE"] == "2" and "MPIR_CVAR_NOLOCAL" not in env
    assert (two.ranks, two.host_of(3), two.host_of(4)) == (6, 1, 2)
    with pytest.raises(RuntimeError, match="not up"):
        two.command(["true"])
    shm = EmulatedCluster(3, "shm", ranks_per_host=2)
    command = shm.command(["true"])
    assert command[command.index("-n") + 1] == "6"


@pytest.mark.parametrize("per_host", [0, -1, 1.5, True])
def test_ranks_per_host_is_checked(per_host):
    with pytest.raises(ValueError, match="ranks_per_host"):
        EmulatedCluster(2, "1gbit", ranks_per_host=per_host)


def test_cli_rejects_bad_ranks_per_host():
    proc = subprocess.run(CLI + ["--hosts", "2", "--ranks-per-host", "0", "--", "true"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--ranks-per-host" in proc.stderr


def test_failing_command_status_is_forwarded_and_namespaces_removed(netns):
    proc = subprocess.Popen(CLI + ["--hosts", "2", "--rate", "100mbit", "--",
                                   sys.executable, "-c", "import sys; sys.exit(3)"],
                            stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=JOB_TIMEOUT)
    assert proc.returncode == 3, err[-3000:]
    prefix = f"ccl{proc.pid}-0"  # the CLI's first cluster, named after its pid
    assert f"namespaces {prefix}-*" in err
    assert _ours(prefix) == set()


def test_setup_failing_halfway_removes_what_was_built(netns, monkeypatch):
    add_host = EmulatedCluster._add_host

    def fail_on_host_1(self, ip, rank):
        add_host(self, ip, rank)
        if rank == 1:
            raise ClusterUnavailable("injected failure after host 1")

    monkeypatch.setattr(EmulatedCluster, "_add_host", fail_on_host_1)
    cluster = EmulatedCluster(3, "1gbit")
    with pytest.raises(ClusterUnavailable, match="injected"):
        with cluster:
            pytest.fail("the body ran although setup failed")
    assert _ours(cluster.prefix) == set()


def test_sigterm_ends_the_job_and_removes_namespaces(netns):
    proc = subprocess.Popen(CLI + ["--hosts", "2", "--rate", "1gbit", "--",
                                   sys.executable, "-c", "import time; time.sleep(120)"],
                            stderr=subprocess.PIPE, text=True)
    prefix = f"ccl{proc.pid}-0"
    try:
        deadline = time.monotonic() + 60
        # both ranks started inside their hosts: the namespaces hold processes
        while not all(netns_pids(f"{prefix}-h{r}") for r in range(2)):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert status == 128 + signal.SIGTERM, proc.stderr.read()
    assert _ours(prefix) == set()


def test_cleanup_removes_only_namespaces_of_dead_runs(netns):
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid runs nothing now
    stale, live = f"ccl{dead.pid}-0-h0", f"ccl{os.getpid()}-999-sw"
    try:
        for name in (stale, live):
            subprocess.run([IP, "netns", "add", name], check=True)
        proc = subprocess.run(CLI + ["--cleanup"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert stale in proc.stderr
        names = netns_list()
        assert stale not in names and live in names
    finally:
        for name in (stale, live):
            subprocess.run([IP, "netns", "del", name], capture_output=True)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) not found")
def test_without_capabilities_the_cli_explains_and_fails():
    # root minus the two capabilities is what a non-root user has, without needing one
    proc = subprocess.run(["setpriv", "--bounding-set=-net_admin,-sys_admin"] + CLI
                          + ["--hosts", "2", "--rate", "1gbit", "--", "true"],
                          capture_output=True, text=True, timeout=60)
    if "setpriv:" in proc.stderr:
        pytest.skip(f"setpriv cannot drop capabilities here: {proc.stderr.strip()}")
    assert proc.returncode == 2
    assert "needs root" in proc.stderr


def test_shm_runs_the_same_job_without_namespaces():
    cluster = EmulatedCluster(2, "shm")
    with cluster:
        result = cluster.run([sys.executable, "-m", "mpi4py", SCRIPT, "2", "1000"],
                             timeout=JOB_TIMEOUT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        assert cluster.namespaces == [] and cluster.switch is None
    assert result.returncode == 0, result.stdout[-3000:]
    assert "rank 1 of 2: exact" in result.stdout


@pytest.mark.parametrize("text, bits", [("100mbit", 1e8), ("1gbit", 1e9), ("10Gbit", 1e10),
                                        ("1.5mbit", 1.5e6), ("100mbps", 8e8),
                                        ("1kibit", 1024)])
def test_rates_in_tc_units(text, bits):
    assert parse_rate(text) == text.lower()
    assert rate_bits_per_s(text) == bits


@pytest.mark.parametrize("text", ["none", "shm", "SHM"])
def test_no_network_rates(text):
    assert parse_rate(text) is None


@pytest.mark.parametrize("text", ["fast", "1gb/s", "-1mbit", "0gbit", "1 gbit", "gbit", ""])
def test_bad_rates_are_rejected(text):
    with pytest.raises(ValueError, match="tc rate"):
        parse_rate(text)


@pytest.mark.parametrize("hosts", [0, 255])
def test_host_count_is_checked(hosts):
    with pytest.raises(ValueError, match="hosts must be"):
        EmulatedCluster(hosts, "1gbit")
