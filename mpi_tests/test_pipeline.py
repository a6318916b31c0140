"""Pipelined ring and direct (segments), and ``auto``'s cost model and link speed.

Segment sizes are given in payload bytes; with ``none`` (32 bits per value)
``segment_bytes=4 * m`` cuts every chunk into segments of ``m`` elements, so
the tests reach 1, 2, prime and one-element-per-segment counts on tiny data.
"""

import math

import numpy as np
import pytest
from mpi4py import MPI

import ccl
from ccl import config
from ccl.bench import allreduce as bench
from ccl.codecs import get_codec
from ccl.collectives import Call, auto
from ccl.collectives.base import SEGMENT_ID_STRIDE, chunk_bounds, segment_count
from ccl.testing import assert_same_on_all_ranks, exact_sum, rank_input

SEGMENT_BYTES = [0, 4, 12, 28, 4 * 1000]  # none: 1, 3 and 7 elements per segment, or off
SIZES = [0, 1, 2, 5, 97, 1009]


class _FakeChannel:
    rank, size = 0, 3


# ------------------------------------------------------------------ serial units
def test_segment_count_sizes_segments_by_their_payload():
    assert segment_count(1000, 4, 0) == 1 and segment_count(1000, 4, None) == 1
    assert segment_count(0, 4, 8) == 1
    assert segment_count(1000, 4, 1000) == 1  # 250 elements * 4 B fit one segment
    assert segment_count(1000, 4, 999) == 2
    assert segment_count(1001, 4, 4) == 251  # the longest chunk, one element each
    assert segment_count(1000, 4, 4, bits_per_value=1.0) == 8  # 250 bits = 32 B
    assert segment_count(10, 4, 1, bits_per_value=32.0) == 3  # never more than elements


@pytest.mark.parametrize("n, parts, segments", [(0, 3, 1), (1, 3, 2), (10, 3, 4),
                                                (97, 5, 7), (1009, 2, 3)])
def test_units_split_each_chunk_as_array_split(n, parts, segments):
    call = Call(_FakeChannel(), get_codec("none"), n, parts, 0, 0, None, None, chunk_base=6,
                segments=segments)
    x = np.arange(n)
    for j, chunk in enumerate(np.array_split(x, parts)):
        np.testing.assert_array_equal(call.chunk(x, j), chunk)
        pieces = [call.unit(x, u) for u in call.units(j)]
        assert len(pieces) == segments
        for piece, expected in zip(pieces, np.array_split(chunk, segments)):
            np.testing.assert_array_equal(piece, expected)
    ids = [call.unit_id(u) for u in range(parts * segments)]
    assert len(set(ids)) == len(ids), "every unit has its own lossy points and seeds"
    assert len({i & 0xFFFFFFFF for i in ids}) == len(ids), "seeds use the low 32 bits"
    # segment 0 keeps the chunk's id: an unsegmented call is unchanged
    assert [call.unit_id(u) for u in range(0, parts * segments, segments)] == \
        [6 + j for j in range(parts)]
    if segments > 1:  # chunk 1, segment 1
        assert call.unit_id(segments + 1) == 6 + 1 + SEGMENT_ID_STRIDE
    np.testing.assert_array_equal(call.chunk_starts, chunk_bounds(n, parts))


def test_cost_model_without_a_link_speed_never_compresses():
    for codec in ("3lc", "onebit", "fp16", "thc"):
        for nbytes in (1 << 16, 1 << 26):
            assert auto.choose(get_codec(codec), nbytes, 4, np.float32) == "mpi"
    # float16 has no MPI type: it still compresses, as before
    assert auto.choose(get_codec("fp16"), 1 << 26, 4, np.float16) == "ring"


@pytest.mark.parametrize("codec, gbps, expected", [
    ({"id": "3lc", "s": 1.5}, 0.1, "direct"), ({"id": "3lc", "s": 1.5}, 1, "direct"),
    ("onebit", 1, "direct"), ({"id": "sidco", "density": 0.01}, 0.1, "allgather"),
    ({"id": "thc", "bits": 4}, 0.1, "ring"), ("fp16", 0.1, "ring"), ("fp16", 1, "ring"),
    ({"id": "3lc", "s": 1.5}, 10, "direct"), ("fp16", 10, "mpi"),
    ({"id": "thc", "bits": 4}, 10, "mpi"), ({"id": "3lc", "s": 1.5}, 100, "mpi"),
    ("onebit", math.inf, "mpi"), ("none", 0.1, "mpi")])
def test_cost_model_compresses_where_the_link_is_slow(codec, gbps, expected):
    """64 MB per rank at 4 ranks: slow links pay for every codec, 10 Gbit/s for fast ones."""
    assert auto.choose(get_codec(codec), 64 << 20, 4, np.float32, link_gbps=gbps) == expected


def test_cost_model_counts_the_cores_a_rank_shares():
    codec = get_codec({"id": "3lc", "s": 1.5})
    alone = auto.estimate(codec, 64 << 20, 4, 10.0, cores=1.0)
    shared = auto.estimate(codec, 64 << 20, 4, 10.0, cores=0.25)
    assert shared[0] == alone[0] and shared[1] > 2 * alone[1]
    assert auto.choose(codec, 64 << 20, 4, np.float32, link_gbps=10.0, cores=0.25) == "mpi"


def test_cost_model_decisions_do_not_flip_back_as_the_size_grows():
    """Once compressing pays at a size it pays at every larger one.

    ccl's own work per call is fixed while the bytes grow with the size, so a
    small bucket may stay with ``MPI_Allreduce`` where a large one compresses,
    never the other way round.
    """
    for codec in ("3lc", "onebit", "fp16", {"id": "thc", "bits": 4}, "sidco"):
        for gbps in (0.1, 1, 3, 10, 30):
            picks = [auto.choose(get_codec(codec), s, 4, np.float32, link_gbps=gbps) != "mpi"
                     for s in (1 << 16, 1 << 20, 4_096_000, 1 << 26, 1 << 28)]
            assert picks == sorted(picks), (codec, gbps, picks)


def test_cost_model_is_monotonic_in_size_and_link_speed():
    codec = get_codec("onebit")
    sizes = [1 << k for k in range(16, 29)]
    for gbps in (0.1, 1, 10, 100):
        picks = [auto.choose(codec, s, 4, np.float32, link_gbps=gbps) != "mpi" for s in sizes]
        assert picks == sorted(picks), f"once compression pays it keeps paying ({gbps})"
    speeds = [0.01, 0.1, 1, 10, 100, 1000]
    picks = [auto.choose(codec, 1 << 24, 4, np.float32, link_gbps=g) != "mpi" for g in speeds]
    assert picks == sorted(picks, reverse=True)
    t_mpi, t_codec = auto.estimate(codec, 1 << 24, 4, 1.0)
    assert t_mpi == pytest.approx(2 * 3 / 4 * (1 << 24) / 125e6)
    assert 0 < t_codec < t_mpi


def test_latency_sends_small_messages_uncompressed():
    """Each step of messages costs the latency: small messages go to MPI, large ones compress."""
    codec = get_codec("3lc")
    without = auto.estimate(codec, 1 << 20, 4, 1.0)
    with_latency = auto.estimate(codec, 1 << 20, 4, 1.0, latency=0.004)
    assert with_latency[0] == without[0]
    assert with_latency[1] == pytest.approx(without[1] + auto.rounds("direct", 4) * 0.004)
    assert auto.choose(codec, 1 << 16, 4, np.float32, link_gbps=10.0, latency=0.004) == "mpi"
    assert auto.choose(codec, 1 << 26, 4, np.float32, link_gbps=1.0, latency=0.004) == "direct"
    sizes = [1 << k for k in range(16, 29)]
    picks = [auto.choose(codec, s, 4, np.float32, link_gbps=1.0, latency=0.004) != "mpi"
             for s in sizes]
    assert picks == sorted(picks) and not picks[0] and picks[-1]


@pytest.mark.mpi
def test_latency_probe_agrees_on_every_rank(comm):
    latency = auto.probe_latency(comm)
    assert comm.allgather(latency) == [latency] * comm.size
    assert latency >= 0 and (comm.size > 1 or latency == 0)


# ------------------------------------------------------------------ collectives
def _pair(comm, codec, algorithm, seg, collective="allreduce", n=1009, key=None):
    c = ccl.Communicator(comm, codec=codec, algorithm=algorithm, min_compress_bytes=0,
                         partition_bytes=None, segment_bytes=seg)
    x = rank_input(comm.rank, n)
    return getattr(c, collective)(x, key=key)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["ring", "direct"])
@pytest.mark.parametrize("codec", ["none", "fp16"])
def test_pipelined_equals_unpipelined_bitwise(comm, codec, algorithm):
    """Element-wise codecs sum every element in the same order, however it is cut."""
    for n in SIZES:
        for collective in ("allreduce", "reduce_scatter"):
            plain = _pair(comm, codec, algorithm, 0, collective, n)
            for seg in SEGMENT_BYTES[1:]:
                piped = _pair(comm, codec, algorithm, seg, collective, n)
                assert piped.dtype == plain.dtype and piped.shape == plain.shape
                np.testing.assert_array_equal(piped, plain, err_msg=f"n={n} seg={seg}")
            if collective == "allreduce":
                assert_same_on_all_ranks(comm, plain)
                np.testing.assert_allclose(plain, exact_sum(comm.size, n),
                                           atol=4e-3 * comm.size * 4)
            else:
                expected = np.array_split(exact_sum(comm.size, n), comm.size)[comm.rank]
                np.testing.assert_allclose(plain, expected, atol=4e-3 * comm.size * 4)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["ring", "direct"])
@pytest.mark.parametrize("codec", ["test-stepquant", {"id": "thc", "bits": 4}, "onebit",
                                   {"id": "3lc", "s": 1.5}])
def test_pipelined_lossy_codecs_agree_across_ranks(comm, codec, algorithm):
    for n in SIZES:
        for seg in (2, 7, 64):  # tiny payload segments: many segments per chunk
            y = _pair(comm, codec, algorithm, seg, n=n)
            assert y.shape == (n,) and np.isfinite(y).all()
            assert_same_on_all_ranks(comm, y)


@pytest.mark.mpi
@pytest.mark.parametrize("seg", [4, 12, 28])
@pytest.mark.parametrize("algorithm", ["ring", "direct"])
def test_error_feedback_conserves_mass_with_segments(comm, algorithm, seg):
    """delivered + residuals held == sum of inputs, every segment with its own residuals."""
    n, steps = 1003, 30
    c = ccl.Communicator(comm, codec="test-stepquant", algorithm=algorithm, min_compress_bytes=0,
                         segment_bytes=seg)
    delivered, put_in = np.zeros(n), np.zeros(n)
    for step in range(steps):
        delivered += c.allreduce(rank_input(comm.rank, n, step=step), key="w")
        put_in += exact_sum(comm.size, n, step=step)
    state = c.feedback.get("w")
    held = comm.allreduce(state.held(n), op=MPI.SUM)
    np.testing.assert_allclose(delivered + held, put_in, atol=1e-3)
    if comm.size > 1:
        assert np.abs(held).max() > 1e-3
        # more lossy points than chunks: the segments really have their own
        assert len(state.residuals) > comm.size


@pytest.mark.mpi
def test_changing_segments_flushes_residuals_without_losing_mass(comm):
    n = 517
    c = ccl.Communicator(comm, codec="test-stepquant", algorithm="direct", min_compress_bytes=0)
    delivered, put_in = np.zeros(n), np.zeros(n)
    for step, seg in enumerate([0, 4, 28, 0, 12] * 3):
        c.segment_bytes = seg
        delivered += c.allreduce(rank_input(comm.rank, n, step=step), key="k")
        put_in += exact_sum(comm.size, n, step=step)
    held = comm.allreduce(c.feedback.get("k").held(n), op=MPI.SUM)
    np.testing.assert_allclose(delivered + held, put_in, atol=1e-3)


@pytest.mark.mpi
def test_nonfinite_segment_keeps_its_residual(comm):
    n = 64
    c = ccl.Communicator(comm, codec="test-stepquant", algorithm="ring", min_compress_bytes=0,
                         segment_bytes=8)  # test-stepquant's `levels` reads as 8 bits/value:
    # 8 elements per segment
    c.allreduce(rank_input(comm.rank, n, step=1), key="k")
    before = c.feedback.get("k").held(n)
    x = rank_input(comm.rank, n)
    if comm.rank == comm.size - 1:
        x[3] = np.nan
    y = c.allreduce(x, key="k")
    assert_same_on_all_ranks(comm, y)
    assert np.isnan(y[3]) and np.isnan(y).sum() <= 8  # only its segment is lost
    after = c.feedback.get("k").held(n)
    assert np.isfinite(after).all()
    assert np.array_equal(before[np.isnan(y)], after[np.isnan(y)])


@pytest.mark.mpi
def test_auto_decides_alike_on_every_rank_from_the_link_speed(comm, monkeypatch):
    x = rank_input(comm.rank, 1 << 18)  # 1 MB per rank
    reference = np.empty_like(x)
    comm.Allreduce(x, reference)
    monkeypatch.setenv("CCL_LINK_GBPS", "1000")
    # a link faster than the codec: MPI_Allreduce itself, exactly
    np.testing.assert_array_equal(ccl.compressed_allreduce(x, "onebit", comm=comm), reference)
    monkeypatch.setenv("CCL_LINK_GBPS", "0.1")
    y = ccl.compressed_allreduce(x, "onebit", comm=comm)
    assert_same_on_all_ranks(comm, y)
    if comm.size > 1:  # compressed: one bit per value cannot be exact
        assert not np.array_equal(y, reference)
    picks = comm.allgather(auto.choose(get_codec("onebit"), x.nbytes, comm.size, x.dtype,
                                       link_gbps=config.read("CCL_LINK_GBPS")))
    assert picks == [picks[0]] * comm.size
    assert picks[0] == ("mpi" if comm.size == 1 else "direct")


@pytest.mark.mpi(min_size=2)
def test_link_speed_must_agree(comm):
    c = ccl.Communicator(comm, codec="onebit", link_gbps=1.0 if comm.rank else 10.0)
    with pytest.raises(ccl.MismatchError):
        c.allreduce(np.ones(1 << 16, np.float32))
    c = ccl.Communicator(comm, codec="onebit", segment_bytes=1024 if comm.rank else 0)
    with pytest.raises(ccl.MismatchError):
        c.allreduce(np.ones(100, np.float32), algorithm="ring")


@pytest.mark.mpi
def test_probe_agrees_on_every_rank(comm):
    c = ccl.Communicator(comm, codec="onebit", link_gbps="probe")
    # measured in the first call that needs it (512 KB per rank), collectively
    c.allreduce(rank_input(comm.rank, 1 << 17))
    speeds = comm.allgather(c.stats()["link_gbps"])
    assert speeds == [speeds[0]] * comm.size
    # one rank: nothing to measure; one node: shared memory (inf), not timed
    assert speeds[0] is None if comm.size == 1 else speeds[0] > 0
    with pytest.raises(ValueError, match="link_gbps"):
        ccl.Communicator(comm, codec="onebit", link_gbps="fast")
    with pytest.raises(ValueError, match="segment_bytes"):
        ccl.Communicator(comm, codec="onebit", segment_bytes=-1)


# ------------------------------------------------------------------ bench CLI
def test_steady_input_carries_the_error_feedback_residual():
    steps = [np.random.default_rng(s).laplace(size=500).astype(np.float32) for s in range(4)]
    codec = get_codec("onebit")
    residual = np.zeros(500, np.float32)
    for g in steps[:-1]:
        p = g + residual
        residual = p - codec.decode(codec.encode(p))
    np.testing.assert_allclose(bench.steady_input(codec, steps), steps[-1] + residual)
    assert bench.steady_input(get_codec("none"), steps) is not steps[-1]
    np.testing.assert_array_equal(bench.steady_input(get_codec("none"), steps), steps[-1])
    refused = get_codec({"id": "dithering", "norm": "l2"})  # refuses error feedback
    assert bench.steady_input(refused, steps) is steps[-1]


@pytest.mark.mpi
def test_bench_on_gradients_feeds_each_codec_its_steady_input(comm):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    codecs = [get_codec({"id": "3lc", "s": 1.5}), get_codec("fp16")]
    rows = bench.run(comm, codecs, ["direct"], [1 << 16], reps=1, warmup=0,
                     codec_bound=False, data="gradients")
    assert [r["codec"] for r in rows] == ["MPI_Allreduce", "3lc", "fp16"]
    assert all(r.get("data", "gradients") == "gradients" for r in rows)
    # fp16 rounds each value: its error on the steady input stays at fp16's precision
    assert rows[2]["rel_error"] < 1e-3 and np.isfinite(rows[1]["rel_error"])
    if comm.size > 1:
        assert 0 < rows[1]["sent_bytes"] < rows[2]["sent_bytes"]


@pytest.mark.mpi
def test_bench_rows_have_ratio_bounds_and_pipelined_rows(comm):
    codec = get_codec({"id": "3lc", "s": 1.5})
    rows = bench.run(comm, [codec, get_codec("fp16")], ["fit", "auto"], [1 << 16], reps=1,
                     warmup=0, segments=[0, 1024], link_gbps=1.0, paired=True)
    same = [{k: v for k, v in r.items() if k != "load"} for r in rows]
    assert same == comm.bcast(same)
    mpi, rest = rows[0], rows[1:]
    assert mpi["codec"] == "MPI_Allreduce" and mpi["ratio"] == 1.0 and mpi["codec_s"] is None
    # fit: unpipelined and pipelined rows for ring/direct; auto once
    labels = [(r["codec"], bench.algorithm_label(r)) for r in rest]
    assert labels[:2] == [("3lc", "direct /unpipelined"), ("3lc", "direct /seg 1.0KB")]
    assert labels[3:5] == [("fp16", "ring /unpipelined"), ("fp16", "ring /seg 1.0KB")]
    assert labels[2][1].startswith("auto→") and labels[5][1].startswith("auto→")
    for r in rows:
        assert r["time_s"] > 0 and r["speedup"] > 0 and r["sent_bytes"] >= 0
        assert r["wire_s"] == pytest.approx(r["sent_bytes"] / 125e6)
        # paired: each row against MPI_Allreduce timed in alternation with it
        assert r["mpi_time_s"] > 0 and r["speedup"] == pytest.approx(r["mpi_time_s"] /
                                                                     r["time_s"])
        if r["resolved"] != "mpi":
            assert r["codec_s"] > 0
            assert r["bound"] == pytest.approx(r["time_s"] / max(r["wire_s"], r["codec_s"]))
            if comm.size > 1:
                assert r["ratio"] == pytest.approx(mpi["sent_bytes"] / r["sent_bytes"])
    if comm.size > 1:
        assert rest[0]["ratio"] > 10  # 3lc: far fewer bytes on the wire
        assert 1.5 < rest[3]["ratio"] <= 2.0  # fp16: half, plus headers
    table = bench.format_table(rows)
    for column in ("ratio", "wire ms", "codec ms", "bound", "/unpipelined"):
        assert column in table


@pytest.mark.mpi
def test_bench_main_prints_progress_and_writes_json(comm, tmp_path, capsys):
    # main runs on COMM_WORLD (every rank of the job); rank 0 writes the file
    path = comm.bcast(str(tmp_path / "rows.json"))
    assert bench.main(["--codecs", "onebit", "--algorithms", "direct", "--sizes", "4KB",
                       "--reps", "1", "--warmup", "0", "--segment-bytes", "0", "64",
                       "--link-gbps", "0.1", "--json", path]) == 0
    out = capsys.readouterr().out
    if MPI.COMM_WORLD.rank == 0:
        assert "[1/2]" in out and "[2/2]" in out and "left)" in out
        assert "link 0.1 Gbit/s" in out and "load average" in out
    if MPI.COMM_WORLD.rank == 0:
        import json
        with open(path) as f:
            rows = json.load(f)
        assert [bench.algorithm_label(r) for r in rows] == \
            ["mpi", "direct /unpipelined", "direct /seg 64B"]


@pytest.mark.mpi
def test_probe_from_the_environment_runs_after_the_agreement(comm, monkeypatch):
    from ccl.transport import channel

    x = rank_input(comm.rank, 1 << 17)  # 512 KB per rank: auto needs the link speed
    monkeypatch.setenv("CCL_LOCAL_SIZE", "1")  # a node per rank: one node is never timed
    monkeypatch.setenv("CCL_LINK_GBPS", "probe")
    y = ccl.compressed_allreduce(x, "onebit", comm=comm)
    assert_same_on_all_ranks(comm, y)
    link = channel(comm).measured.link()
    speeds = comm.allgather(None if link is None else link[0])
    assert speeds == [speeds[0]] * comm.size
    assert speeds[0] is None if comm.size == 1 else speeds[0] > 0  # one rank: no network
    # some ranks probe, others were given a speed: every rank raises, none waits in a probe
    if comm.size > 1:
        monkeypatch.setenv("CCL_LINK_GBPS", "probe" if comm.rank == 0 else "1")
        with pytest.raises(ccl.MismatchError):
            ccl.compressed_allreduce(x, "onebit", comm=comm)
        # a bad setting on one rank: its ValueError there, MismatchError elsewhere
        monkeypatch.setenv("CCL_LINK_GBPS", "fast" if comm.rank == 0 else "1")
        with pytest.raises(ValueError if comm.rank == 0 else ccl.MismatchError):
            ccl.compressed_allreduce(x, "onebit", comm=comm)
    monkeypatch.setenv("CCL_LINK_GBPS", "1")
    assert_same_on_all_ranks(comm, ccl.compressed_allreduce(x, "onebit", comm=comm))


@pytest.mark.mpi(min_size=2)
def test_auto_measures_the_link_once_when_nobody_gives_it(comm, monkeypatch):
    from ccl.transport import channel

    monkeypatch.delenv("CCL_LINK_GBPS", raising=False)
    monkeypatch.delenv("CCL_LINK_PROFILE", raising=False)
    monkeypatch.setenv("CCL_LOCAL_SIZE", "1")  # ranks on several nodes: one node times nothing
    fresh = comm.Dup()
    try:
        small = rank_input(comm.rank, 1000)  # latency-bound: no measurement needed
        ccl.compressed_allreduce(small, "onebit", comm=fresh)
        assert channel(fresh).measured.link() is None
        x = rank_input(comm.rank, 1 << 17)
        assert_same_on_all_ranks(comm, ccl.compressed_allreduce(x, "onebit", comm=fresh))
        speed, _ = channel(fresh).measured.link()
        assert comm.allgather(speed) == [speed] * comm.size and 0 < speed < math.inf
        ccl.compressed_allreduce(x, "onebit", comm=fresh)
        assert channel(fresh).measured.link()[0] == speed  # measured once per communicator
    finally:
        fresh.Free()
