"""Hardening of single calls: threads, diverged keys and steps, failures mid-collective,
timeouts, uneven allgather blocks and overflow flags (docs/reliability.md).

Each fault has a defined outcome: a correct result, or an exception on every rank.
"""

import threading

import numpy as np
import pytest
from mpi4py import MPI

import ccl
from ccl.codecs import get_codec
from ccl.testing import assert_same_on_all_ranks, rank_input


# ------------------------------------------------------------------------ threads
def _run_threads(targets):
    """Run ``targets`` (name -> function) in named threads; return name -> outcome list."""
    outcomes = {name: [] for name in targets}

    def body(name, function):
        try:
            function(outcomes[name])
        except Exception as exc:  # pragma: no cover - reported by the assertion below
            outcomes[name].append(("crash", repr(exc)))

    threads = [threading.Thread(target=body, args=(name, f), name=name)
               for name, f in targets.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("shared", [False, True], ids=["own-communicator", "one-communicator"])
def test_two_threads_never_mix_their_data(comm, shared):
    """Two threads per rank on one MPI communicator: each result is right, or raises."""
    p = comm.size
    common = ccl.Communicator(comm, codec="none", algorithm="ring") if shared else None

    def worker(value):
        def run(out):
            c = common or ccl.Communicator(comm, codec="none", algorithm="ring")
            for _ in range(20):
                try:
                    y = c.allreduce(np.full(64, value, np.float32))
                    out.append(("ok", float(y[0])))
                except ccl.MismatchError:
                    out.append(("mismatch", None))
        return run

    outcomes = _run_threads({"worker-a": worker(1.0), "worker-b": worker(100.0)})
    for name, value in (("worker-a", 1.0), ("worker-b", 100.0)):
        assert len(outcomes[name]) == 20, outcomes[name]
        for kind, got in outcomes[name]:
            assert kind in ("ok", "mismatch"), outcomes[name]
            if kind == "ok":
                assert got == p * value, f"{name} got {got}: data of another thread"


@pytest.mark.mpi
def test_module_functions_from_two_threads_never_mix(comm):
    p = comm.size

    def worker(value):
        def run(out):
            for _ in range(10):
                try:
                    y = ccl.compressed_allreduce(np.full(16, value, np.float32), "fp16",
                                                 comm=comm, algorithm="ring")
                    out.append(float(y[0]))
                except ccl.MismatchError:
                    out.append(None)
        return run

    outcomes = _run_threads({"t1": worker(1.0), "t2": worker(100.0)})
    assert set(outcomes["t1"]) <= {p * 1.0, None}
    assert set(outcomes["t2"]) <= {p * 100.0, None}


@pytest.mark.mpi
def test_communicators_created_by_two_threads_at_once(comm):
    fresh = comm.Dup()  # no channel on it yet: both threads race to create it
    try:
        made = _run_threads({name: (lambda out: out.append(ccl.Communicator(fresh)))
                             for name in ("c1", "c2")})
        first, second = made["c1"][0], made["c2"][0]
        assert not isinstance(first, tuple) and not isinstance(second, tuple), made
        assert first._channel is second._channel  # one private duplicate, made once
        y = first.allreduce(np.ones(8, np.float32), algorithm="ring")
        assert y[0] == comm.size
    finally:
        fresh.Free()


# ------------------------------------------------------------- diverged keys and steps
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("codec", ["thc", "randomk", "3lc"])
def test_a_step_restored_on_one_rank_only_raises_everywhere(comm, codec):
    c = ccl.Communicator(comm, codec=codec, algorithm="ring", min_compress_bytes=0)
    x = rank_input(comm.rank, 999)
    for _ in range(3):
        c.allreduce(x, key="w")
    saved = c.state_dict()
    c.allreduce(x, key="w")
    if comm.rank == 0:  # the documented mistake: one rank restores, the others go on
        c.load_state_dict(saved)
    with pytest.raises(ccl.MismatchError, match="step") as info:
        c.allreduce(x, key="w")
    assert info.value.field == "key's step"
    # every rank restored: the steps agree again
    c.load_state_dict(saved)
    assert_same_on_all_ranks(comm, c.allreduce(x, key="w"))


@pytest.mark.mpi(min_size=2)
def test_a_different_key_on_one_rank_raises_everywhere(comm):
    c = ccl.Communicator(comm, codec="randomk", algorithm="ring", min_compress_bytes=0)
    with pytest.raises(ccl.MismatchError, match="key") as info:
        c.allreduce(rank_input(comm.rank, 500), key="a" if comm.rank else "b")
    assert info.value.field == "key"


# Repeated calls reuse what was validated and built for the same arguments (the options
# of module-level calls, parsed variables, chunk maps): when one rank changes an argument
# after a run of identical calls, every rank must still raise, and the next call run.
_CHANGES = {"shape": "shape", "dtype": "dtype", "codec": "codec",
            "codec parameter": "codec", "op": "op", "algorithm": "algorithm",
            "variable": "algorithm"}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("via", ["module", "communicator"])
@pytest.mark.parametrize("change", sorted(_CHANGES))
def test_a_repeated_call_changed_on_one_rank_raises_everywhere(comm, monkeypatch, via, change):
    monkeypatch.delenv("CCL_SEGMENT_BYTES", raising=False)
    codec = get_codec("3lc")
    c = ccl.Communicator(comm, min_compress_bytes=0)

    def call(x, spec=codec, op="sum", algorithm="ring"):
        if via == "module":
            return ccl.compressed_allreduce(x, spec, comm=comm, op=op, algorithm=algorithm)
        return c.allreduce(x, codec=spec, op=op, algorithm=algorithm)

    x = rank_input(comm.rank, 300)
    for _ in range(3):
        call(x)
    args = {"shape": dict(x=x[:299]), "dtype": dict(x=x.astype(np.float64)),
            "codec": dict(spec="onebit"), "op": dict(op="mean"),
            "algorithm": dict(algorithm="tree")}.get(change, {})
    if comm.rank == 0:
        if change == "codec parameter":
            codec.s = 2.0  # changed in place: the same object, another configuration
        if change == "variable":
            monkeypatch.setenv("CCL_SEGMENT_BYTES", "4096")
    with pytest.raises(ccl.MismatchError) as info:
        call(**{"x": x, **(args if comm.rank == 0 else {})})
    assert info.value.field == _CHANGES[change]
    codec.s = 1.0
    monkeypatch.delenv("CCL_SEGMENT_BYTES", raising=False)
    assert_same_on_all_ranks(comm, call(x))


# ------------------------------------------------------------ failure mid-collective
class _FailingCodec:
    """Makes one rank's codec raise on its n-th encode (0-based) of this call."""

    def __init__(self, monkeypatch, codec, rank, n=1, error=MemoryError):
        self.count = 0
        original = type(codec)._encode
        failing_rank = rank

        def encode(this, x, ctx):
            if MPI.COMM_WORLD.rank == failing_rank:
                self.count += 1
                if self.count == n + 1:
                    raise error("injected failure")
            return original(this, x, ctx)

        monkeypatch.setattr(type(codec), "_encode", encode)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("codec_id, algorithm",
                         [("3lc", "ring"), ("3lc", "direct"), ("onebit", "tree"),
                          ("topk", "allgather"), ("thc", "ring"), ("fp16", "direct")])
def test_a_codec_failure_on_one_rank_raises_on_every_rank(comm, monkeypatch, codec_id,
                                                          algorithm):
    codec = get_codec(codec_id)
    c = ccl.Communicator(comm, codec=codec, algorithm=algorithm, min_compress_bytes=0,
                         segment_bytes=64)
    x = rank_input(comm.rank, 3001)
    before = c.allreduce(x, key="w")
    state = c.state_dict()
    _FailingCodec(monkeypatch, codec, rank=comm.size - 1, n=0)
    failing = comm.rank == comm.size - 1
    with pytest.raises(MemoryError if failing else ccl.PeerError) as info:
        c.allreduce(x, key="w")
    if not failing:
        assert info.value.ranks == [comm.size - 1]
    monkeypatch.undo()
    # nothing was committed, and the communicator works on
    after = c.state_dict()["feedback"]["w"]
    assert after["step"] == state["feedback"]["w"]["step"]
    assert_same_on_all_ranks(comm, c.allreduce(x, key="w"))
    assert before.shape == x.shape


# ------------------------------------------------------------------------- timeouts
@pytest.mark.mpi
def test_zero_timeout_waits_forever_in_the_argument_and_the_variable(comm, monkeypatch):
    x = np.ones(10, np.float32)
    y = ccl.compressed_allreduce(x, "fp16", comm=comm, algorithm="ring", timeout=0)
    assert y[0] == comm.size
    monkeypatch.setenv("CCL_TIMEOUT", "0")
    assert ccl.compressed_allreduce(x, "fp16", comm=comm, algorithm="ring")[0] == comm.size


@pytest.mark.mpi
def test_bad_timeouts_raise_on_their_rank_and_mismatch_elsewhere(comm, monkeypatch):
    x = np.ones(10, np.float32)
    bad = comm.rank == 0
    monkeypatch.setenv("CCL_TIMEOUT", "abc" if bad else "30")
    with pytest.raises(ValueError if bad else ccl.MismatchError, match="timeout|CCL_TIMEOUT|"
                       "rejected"):
        ccl.compressed_allreduce(x, "fp16", comm=comm, algorithm="ring")
    monkeypatch.delenv("CCL_TIMEOUT")
    with pytest.raises(ValueError if bad else ccl.MismatchError):
        ccl.compressed_allreduce(x, "fp16", comm=comm, algorithm="ring",
                                 timeout=-1 if bad else None)
    assert ccl.compressed_allreduce(x, "fp16", comm=comm, algorithm="ring")[0] == comm.size


# ------------------------------------------------------------------ uneven allgather
@pytest.mark.mpi
def test_allgather_uses_one_codec_for_blocks_of_every_size(comm):
    c = ccl.Communicator(comm, codec="fp16", min_compress_bytes=1000)
    lengths = [0 if r == 0 else (10 if r % 2 else 700) for r in range(comm.size)]
    block = np.arange(lengths[comm.rank], dtype=np.float32)
    full = c.allgather(block)
    assert full.size == sum(lengths)
    expected = np.concatenate([np.arange(n, dtype=np.float32) for n in lengths])
    np.testing.assert_array_equal(full, expected)  # small integers: exact in fp16
    assert_same_on_all_ranks(comm, full)


# -------------------------------------------------------------------------- overflow
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("codec_id", ["3lc", "dithering", "topk"])
@pytest.mark.parametrize("algorithm", ["direct", "ring", "tree", "allgather"])
def test_an_overflowing_worker_raises_on_every_rank(comm, codec_id, algorithm):
    n = 4 * comm.size
    x = np.ones(n, np.float64)
    if comm.rank == 0:
        x[-1] = 1e39  # finite in float64, beyond float32, in the last rank's chunk
    with pytest.raises(ccl.CompressionOverflowError):
        ccl.compressed_allreduce(x, codec_id, comm=comm, algorithm=algorithm)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("codec_id", ["3lc", "onebit", "dithering"])
@pytest.mark.parametrize("algorithm", ["direct", "ring", "tree"])
def test_a_float32_sum_past_the_range_raises_on_every_rank(comm, codec_id, algorithm):
    x = np.full(64, 3e38, np.float32)  # finite on every rank; the sum is not
    with pytest.raises(ccl.CompressionOverflowError):
        ccl.compressed_allreduce(x, codec_id, comm=comm, algorithm=algorithm)


# ------------------------------------------------------------------ loading state
def _saved_state(comm):
    c = ccl.Communicator(comm, codec="3lc", algorithm="direct", min_compress_bytes=0)
    for _ in range(2):
        c.allreduce(rank_input(comm.rank, 301), key="w")
    return c, c.state_dict()


def _edited(state, edit):
    import copy
    state = copy.deepcopy(state)
    entry = state["feedback"]["w"]
    point = sorted(entry["residuals"])[0]
    start, stop, res = entry["residuals"][point]
    edit(state, entry, point, start, stop, res)
    return state


BAD_STATES = {
    "list instead of dict": lambda st, e, p, a, b, r: st.__setitem__("feedback", [1, 2]),
    "junk layout": lambda st, e, p, a, b, r: e.__setitem__("layout", "junk"),
    "object residual": lambda st, e, p, a, b, r: e["residuals"].__setitem__(
        p, (a, b, np.array([object()] * (b - a)))),
    "short residual": lambda st, e, p, a, b, r: e["residuals"].__setitem__(p, (a, b, r[:-1])),
    "range outside": lambda st, e, p, a, b, r: e["residuals"].__setitem__(
        p, (a + 10**6, b + 10**6, r)),
    "nan residual": lambda st, e, p, a, b, r: r.__setitem__(0, np.nan),
    "inf residual": lambda st, e, p, a, b, r: r.__setitem__(0, np.inf),
    "negative step": lambda st, e, p, a, b, r: e.__setitem__("step", -1),
    "not a point": lambda st, e, p, a, b, r: e["residuals"].__setitem__("x", (a, b, r)),
}


@pytest.mark.parametrize("case", sorted(BAD_STATES))
def test_load_state_dict_refuses_what_it_cannot_use(comm, case):
    c, state = _saved_state(comm)
    bad = _edited(state, BAD_STATES[case])
    with pytest.raises(ValueError):
        c.load_state_dict(bad)
    # nothing was replaced: the state still works
    assert c.state_dict()["feedback"]["w"]["step"] == 2
    assert_same_on_all_ranks(comm, c.allreduce(rank_input(comm.rank, 301), key="w"))
    with pytest.raises(ValueError):
        c.load_state_dict([state])


@pytest.mark.mpi(min_size=2)
def test_a_load_that_failed_on_one_rank_raises_everywhere_on_the_next_call(comm):
    c, state = _saved_state(comm)
    c.allreduce(rank_input(comm.rank, 301), key="w")
    if comm.rank == 0:  # this rank's load fails and keeps its state (step 3) ...
        with pytest.raises(ValueError):
            c.load_state_dict(_edited(state, BAD_STATES["nan residual"]))
    else:  # ... while the others go back to step 2
        c.load_state_dict(state)
    with pytest.raises(ccl.MismatchError):
        c.allreduce(rank_input(comm.rank, 301), key="w")


@pytest.mark.mpi(min_size=2)
def test_a_residual_that_does_not_fit_its_chunk_raises_everywhere(comm):
    c, state = _saved_state(comm)
    if comm.rank == 0:  # a residual range that passes the load checks but not the chunk map
        entry = state["feedback"]["w"]
        point = sorted(entry["residuals"])[0]
        start, stop, res = entry["residuals"][point]
        entry["residuals"][point] = (start, stop - 1, res[:-1])
    c.load_state_dict(state)
    with pytest.raises(ValueError if comm.rank == 0 else ccl.PeerError):
        c.allreduce(rank_input(comm.rank, 301), key="w")


# ---------------------------------------------------------------------- small items
def test_small_items_get_clear_outcomes(comm):
    p = comm.size
    with pytest.raises(TypeError, match="masked"):
        ccl.compressed_allreduce(np.ma.masked_array(np.ones(4, np.float32), [0, 1, 0, 0]),
                                 "fp16", comm=comm)
    big = np.ones(8, dtype=">f4")  # big-endian float32: reduced like native float32
    assert ccl.compressed_allreduce(big, "fp16", comm=comm, algorithm="ring")[0] == p
    with pytest.raises(ValueError, match="THC bits"):
        get_codec("thc", bits=2.0)
    with pytest.raises(ValueError, match="THC p"):
        get_codec("thc", p=1e-300)
    with pytest.raises(ValueError, match="density"):
        get_codec("randomk", density=0.1 + 0j)
    none = get_codec("none")
    payload = none.encode(np.full(4, 60000, np.float16))
    with pytest.raises(ccl.CompressionOverflowError):
        none.decode(none.add(payload, payload))  # float16 sums past 65504 are an overflow


@pytest.mark.mpi(min_size=2)
def test_a_float16_sum_past_its_range_raises_without_a_codec(comm):
    with pytest.raises(ccl.CompressionOverflowError):
        ccl.compressed_allreduce(np.full(8, 60000, np.float16), "none", comm=comm,
                                 algorithm="ring")


@pytest.mark.mpi
def test_a_freed_communicator_raises_a_clear_error(comm):
    mine = comm.Dup()
    c = ccl.Communicator(mine, codec="fp16")
    c.allreduce(np.ones(4, np.float32), algorithm="ring")
    mine.Free()
    with pytest.raises(ValueError, match="freed"):
        c.allreduce(np.ones(4, np.float32), algorithm="ring")
    with pytest.raises(ValueError, match="freed"):
        ccl.compressed_allreduce(np.ones(4, np.float32), comm=mine)
