"""The cost model (ccl.collectives.model): its terms, auto's picks from it, and its bytes and
errors against real runs at the launched rank count (make test also runs this file at 8 ranks
on shared memory: auto's picks past four ranks, alike on every rank)."""

import json

import numpy as np
import pytest
from mpi4py import MPI

import ccl
from ccl.codecs import get_codec
from ccl.collectives import auto, figures, model
from ccl.testing import exact_sum, rank_input

CODECS = ["fp16", "3lc", "onebit", {"id": "thc", "bits": 4}, "sidco", "dithering", "topk"]


def _figures(codec):
    return figures.codec_figures(get_codec(codec), calibration={})


# ------------------------------------------------------------------ the model's terms
def test_error_grows_with_relays_and_stays_flat_without():
    fig = _figures("dithering")  # decodes and re-encodes every partial sum
    assert not fig.exact_sum
    ranks = [2, 4, 16, 64, 1024]

    def errors(algorithm, homomorphic=False):
        return [model.combined_error(fig.error, model.lossy_weight(algorithm, p, False,
                                                                   homomorphic))
                for p in ranks]

    ring, tree, direct = errors("ring"), errors("tree"), errors("direct")
    assert ring == sorted(ring) and ring[-1] > 20 * fig.error  # ~ sqrt((p + 1) / 2)
    assert tree == sorted(tree) and tree[-1] < 3 * fig.error   # ~ sqrt(1 + log2(p) / 2)
    assert max(direct) < np.sqrt(2) * fig.error * 1.001          # two lossy points
    # fp16 adds payloads and rounds every partial sum in the ring; direct's owners sum
    # them decoded and encode once, so its error stays flat
    fp16 = _figures("fp16")

    def rounded(algorithm):
        return [model.combined_error(fp16.error, model.lossy_weight(algorithm, p, False, True))
                for p in ranks]

    assert rounded("ring") == sorted(rounded("ring")) and rounded("ring")[-1] > 20 * fp16.error
    assert max(rounded("direct")) < np.sqrt(2) * fp16.error * 1.001
    # integer lanes add exactly: one lossy point whatever the algorithm
    thc = _figures({"id": "thc", "bits": 4})
    assert thc.exact_sum
    assert all(model.lossy_weight(a, 1024, True, True) == 1.0 for a in model.FLAT)


@pytest.mark.parametrize("algorithm", ["ring", "direct", "tree", "allgather"])
def test_own_work_per_call_and_payload_at_the_share_of_cores(algorithm):
    # no bytes on the wire, an infinitely fast codec: what is left is ccl's own work
    onebit = get_codec("onebit")
    instant = _figures("onebit")._replace(encode_gbps=np.inf, decode_gbps=np.inf)
    for p, share in ((2, 1.0), (8, 0.25), (1024, 1.0)):
        machine = model.Machine(np.inf, 0.0, share)
        seconds = model.predict(algorithm, onebit, 0, p, machine, instant).seconds
        own = (model.CALL_SECONDS + model.PAYLOAD_SECONDS * model.payloads(algorithm, p)) / share
        assert seconds == pytest.approx(own, rel=1e-9)
    # the ring's and direct's payloads grow with p, the tree's with log p
    assert model.payloads(algorithm, 1024) == {"ring": 4092, "direct": 4092, "tree": 12,
                                               "allgather": 1024}[algorithm]


def test_lossy_weight_of_the_tree_counts_every_subtree():
    # p = 4: ranks 1 and 3 encode themselves, rank 2 two, the root four: 8 / 4
    assert model.lossy_weight("tree", 4) == 2.0
    assert model.lossy_weight("tree", 5) == (5 + 1 + 2 + 1 + 1) / 5
    # homomorphic: every input once, then rank 0 rounds 1+1 and 2+2, rank 2 rounds 1+1
    assert model.lossy_weight("tree", 4, homomorphic=True) == 1 + (2 + 4 + 2) / 4
    assert model.combined_error(0.5, 0) == 0.0 and model.combined_error(1.2, 3) == 1.2


def test_bytes_grow_with_p_for_gathers_and_widening_lanes_only():
    machine = model.Machine(10.0)
    n = 64 << 20
    sidco = get_codec("sidco")
    gathered = [model.predict("allgather", sidco, n, p, machine).sent_bytes for p in (8, 64)]
    assert gathered[1] == pytest.approx(gathered[0] * 63 / 7, rel=1e-3)
    ring = [model.predict("ring", sidco, n, p, machine).sent_bytes for p in (8, 64)]
    assert ring[1] < 1.2 * ring[0]  # re-encoded at every hop: ~ 2 (p - 1) / p of a payload
    thc = get_codec({"id": "thc", "bits": 4})
    widths = [model.payload_bits(thc, _figures({"id": "thc", "bits": 4}), c)
              for c in (1, 2, 8, 1000, 5000)]
    assert widths == [4.0, 8.0, 8.0, 16.0, 32.0]
    mpi = model.predict("mpi", None, n, 8, machine)
    assert mpi.sent_bytes == 2 * 7 / 8 * n and mpi.error == 0.0


def test_time_terms():
    codec = get_codec("onebit")
    fast = model.Machine(10.0)
    for algorithm in model.FLAT:
        base = model.predict(algorithm, codec, 16 << 20, 8, fast)
        slow_link = model.predict(algorithm, codec, 16 << 20, 8, fast._replace(link_gbps=1.0))
        latency = model.predict(algorithm, codec, 16 << 20, 8, fast._replace(latency_s=1e-3))
        shared = model.predict(algorithm, codec, 16 << 20, 8, fast._replace(share=0.25))
        assert slow_link.seconds > base.seconds and shared.seconds > base.seconds
        assert latency.seconds == pytest.approx(base.seconds + model.steps(algorithm, 8) * 1e-3)
    # a token bucket refills while the link idles: MPI's allreduce keeps it busy and gets
    # nothing of it; the allgather's link idles while the codec runs, so a payload within
    # the bucket passes at once
    burst = fast._replace(burst_bytes=1 << 20)
    assert model.predict("mpi", None, 1 << 19, 2, burst).seconds == \
        model.predict("mpi", None, 1 << 19, 2, fast).seconds > 0
    gathered = model.predict("allgather", codec, 1 << 19, 2, burst)
    coded = model.predict("allgather", codec, 1 << 19, 2, fast._replace(link_gbps=1e9))
    assert gathered.seconds == pytest.approx(coded.seconds)
    assert model.predict("allgather", codec, 1 << 19, 2, fast).seconds > gathered.seconds


def test_mpich_allreduce_beyond_a_power_of_two_sends_its_whole_input_twice_more():
    for p in (2, 4, 8, 16):
        assert model.mpi_sent_bytes(1.0, p) == pytest.approx(2 * (p - 1) / p)
    if model.mpi_halves():  # the library the tests run on decides (MPICH and Open MPI in CI)
        assert model.mpi_sent_bytes(1.0, 3) == pytest.approx(3.0)
        assert model.mpi_sent_bytes(1.0, 6) == pytest.approx(3.5)
    else:
        assert model.mpi_sent_bytes(1.0, 3) == pytest.approx(4 / 3)


def test_hierarchical_carries_one_copy_per_node_across():
    codec = get_codec("3lc")
    nodes = model.Machine(10.0, ranks_per_node=8)
    flat = model.Machine(10.0)
    hier = model.predict("hierarchical", codec, 64 << 20, 64, nodes, cross="direct")
    assert hier.algorithm == "hierarchical/direct"
    assert hier.sent_bytes < model.predict("direct", codec, 64 << 20, 64, flat).sent_bytes / 4
    assert model.predict_all(codec, 1 << 20, 64, nodes).keys() == set(model.ALGORITHMS)


def test_calibration_round_trip(tmp_path):
    path = str(tmp_path / "model.json")
    assert figures.load_calibration(path) == {}
    codec = get_codec("onebit")
    fig = figures.measure_figures(codec, 1 << 12)
    key = f"{codec.config_hash:016x}"
    figures.save_calibration({key: fig}, path)
    assert figures.load_calibration(path) == {key: fig}
    assert figures.codec_figures(codec, figures.load_calibration(path)) == fig
    with open(path, "w") as f:
        f.write("not json")
    assert figures.load_calibration(path) == {}  # ignored: the stated figures are used
    assert figures.calibration_path({"XDG_CACHE_HOME": "/x"}) == "/x/ccl/model.json"


def test_measured_figures_are_deterministic():
    codec = get_codec("dithering")
    assert figures.measure_figures(codec) == figures.measure_figures(get_codec("dithering"))


# ------------------------------------------------------------------ auto's picks
@pytest.mark.parametrize("codec", CODECS, ids=str)
def test_auto_past_four_ranks_stays_within_the_error_bound(codec):
    codec = get_codec(codec)
    fig = figures.codec_figures(codec, calibration={})
    for p in (5, 8, 16, 64, 1024):
        for gbps in (0.1, 1.0, 10.0, 100.0):
            for nbytes in (1 << 20, 64 << 20):
                decision = auto.decide(codec, nbytes, p, np.float32, link_gbps=gbps)
                if decision.algorithm == "mpi":
                    continue
                error = model.combined_error(
                    fig.error, model.lossy_weight(decision.algorithm, p, fig.exact_sum,
                                                  codec.homomorphic))
                assert error <= model.error_bound(fig) * (1 + 1e-9), (p, gbps, decision)


def test_auto_past_four_ranks_picks_the_models_fastest():
    machine = model.Machine(1.0)
    fp16 = get_codec("fp16")
    best = model.best(fp16, 64 << 20, 16, machine)
    # fp16 rounds each partial sum it adds: ~9.4 lossy points in the ring at 16, 5 in the
    # tree; direct's owners sum decoded (two lossy points) and move the ring's bytes
    assert best.algorithm == "direct"
    ring = model.predict("ring", fp16, 64 << 20, 16, machine)
    assert ring.seconds == best.seconds and ring.error > model.error_bound(
        figures.codec_figures(fp16, calibration={}))
    decision = auto.decide(fp16, 64 << 20, 16, np.float32, link_gbps=1.0)
    assert decision.algorithm == "direct" and decision.estimate[1] == best.seconds
    onebit = get_codec("onebit")
    # the fitting algorithm first: it wins ties (direct and ring move the same bytes)
    best = model.best(onebit, 64 << 20, 16, machine, candidates=("direct", "ring", "tree",
                                                                  "allgather"))
    assert auto.decide(onebit, 64 << 20, 16, np.float32, link_gbps=1.0).algorithm == \
        best.algorithm == "direct"
    # up to four ranks, the fitting algorithm as before
    assert auto.decide(fp16, 64 << 20, 4, np.float32, link_gbps=1.0).algorithm == "ring"


def test_auto_weighs_the_hierarchical_run_on_nodes_of_several_ranks():
    # 1024 ranks at 25 Gbit/s: a flat 3LC call handles 4 (p - 1) payloads a rank and loses
    # to MPI_Allreduce; on nodes of 8 ranks it runs hierarchically, 128 ranks across
    three = get_codec("3lc")
    flat = auto.decide(three, 256 << 20, 1024, np.float32, link_gbps=25.0, latency=1e-5)
    nodes = auto.decide(three, 256 << 20, 1024, np.float32, link_gbps=25.0, latency=1e-5,
                        ranks_per_node=8)
    assert flat.algorithm == "mpi" and flat.estimate[1] > flat.estimate[0]
    machine = model.Machine(25.0, 1e-5, ranks_per_node=8)
    across = model.predict("hierarchical", three, 256 << 20, 1024, machine)
    assert (nodes.algorithm, nodes.reason) == (across.algorithm.split("/")[1], "model: compress")
    assert nodes.estimate == (flat.estimate[0], across.seconds)


def test_equally_fast_algorithms_go_to_the_smaller_error():
    # where ranks share cores a re-encoding ring and direct pay the same latency, bytes
    # and coding; direct keeps two lossy points, the ring re-encodes at every hop
    sidco, shared = get_codec("sidco"), model.Machine(1.0, 1e-3, share=0.25)
    ring, direct = (model.predict(a, sidco, 16 << 20, 8, shared) for a in ("ring", "direct"))
    assert ring.seconds == direct.seconds and direct.error < ring.error
    assert model.best(sidco, 16 << 20, 8, shared, candidates=("ring", "direct")) == direct


# ------------------------------------------------------------------ against real runs
@pytest.mark.mpi
@pytest.mark.parametrize("codec", ["fp16", "onebit", {"id": "thc", "bits": 4}, "topk"], ids=str)
@pytest.mark.parametrize("algorithm", ["ring", "direct", "allgather", "tree"])
def test_predicted_bytes_and_error_match_a_real_call(comm, codec, algorithm):
    p, n = comm.size, 1 << 16
    c = ccl.Communicator(comm, codec=codec, algorithm=algorithm, segment_bytes=0,
                         partition_bytes=None, min_compress_bytes=None)
    x = rank_input(comm.rank, n, seed=3)
    y = c.allreduce(x, key="model")
    sent = comm.allreduce(c.stats()["bytes_sent"], op=MPI.MAX)
    exact = exact_sum(p, n, seed=3)
    error = float(np.linalg.norm(y - exact) / np.linalg.norm(exact))
    guess = model.predict(algorithm, get_codec(codec), 4 * n, p, model.Machine(1.0),
                          figures.codec_figures(get_codec(codec), calibration={}))
    if p == 1:
        return
    # what a rank sends, headers aside, as modelled
    assert sent == pytest.approx(guess.sent_bytes, rel=0.1, abs=2048)
    assert guess.error / 2 <= error <= guess.error * 2 + 1e-7


@pytest.mark.mpi
@pytest.mark.parametrize("codec", ["fp16", "onebit", {"id": "thc", "bits": 4}], ids=str)
def test_every_rank_picks_alike_and_the_model_says_why(comm, codec):
    """Past four ranks auto asks the model; every rank must run what every other runs."""
    c = ccl.Communicator(comm, codec=codec, link_gbps=1.0)
    c.allreduce(rank_input(comm.rank, 1 << 20), key="pick")
    stats = c.stats()
    (ran,) = stats["algorithms"]
    everyone = comm.allgather(ran)
    assert len(set(everyone)) == 1, everyone
    if comm.size == 1:
        assert ran == "mpi"  # nothing to send
        return
    # the pick is a function of the agreed profile: the model, asked again, says the same
    found = stats["auto"]
    speeds = next(iter(found["codec_gbps"].values()))
    again = auto.decide(get_codec(codec), 4 << 20, comm.size, np.float32, link_gbps=1.0,
                        cores=found["share"], latency=found["latency_s"], speeds=speeds)
    assert again.algorithm == ran
    assert json.dumps(again.estimate) == json.dumps(auto.decide(
        get_codec(codec), 4 << 20, comm.size, np.float32, link_gbps=1.0,
        cores=found["share"], latency=found["latency_s"], speeds=speeds).estimate)


def test_the_codec_inputs_moved_to_figures_and_are_still_found_in_model():
    with pytest.warns(DeprecationWarning, match="ccl.collectives.figures"):
        assert model.CodecFigures is figures.CodecFigures
    with pytest.raises(AttributeError):
        model.no_such_name  # noqa: B018
