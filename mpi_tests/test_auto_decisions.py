"""``auto``'s decisions: reproducible on one node, measured robustly across nodes, explained.

On one node nothing is timed: a probe that says something else each time
(monkeypatched) must not change a single decision. Across nodes
(``CCL_LOCAL_SIZE=1`` makes every rank a node of its own) the link is
measured once per communicator, agreed, and can be saved to and read from
``CCL_LINK_PROFILE``. ``stats()`` says which algorithm each call ran and why.
"""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

import ccl
from ccl import threads
from ccl.codecs import get_codec
from ccl.collectives import auto, link, model
from ccl.launch import node_comm
from ccl.testing import assert_same_on_all_ranks, rank_input

CODECS = ["fp16", "3lc", "onebit", {"id": "thc", "bits": 4}, "sidco"]


# ------------------------------------------------------------------ the rule, serially
@pytest.mark.parametrize("codec", CODECS)
def test_shared_memory_sends_floats_exactly_at_every_size(codec):
    codec = get_codec(codec)
    for nbytes in (1 << 16, 1 << 20, 1 << 26, 1 << 30):
        for dtype in (np.float32, np.float64):
            assert auto.decide(codec, nbytes, 4, dtype, link_gbps=math.inf)[:2] == \
                ("mpi", "shared memory")
    # MPI cannot reduce float16: compressed all the same
    assert auto.decide(codec, 1 << 26, 4, np.float16, link_gbps=math.inf)[:2] == \
        (auto.fitting(codec), "dtype")


def test_every_decision_has_a_documented_reason():
    cases = [
        (("3lc", 1 << 26, 4, np.float32, "reduce_scatter", 1.0), ("direct", "reduce_scatter")),
        (("thc", 1 << 26, 4, np.float32, "reduce_scatter", 1.0), ("direct", "reduce_scatter")),
        (("3lc", 1 << 26, 1, np.float32, "allreduce", 1.0), ("mpi", "one rank")),
        (("none", 1 << 26, 4, np.float32, "allreduce", 1.0), ("mpi", "no codec")),
        (("3lc", 1024, 4, np.float32, "allreduce", 1.0), ("mpi", "small")),
        (("3lc", 1 << 26, 4, np.float32, "allreduce", None), ("mpi", "no link speed")),
        (("3lc", 1 << 26, 4, np.float32, "allreduce", 1000.0), ("mpi", "model: MPI")),
        (("3lc", 1 << 26, 4, np.float32, "allreduce", 1.0), ("direct", "model: compress")),
    ]
    for (codec, nbytes, size, dtype, collective, gbps), expected in cases:
        decision = auto.decide(get_codec(codec), nbytes, size, dtype, collective, gbps)
        assert decision[:2] == expected and decision.reason in auto.REASONS
        assert auto.choose(get_codec(codec), nbytes, size, dtype, collective, gbps) == \
            expected[0]
        # the model's estimate comes with its decisions
        assert (decision.estimate is not None) == decision.reason.startswith("model")


def test_other_work_on_the_cores_slows_the_codec_in_the_model():
    """Four ranks on two cores, two busy processes beside them: a third of a core each."""
    codec = get_codec({"id": "thc", "bits": 4})
    alone, loaded = 2 / 4, 2 / (4 + 2)
    t_alone = auto.estimate(codec, 64 << 20, 4, 1.0, cores=alone)[1]
    assert auto.estimate(codec, 64 << 20, 4, 1.0, cores=loaded)[1] > t_alone


def test_measured_codec_speeds_replace_the_stated_ones():
    codec = get_codec("sidco")
    stated = auto.estimate(codec, 64 << 20, 4, 1.0, cores=0.5)
    # measured speeds already hold the share of cores: it is not applied again
    measured = auto.estimate(codec, 64 << 20, 4, 1.0, cores=0.5,
                             speeds=(codec.encode_gbps, codec.decode_gbps))
    assert measured[0] == stated[0] and measured[1] < stated[1]
    slow = (codec.encode_gbps / 100, codec.decode_gbps / 100)
    assert auto.decide(codec, 64 << 20, 4, np.float32, link_gbps=1.0)[:2] == \
        ("allgather", "model: compress")
    assert auto.decide(codec, 64 << 20, 4, np.float32, link_gbps=1.0, speeds=slow)[:2] == \
        ("mpi", "model: MPI")


def test_a_spread_out_probe_asks_compression_to_win_by_as_much():
    codec = get_codec("fp16")  # wins by about 1.9x at 1 Gbit/s on a free core
    t_mpi, t_codec = auto.estimate(codec, 64 << 20, 4, 1.0)
    assert 1.5 < t_mpi / t_codec < 2
    assert auto.choose(codec, 64 << 20, 4, np.float32, link_gbps=1.0) == "ring"
    assert auto.decide(codec, 64 << 20, 4, np.float32, link_gbps=1.0, spread=1.5)[:2] == \
        ("ring", "model: compress")
    assert auto.decide(codec, 64 << 20, 4, np.float32, link_gbps=1.0, spread=2.0)[:2] == \
        ("mpi", "model: MPI")


def test_codec_and_transfers_overlap_also_with_less_than_a_core_per_rank(monkeypatch):
    # measured on 4 emulated hosts on 2 cores (docs/benchmarks.md, "What the model learned")
    codec = get_codec({"id": "thc", "bits": 4})
    speeds = (codec.encode_gbps, codec.decode_gbps)

    def compressed(**kwargs):
        return auto.estimate(codec, 64 << 20, 4, 1.0, **kwargs)[1]

    # ccl's own work per payload runs at the rank's share of the cores...
    assert compressed(cores=0.5, speeds=speeds) > compressed(cores=1.0, speeds=speeds)
    # ...while measured codec speeds already did: without that work the share does not count
    monkeypatch.setattr(model, "CALL_SECONDS", 0.0)
    monkeypatch.setattr(model, "PAYLOAD_SECONDS", 0.0)
    whole = compressed(cores=1.0, speeds=speeds)
    shared = compressed(cores=0.5, speeds=speeds)
    unpipelined = compressed(pipelined=False, speeds=speeds)
    assert shared == pytest.approx(whole) and whole < unpipelined
    # without measured speeds the codec runs at half its one-core speed, still overlapped
    slower = auto.estimate(codec, 64 << 20, 4, 1.0, cores=0.5)[1]
    assert whole < slower < auto.estimate(codec, 64 << 20, 4, 1.0, cores=0.5,
                                          pipelined=False)[1]


def test_busy_cores_sees_a_busy_process():
    assert 0.0 <= threads.busy_cores(0.05) <= threads.available_cores()
    spin = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
    try:
        busy = threads.busy_cores(0.5)
    finally:
        spin.kill()
        spin.wait()
    # the spinning process keeps about one core busy (more with other work on the machine)
    assert 0.5 <= busy <= threads.available_cores()


def test_profile_files_are_checked(tmp_path):
    path = str(tmp_path / "link.json")
    assert link.read_profile(path, 4, [1, 1, 1, 1]) is None  # absent: measure
    link.write_profile(path, 0.93, 1e-4, 4, [1, 1, 1, 1])
    assert link.read_profile(path, 4, [1, 1, 1, 1]) == (0.93, 1e-4, 1.0)
    link.write_profile(path, 0.93, 1e-4, 4, [1, 1, 1, 1], spread=1.5)
    assert link.read_profile(path, 4, [1, 1, 1, 1]) == (0.93, 1e-4, 1.5)
    assert link.read_profile(path, 4, [2, 2]) is None  # another layout: measure again
    with open(path, "w") as f:
        f.write('{"link_gbps": "fast"}')
    with pytest.raises(ValueError, match="CCL_LINK_PROFILE"):
        link.read_profile(path, 4, [1, 1, 1, 1])


# ------------------------------------------------------------------ one node: no timing
def _one_node(comm):
    local = node_comm(comm)
    try:
        return local.Get_size() == comm.size
    finally:
        local.Free()


@pytest.mark.mpi
def test_one_node_decides_alike_whatever_a_probe_would_say(comm, monkeypatch):
    """The probe says 0.05 Gbit/s once and 500 the next time: no decision changes."""
    monkeypatch.delenv("CCL_LINK_GBPS", raising=False)
    monkeypatch.delenv("CCL_LOCAL_SIZE", raising=False)
    if not _one_node(comm):
        pytest.skip("the ranks are on several nodes")
    speeds = iter([0.05, 500.0, 0.05, 500.0])
    monkeypatch.setattr(auto, "probe_link",
                        lambda comm, rounds=None, wait=None: (next(speeds), 1.0))
    monkeypatch.setattr(auto, "probe_latency", lambda comm, wait=None: 0.0)
    x = rank_input(comm.rank, 1 << 20)  # 4 MB per rank: compressed at a slow link
    reference = np.empty_like(x)
    comm.Allreduce(x, reference)
    runs = []
    for _ in range(4):  # four communicators: four chances for the probe to differ
        fresh = comm.Dup()
        try:
            c = ccl.Communicator(fresh, codec="onebit")
            y = c.allreduce(x)
            stats = c.stats()
            runs.append((stats["decisions"], (stats["auto"] or {}).get("link_source")))
        finally:
            fresh.Free()
        if comm.size > 1:  # exact: MPI_Allreduce itself
            np.testing.assert_array_equal(y, reference)
    expected = ({"mpi": {"shared memory": 1}}, "one node") if comm.size > 1 else \
        ({"mpi": {"one rank": 1}}, None)
    if comm.size > 1:
        assert runs == [expected] * 4
    assert comm.allgather(runs) == [runs] * comm.size


@pytest.mark.mpi
def test_one_node_times_nothing(comm, monkeypatch):
    monkeypatch.delenv("CCL_LINK_GBPS", raising=False)
    monkeypatch.delenv("CCL_LOCAL_SIZE", raising=False)
    if not _one_node(comm):
        pytest.skip("the ranks are on several nodes")

    def timed(*args, **kwargs):
        raise AssertionError("timed on one node")

    for name in ("probe_link", "probe_link_gbps", "probe_latency"):
        monkeypatch.setattr(auto, name, timed)
    monkeypatch.setattr(threads, "busy_cores", timed)
    c = ccl.Communicator(comm, codec="3lc")
    for codec in CODECS:
        x = rank_input(comm.rank, 1 << 20)
        y = c.allreduce(x, codec=codec)
        assert_same_on_all_ranks(comm, y)
    decisions = c.stats()["decisions"]
    assert decisions == {"mpi": {"one rank" if comm.size == 1 else "shared memory": 5}}


# ------------------------------------------------------------------ several nodes
@pytest.mark.mpi(min_size=2)
def test_across_nodes_the_link_is_measured_once_and_agreed(comm, monkeypatch):
    monkeypatch.delenv("CCL_LINK_GBPS", raising=False)
    monkeypatch.delenv("CCL_LINK_PROFILE", raising=False)
    monkeypatch.setenv("CCL_LOCAL_SIZE", "1")  # every rank a node of its own
    calls = []
    probe = auto.probe_link
    monkeypatch.setattr(auto, "probe_link",
                        lambda comm, wait=None: calls.append(1) or probe(comm, wait=wait))
    c = ccl.Communicator(comm, codec="onebit")
    x = rank_input(comm.rank, 1 << 18)
    for _ in range(3):
        assert_same_on_all_ranks(comm, c.allreduce(x))
    stats = c.stats()
    assert len(calls) == 1  # once per communicator
    found = stats["auto"]
    assert found["link_source"] == "measured" and found["nodes"] == [1] * comm.size
    assert 0 < found["link_gbps"] < math.inf and found["latency_s"] >= 0
    assert 0 < found["share"] <= 1 and found["other_cores"] >= 0
    assert found["ranks_on_machine"] >= 1 and found["cores"] >= 1
    assert found["share"] <= min(1.0, found["cores"] / found["ranks_on_machine"])
    (speeds,) = found["codec_gbps"].values()
    assert list(found["codec_gbps"])[0].startswith("onebit ") and min(speeds) > 0
    # every rank decided from the same figures, and so alike
    agreed = {k: found[k] for k in ("link_gbps", "latency_s", "share", "other_cores")}
    assert comm.allgather(agreed) == [agreed] * comm.size
    assert comm.allgather(stats["decisions"]) == [stats["decisions"]] * comm.size
    (algorithm, reasons), = stats["decisions"].items()
    assert list(reasons) in (["model: MPI"], ["model: compress"]) and sum(
        reasons.values()) == 3


@pytest.mark.mpi
def test_codec_speeds_are_measured_once_agreed_and_leave_the_codec_alone(comm):
    from ccl.transport import channel

    codec = get_codec({"id": "sidco", "density": 0.01})
    config = codec.get_config()
    speeds = link.codec_speeds(channel(comm), codec)
    assert comm.allgather(speeds) == [speeds] * comm.size
    assert all(isinstance(v, float) and 0 < v < math.inf for v in speeds)
    assert link.codec_speeds(channel(comm), get_codec(config)) is speeds  # cached
    assert codec.get_config() == config


@pytest.mark.mpi(min_size=2)
def test_a_saved_link_profile_is_reused(comm, monkeypatch, tmp_path):
    monkeypatch.delenv("CCL_LINK_GBPS", raising=False)
    monkeypatch.setenv("CCL_LOCAL_SIZE", "1")
    path = comm.bcast(str(tmp_path / "link.json"))
    monkeypatch.setenv("CCL_LINK_PROFILE", path)
    x = rank_input(comm.rank, 1 << 18)

    def run():
        fresh = comm.Dup()
        try:
            c = ccl.Communicator(fresh, codec="onebit")
            assert_same_on_all_ranks(comm, c.allreduce(x))
            return c.stats()
        finally:
            fresh.Free()

    first = run()["auto"]
    assert first["link_source"] == "measured"
    comm.Barrier()  # rank 0 wrote the file
    if comm.rank == 0:
        with open(path) as f:
            saved = json.load(f)
        assert saved == {"link_gbps": first["link_gbps"], "latency_s": first["latency_s"],
                         "ranks": comm.size, "node_sizes": [1] * comm.size,
                         "spread": first["spread"]}
        saved["link_gbps"], saved["spread"] = 0.01, 1.0  # a slow link: every codec pays
        with open(path, "w") as f:
            json.dump(saved, f)
    comm.Barrier()
    second = run()
    assert second["auto"]["link_source"] == "saved" and second["auto"]["link_gbps"] == 0.01
    assert second["decisions"] == {"direct": {"model: compress": 1}}
    # a bad file on rank 0: ValueError on every rank, nobody waits
    if comm.rank == 0:
        with open(path, "w") as f:
            f.write("not json")
    comm.Barrier()
    with pytest.raises(ValueError, match="CCL_LINK_PROFILE"):
        run()


@pytest.mark.mpi
def test_stats_say_what_ran_and_why(comm, monkeypatch):
    monkeypatch.setenv("CCL_LINK_GBPS", "0.1")
    c = ccl.Communicator(comm, codec="onebit")
    c.allreduce(rank_input(comm.rank, 1 << 18))
    c.allreduce(rank_input(comm.rank, 100))
    c.allreduce(rank_input(comm.rank, 100), algorithm="ring")
    stats = c.stats()
    assert stats["calls"] == 3 and sum(stats["algorithms"].values()) == 3
    if comm.size == 1:
        assert stats["decisions"] == {"mpi": {"one rank": 2}, "ring": {"given": 1}}
        return
    assert stats["decisions"] == {"direct": {"model: compress": 1}, "mpi": {"small": 1},
                                  "ring": {"given": 1}}
    assert stats["algorithms"] == {"direct": 1, "mpi": 1, "ring": 1}
    found = stats["auto"]
    assert found["link_gbps"] == stats["link_gbps"] == 0.1 and found["link_source"] == "given"
    assert found["latency_s"] >= 0 and 0 < found["share"] <= 1


@pytest.mark.mpi
def test_optimizers_say_what_ran_and_why(comm):
    torch = pytest.importorskip("torch")
    import ccl.torch as ct

    ct.init(comm)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.Linear(512, 4))
        opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      named_parameters=model.named_parameters(), codec="3lc")
        adam = ct.CompressedAdam(torch.nn.Linear(200, 200).parameters(), warmup_steps=1,
                                 codec="onebit")
        for optimizer, net in ((opt, model), (adam, None)):
            for _ in range(2):
                optimizer.zero_grad()
                params = net.parameters() if net is not None else [
                    p for group in optimizer.param_groups for p in group["params"]]
                sum((p * (comm.rank + 1)).sum() for p in params).backward()
                optimizer.step()
            stats = optimizer.communication_stats()
            calls = sum(sum(reasons.values()) for reasons in stats["decisions"].values())
            assert calls == sum(stats["algorithms"].values()) == stats["reductions"] > 0
            for reasons in stats["decisions"].values():
                assert set(reasons) <= set(auto.REASONS) | {"given"}, reasons
            if comm.size > 1:  # one node: the large buckets ran MPI_Allreduce, exact
                assert "shared memory" in stats["decisions"].get("mpi", {})
                assert stats["auto"]["link_source"] == "one node"
    finally:
        ct.shutdown()
