"""``python -m ccl.bench gpu`` without a GPU: a clear message and status 2, no traceback."""

from ccl.bench.__main__ import main
from ccl.bench.gpu import gpu_missing
from mpi_tests.helpers.gpu import gpu_unavailable_reason


def test_gpu_bench_says_why_it_cannot_run(capsys):
    if gpu_unavailable_reason() is None:  # pragma: no cover - a GPU machine: it would run
        return
    assert gpu_missing()
    assert main(["gpu", "--n", "1000", "--reps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m ccl.bench gpu: needs a GPU: ")


def test_gpu_bench_decodes_past_the_unchecked_size(monkeypatch):
    # on an H100 the 1 GB row stopped at randomk: a decoder refuses to allocate more than
    # MAX_UNCHECKED_ELEMENTS on a payload's word alone, and the bench did not say what to
    # expect. The limit is lowered here so that the simulator reaches it with small arrays.
    import ccl.codecs.base
    import ccl.codecs.randomk.codec
    import ccl.codecs.sparse._common
    import ccl.codecs.thc.codec
    from ccl.bench.gpu import measure

    for module in (ccl.codecs.base, ccl.codecs.randomk.codec, ccl.codecs.sparse._common,
                   ccl.codecs.thc.codec):
        if hasattr(module, "MAX_UNCHECKED_ELEMENTS"):
            monkeypatch.setattr(module, "MAX_UNCHECKED_ELEMENTS", 100)
    rows = measure(["randomk", "thc", "topk", "fp16"], 1000, reps=1, simulate=True)
    assert [row["n"] for row in rows] == [1000] * 4
    assert all(row["decode_gbs"] > 0 for row in rows)
