"""Nothing lost, nothing pickled, no hang: every codec and algorithm (issue #11).

* error feedback conserves mass over 200 steps for every registered codec x
  algorithm (allreduce on ring, tree, direct and allgather; reduce-scatter;
  the allgather collective) at 3 and 4 ranks (other sizes: the casts only;
  test_codecs_collective.py runs 50 steps there);
* residuals survive ``state_dict()``/``load_state_dict()`` exactly;
* the non-finite policy holds for every codec: NaN propagates bitwise
  identically, ``check_finite=True`` raises everywhere, residuals are never
  poisoned;
* a rank calling another collective gets ``MismatchError`` on every rank;
* the public collectives never call mpi4py's pickling (lower-case) methods.
"""

import pickle

import numpy as np
import pytest
from mpi4py import MPI

import ccl
from ccl.codecs import get_codec, registered_codecs
from ccl.tools import soak
from ccl.tools.soak import CAST_ROUNDING, cast_bound, conservation_tolerance
from ccl.testing import assert_same_on_all_ranks, exact_sum, rank_input

pytestmark = pytest.mark.mpi

CODECS = registered_codecs()
ALGORITHMS = ["ring", "tree", "direct", "allgather"]


def _steps(comm, codec):
    """Steps of the conservation runs: 200 at 3 and 4 ranks, as the issue asks.

    Codecs without error feedback hold no state: 20 steps check them at any
    size. Elsewhere the error-feedback codecs are skipped: at every size,
    ``test_codecs_collective.py::test_error_feedback_conservation`` runs 50.
    """
    if not get_codec(codec).error_feedback:
        return 20
    if comm.size not in (3, 4):
        pytest.skip("the 200-step run is for 3 and 4 ranks; test_codecs_collective.py "
                    "checks 50 steps at every size")
    return 200


def _check_conservation(comm, delivered, held_local, put_in, steps, codec, magnitude):
    held = np.empty_like(held_local)
    comm.Allreduce(held_local, held, op=MPI.SUM)
    atol = conservation_tolerance(steps, comm.size, magnitude)
    error = np.abs(delivered + held - put_in).max(initial=0.0)
    assert error <= atol, (f"{codec}: delivered + held differs from what was put in by "
                           f"{error:.3g} (allowed {atol:.3g}) after {steps} steps")
    return float(np.abs(held).max(initial=0.0)), atol


def _check_cast_step(codec, y, exact, p):
    """Codecs without error feedback (casts) lose only their rounding, once per step."""
    assert codec in CAST_ROUNDING, f"codec {codec!r} has no error feedback: add its rounding"
    # partial sums are bounded by the sum of |x_r| <= p * 5 for standard-normal inputs
    bound = cast_bound(codec, exact, p * 5.0, p)
    assert np.all(np.abs(y - exact) <= bound), f"{codec}: error beyond its rounding"


@pytest.mark.parametrize("codec", CODECS)
def test_error_feedback_conserves_mass_for_every_codec_and_algorithm(comm, codec):
    n, steps, p = 61, _steps(comm, codec), comm.size
    feedback = get_codec(codec).error_feedback
    lossy_seen = False
    for algorithm in ALGORITHMS:
        c = ccl.Communicator(comm, codec=codec, algorithm=algorithm, min_compress_bytes=0)
        delivered, put_in = np.zeros(n), np.zeros(n)
        magnitude = 1.0
        for step in range(steps):
            y = c.allreduce(rank_input(comm.rank, n, seed=5, step=step), key="w")
            exact = exact_sum(p, n, seed=5, step=step)
            delivered += y
            put_in += exact
            magnitude = max(magnitude, float(np.abs(y).max()))
            if not feedback:
                _check_cast_step(codec, y, exact, p)
        assert_same_on_all_ranks(comm, y)
        if not feedback:
            assert c.feedback.get("w") is None or not c.feedback.get("w").residuals
            continue
        state = c.feedback.get("w")
        held_local = state.held(n) if state is not None else np.zeros(n)
        magnitude = max(magnitude, float(np.abs(held_local).max(initial=0.0)))
        held, atol = _check_conservation(comm, delivered, held_local, put_in, steps,
                                         f"{codec}/{algorithm}", magnitude)
        # dropping residuals this large would fail the check above
        lossy_seen |= held > 2 * atol
    if feedback:
        # the property is not vacuous: residuals really carried mass somewhere
        assert lossy_seen, f"{codec}: no residual ever held anything"


@pytest.mark.parametrize("codec", CODECS)
def test_error_feedback_conserves_mass_in_reduce_scatter_and_allgather(comm, codec):
    n, steps, p = 47, max(_steps(comm, codec) // 4, 5), comm.size
    feedback = get_codec(codec).error_feedback
    mine = np.array_split(np.arange(n), p)[comm.rank]
    for algorithm in ("ring", "direct"):
        c = ccl.Communicator(comm, codec=codec, algorithm=algorithm, min_compress_bytes=0)
        delivered, put_in = np.zeros(n), np.zeros(n)
        for step in range(steps):
            blk = c.reduce_scatter(rank_input(comm.rank, n, seed=6, step=step), key="rs")
            exact = exact_sum(p, n, seed=6, step=step)
            assert blk.shape == mine.shape
            delivered[mine] += blk  # each rank delivers its own block
            put_in += exact
            if not feedback:
                _check_cast_step(codec, blk, exact[mine], p)
        if feedback:
            full = np.empty(n)
            comm.Allreduce(delivered, full, op=MPI.SUM)
            _check_conservation(comm, full, c.feedback.get("rs").held(n), put_in, steps,
                                f"{codec}/reduce_scatter/{algorithm}", 1.0 + p * 5)
    # allgather: rank r's block is encoded once, by r, and its residual stays on r
    lengths = [(5 * r + 3) % 11 for r in range(p)]
    lo = sum(lengths[:comm.rank])
    total = sum(lengths)
    c = ccl.Communicator(comm, codec=codec, min_compress_bytes=0)
    delivered, put_in = np.zeros(total), np.zeros(total)
    for step in range(steps):
        full = c.allgather(rank_input(comm.rank, lengths[comm.rank], seed=7, step=step),
                           key="ag")
        exact = np.concatenate([rank_input(r, lengths[r], seed=7, step=step)
                                for r in range(p)]).astype(np.float64)
        delivered += full
        put_in += exact
        if not feedback:
            _check_cast_step(codec, full, exact, 1)
    assert_same_on_all_ranks(comm, full)
    if feedback:
        held_local = np.zeros(total)
        held_local[lo:lo + lengths[comm.rank]] = c.feedback.get("ag").held(lengths[comm.rank])
        _check_conservation(comm, delivered, held_local, put_in, steps, f"{codec}/allgather",
                            5.0)


def _config(codec):
    # sidco's adaptive stages are codec state of their own: checkpoint that too
    return {"id": "sidco", "adaptive": True} if codec == "sidco" else {"id": codec}


@pytest.mark.parametrize("codec", CODECS)
def test_state_dict_round_trip_continues_bit_identically(comm, codec):
    n = 301
    # small partitions: several pieces, each with its own residuals and chunk map
    make = lambda: ccl.Communicator(comm, codec=_config(codec), algorithm="auto",  # noqa: E731
                                    min_compress_bytes=0, partition_bytes=4 * 97)
    a = make()
    keys = (("w", "direct"), ("w-ring", "ring"))
    for step in range(3):
        for key, algorithm in keys:
            a.allreduce(rank_input(comm.rank, n, step=step), key=key, algorithm=algorithm)
    # the state goes through a checkpoint file's format (pickle, never on the wire)
    saved = pickle.loads(pickle.dumps(a.state_dict()))
    b = make()
    b.load_state_dict(saved)
    for step in range(3, 6):
        for key, algorithm in keys:
            x = rank_input(comm.rank, n, step=step)
            ya = a.allreduce(x, key=key, algorithm=algorithm)
            yb = b.allreduce(x, key=key, algorithm=algorithm)
            np.testing.assert_array_equal(ya, yb)
    for key, _ in keys:
        sa, sb = a.feedback.get(key), b.feedback.get(key)
        assert sa.step == sb.step
        assert sa.residuals.keys() == sb.residuals.keys()
        for point, (start, stop, residual) in sa.residuals.items():
            assert sb.residuals[point][:2] == (start, stop)
            np.testing.assert_array_equal(sb.residuals[point][2], residual)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("codec", CODECS)
def test_nonfinite_policy_for_every_codec(comm, codec, algorithm):
    n = 40
    c = ccl.Communicator(comm, codec=codec, algorithm=algorithm, min_compress_bytes=0)
    c.allreduce(rank_input(comm.rank, n, step=1), key="k")
    state = c.feedback.get("k")
    before = state.held(n)
    step_before = state.step
    x = rank_input(comm.rank, n, step=2)
    if comm.rank == comm.size - 1:
        x[3] = np.nan
        x[n - 1] = np.inf
    # check_finite: every rank raises, and the key's state is left exactly as it was
    with pytest.raises(ccl.NonFiniteError, match=rf"rank\(s\) \[{comm.size - 1}\]"):
        c.allreduce(x, key="k", check_finite=True)
    assert state.step == step_before
    np.testing.assert_array_equal(state.held(n), before)
    # default: the affected chunk decodes to NaN on every rank, bitwise alike
    y = c.allreduce(x, key="k")
    assert_same_on_all_ranks(comm, y)
    assert np.isnan(y[3]) and np.isnan(y[n - 1]), "a non-finite chunk decodes to NaN"
    assert not np.isinf(y).any()
    after = state.held(n)
    assert np.isfinite(after).all(), "residuals must not be poisoned"
    np.testing.assert_array_equal(before[np.isnan(y)], after[np.isnan(y)])
    # and the next finite step is finite again, on every rank alike
    y = c.allreduce(rank_input(comm.rank, n, step=3), key="k")
    assert np.isfinite(y).all() and np.isfinite(state.held(n)).all()
    assert_same_on_all_ranks(comm, y)


@pytest.mark.parametrize("codec", CODECS)
def test_nonfinite_policy_in_reduce_scatter_and_allgather(comm, codec):
    n = 23
    x = rank_input(comm.rank, n)
    if comm.rank == 0:
        x[0] = np.nan
    for call in (lambda **kw: ccl.reduce_scatter(x, codec, comm=comm, key="rs", **kw),
                 lambda **kw: ccl.allgather(x, codec, comm=comm, key="ag", **kw)):
        with pytest.raises(ccl.NonFiniteError):
            call(check_finite=True)
        y = call()
        assert not np.isinf(y).any()
    full = ccl.allgather(x, codec, comm=comm, key="ag")
    assert_same_on_all_ranks(comm, full)
    assert np.isnan(full[:n]).all(), "rank 0's whole block was flagged"
    assert np.isfinite(full[n:]).all()


COLLECTIVES = ["allreduce", "reduce_scatter", "allgather"]


def _call(comm, collective, codec="fp16", **kw):
    x = np.ones(12, np.float32)
    if collective == "allreduce":
        return ccl.compressed_allreduce(x, codec, comm=comm, **kw)
    if collective == "reduce_scatter":
        return ccl.reduce_scatter(x, codec, comm=comm, **kw)
    return ccl.allgather(x, codec, comm=comm, **kw)


@pytest.mark.parametrize("mine,odd", [(a, b) for a in COLLECTIVES for b in COLLECTIVES
                                      if a != b])
@pytest.mark.mpi(min_size=2)
def test_a_rank_calling_another_collective_raises_everywhere(comm, mine, odd):
    last = comm.rank == comm.size - 1
    with pytest.raises(ccl.MismatchError, match="collective") as info:
        _call(comm, odd if last else mine, key="k")
    assert info.value.field == "collective"
    assert [comm.size - 1] in info.value.ranks
    # through a Communicator too, and with a different codec on top (collective wins)
    c = ccl.Communicator(comm, codec="fp16", min_compress_bytes=0)
    method = getattr(c, odd if last else mine)
    with pytest.raises(ccl.MismatchError) as info:
        method(np.ones(12, np.float32), codec="bf16" if last else None)
    assert info.value.field == "collective"
    # nothing is left dangling: the next agreed call works
    y = _call(comm, "allreduce", algorithm="ring")
    assert (y == comm.size).all()


PICKLING = ("allgather", "allreduce", "alltoall", "bcast", "bsend", "exscan", "gather",
            "ibsend", "improbe", "irecv", "isend", "issend", "mprobe", "recv", "reduce",
            "scan", "scatter", "send", "sendrecv", "ssend")


class _Guarded(MPI.Intracomm):
    """An Intracomm that records calls of mpi4py's pickling methods (``Dup`` keeps the type)."""

    calls = []


def _recording(name):
    def method(self, *args, **kwargs):
        _Guarded.calls.append(name)
        return getattr(super(_Guarded, self), name)(*args, **kwargs)
    method.__name__ = name
    return method


for _name in PICKLING:
    setattr(_Guarded, _name, _recording(_name))


@pytest.fixture
def guarded(comm, monkeypatch):
    """``comm`` as a :class:`_Guarded`, with mpi4py's pickle itself recording too."""
    _Guarded.calls.clear()
    pickled = []

    def recording_dumps(obj, *args, **kwargs):
        pickled.append(("dumps", type(obj).__name__))
        return pickle.dumps(obj, *args, **kwargs)

    def recording_loads(data, *args, **kwargs):
        pickled.append(("loads", len(data)))
        return pickle.loads(data, *args, **kwargs)

    # mpi4py serialises with the functions given to MPI.pickle (default: the pickle module's)
    MPI.pickle.__init__(recording_dumps, recording_loads)
    try:
        yield _Guarded(comm), pickled
    finally:
        MPI.pickle.__init__()


def test_the_guard_sees_pickling_calls(guarded):
    g, pickled = guarded
    assert g.bcast({"a": 1}, root=0) == {"a": 1}
    assert _Guarded.calls == ["bcast"]
    assert g.Dup().__class__ is _Guarded
    assert pickled  # root dumps, the others load


def test_public_collectives_never_pickle(guarded):
    g, pickled = guarded
    x = rank_input(g.rank, 1237)
    for codec in CODECS + [None]:
        for algorithm in ("auto", "mpi", "ring", "tree", "direct", "allgather"):
            if algorithm == "mpi" and get_codec(codec).codec_id != "none":
                continue
            ccl.compressed_allreduce(x, codec, comm=g, algorithm=algorithm, key="p",
                                     op="mean" if algorithm == "ring" else "sum")
        for algorithm in ("auto", "ring", "direct"):
            ccl.reduce_scatter(x, codec, comm=g, algorithm=algorithm, key="p")
        ccl.allgather(x[:g.rank + 3], codec, comm=g, key="p")
        c = ccl.Communicator(g, codec=codec, partition_bytes=1024, min_compress_bytes=512)
        c.allreduce(x, key="c")
        c.reduce_scatter(x, key="c")
        c.allgather(x[:5], key="c")
        c.load_state_dict(c.state_dict())
    # the failure paths exchange only the fixed-size signature too
    bad = x.copy()
    bad[0] = np.nan
    with pytest.raises(ccl.NonFiniteError):
        ccl.compressed_allreduce(bad, "fp16", comm=g, check_finite=True)
    ccl.compressed_allreduce(bad, "topk", comm=g, algorithm="allgather")
    if g.size > 1:
        with pytest.raises(ccl.MismatchError):
            ccl.compressed_allreduce(x[:10 + (g.rank == 0)], "fp16", comm=g)
        with pytest.raises((ccl.MismatchError, TypeError)):
            ccl.compressed_allreduce(x.astype(np.int32) if g.rank == 0 else x, "fp16", comm=g)
    assert _Guarded.calls == [], f"pickling methods called: {sorted(set(_Guarded.calls))}"
    assert pickled == [], f"mpi4py pickled: {pickled[:5]}"


def test_short_soak(comm):
    """200 mixed, checked collectives (the long run: ``python -m ccl.tools.soak``)."""
    result = soak.run(comm, calls=200, seed=comm.size, max_size=700)
    assert result["failures"] == 0, result["messages"]
    if comm.size > 1:
        assert result["keys_conserved"] == result["keyed_lossy_keys"] > 0


def test_soak_notices_lost_residuals(comm, monkeypatch):
    """The soak's conservation check can fail: drop every residual and it must."""
    from ccl.feedback import KeyState

    def commit_nothing(self, skip_chunks=()):
        self._pending = {}
        self.step += 1

    monkeypatch.setattr(KeyState, "commit", commit_nothing)
    result = soak.run(comm, calls=60, seed=comm.size, max_size=300)
    assert result["failures"] > 0
    assert result["keys_conserved"] < result["keyed_lossy_keys"]
