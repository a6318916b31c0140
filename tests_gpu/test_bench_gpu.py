"""``python -m ccl.bench gpu`` without a GPU: a clear message and status 2, no traceback."""

from ccl.bench.__main__ import main
from ccl.bench.gpu import gpu_missing
from conftest import gpu_unavailable_reason


def test_gpu_bench_says_why_it_cannot_run(capsys):
    if gpu_unavailable_reason() is None:  # pragma: no cover - a GPU machine: it would run
        return
    assert gpu_missing()
    assert main(["gpu", "--n", "1000", "--reps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m ccl.bench gpu: needs a GPU: ")
