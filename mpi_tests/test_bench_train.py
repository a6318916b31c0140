"""``python -m ccl.bench.train`` on a tiny model: the JSON it writes, and methods that must agree.

Correctness only: no figure here is a speed. The MPI-marked test runs at
the launched rank count, in-process, on the test's communicator.
"""

import json

import pytest

from ccl.bench import train_methods

pytest.importorskip("torch")
pytest.importorskip("sklearn")

ROW_KEYS = {"method", "steps", "step_times", "losses", "curve", "train_seconds",
            "median_step_s", "final_accuracy", "bytes_per_step", "bytes_source",
            "steps_to_target", "time_to_target_s", "vs_reference"}
STEPS, HIDDEN = 4, 16
METHODS = ["ccl/none", "ddp/none", "local", "ccl/topk", "hook/onebit"]


def _run(comm, tmp_path, extra=()):
    import torch

    threads = torch.get_num_threads()
    path = comm.bcast(str(tmp_path / "train.json"), root=0)  # rank 0 writes, all read
    try:
        from ccl.bench import train
        assert train.main(["--hidden", str(HIDDEN), "--steps", str(STEPS), "--batch", "16",
                           "--eval-every", "1", "--warmup", "1", "--methods", *METHODS,
                           "--json", path, *extra], comm=comm) == 0
    finally:
        torch.set_num_threads(threads)
    comm.Barrier()
    with open(path) as f:
        out = json.load(f)
    comm.Barrier()  # nobody leaves (and rank 0's tmp_path may go) before all have read
    return out


@pytest.mark.mpi
@pytest.mark.max_ranks(3)
def test_train_rows_and_identical_starts(comm, tmp_path):
    out = _run(comm, tmp_path)
    rows = {r["method"]: r for r in out["rows"]}
    # torch's PowerSGD hook is always in the comparison, added when not asked for
    assert list(rows) == METHODS + ["ddp/powersgd"] and out["ranks"] == comm.size
    assert out["parameters"] == 64 * 16 + 16 + 16 * 16 + 16 + 16 * 10 + 10
    target = min(0.95, rows["ddp/none"]["final_accuracy"])
    assert out["target"] == target
    assert out["target_source"] == ("default" if target == 0.95 else
                                    "ddp/none's final accuracy (step 4), under 0.95")
    for r in rows.values():
        assert ROW_KEYS <= set(r) and r["steps"] == STEPS
        assert len(r["step_times"]) == len(r["losses"]) == STEPS
        assert all(t > 0 for t in r["step_times"])
        assert [c[0] for c in r["curve"]] == list(range(STEPS + 1))
        seconds = [c[1] for c in r["curve"]]
        assert seconds[0] == 0 and seconds == sorted(seconds)
        assert r["train_seconds"] == pytest.approx(sum(r["step_times"]))
        assert r["final_accuracy"] == r["curve"][-1][2]
        assert all(0 <= c[2] <= 1 for c in r["curve"])
        if r["steps_to_target"] is not None:
            hit = r["curve"][r["steps_to_target"]]
            assert hit[2] >= out["target"] and r["time_to_target_s"] == hit[1]
    # the same initial weights and batches: the same first loss and initial accuracy
    assert len({r["losses"][0] for r in rows.values()}) == 1
    assert len({r["curve"][0][2] for r in rows.values()}) == 1
    # uncompressed averaging through MPI and through gloo: the same steps
    ccl_none, ddp_none, local = rows["ccl/none"], rows["ddp/none"], rows["local"]
    assert ccl_none["losses"] == pytest.approx(ddp_none["losses"], rel=1e-5)
    ring = 2 * (comm.size - 1) / comm.size
    assert ddp_none["bytes_per_step"] == pytest.approx(ring * 4 * out["parameters"])
    assert ddp_none["bytes_source"] == "computed" and local["bytes_per_step"] == 0
    assert ccl_none["bytes_source"] == "counted" and ccl_none["buckets"] >= 1
    if comm.size == 1:
        # nothing to average: every uncompressed method takes the very same steps
        for r in (ddp_none, local):
            assert r["losses"] == ccl_none["losses"] and r["curve"][1:] != []
            assert [c[2] for c in r["curve"]] == [c[2] for c in ccl_none["curve"]]
        assert ccl_none["bytes_per_step"] == rows["ccl/topk"]["bytes_per_step"] == 0
    else:
        assert ccl_none["bytes_per_step"] > 0
    # DDP with ccl's hook, counted by the hook's communicator: the tiny model's bucket is
    # under min_compress_bytes, so it travels uncompressed, as ccl/none's does
    hook = rows["hook/onebit"]
    assert hook["bytes_source"] == "counted"
    assert hook["bytes_per_step"] == pytest.approx(ccl_none["bytes_per_step"])


def test_target_and_time_to_accuracy():
    from ccl.bench import train

    # curves: (step, summed step times of the slowest rank, test accuracy)
    curve = [[0, 0.0, 0.1], [2, 1.0, 0.5], [4, 2.0, 0.9], [5, 2.5, 0.8]]
    rows = [dict(method="local", steps=5, final_accuracy=0.85,
                 curve=[[0, 0.0, 0.1], [5, 0.5, 0.85]]),
            dict(method="ddp/none", steps=5, final_accuracy=0.8, curve=curve),
            dict(method="ddp/powersgd", steps=5, final_accuracy=0.96,
                 curve=[[0, 0.0, 0.1], [2, 0.4, 0.82], [5, 1.1, 0.96]])]
    # ddp/none ended below 95 %: its final accuracy is the target
    assert train.pick_target(rows) == (0.8, "ddp/none's final accuracy (step 5), under 0.95")
    assert train.pick_target(rows, 0.7) == (0.7, "--target")
    rows[1]["final_accuracy"] = 0.97
    assert train.pick_target(rows) == (0.95, "default")
    assert train.pick_target(rows[:1]) == (0.95, "default")
    train.add_target(rows, 0.8)
    # the first evaluation at or above the target, not the last one
    assert (rows[0]["steps_to_target"], rows[0]["time_to_target_s"]) == (5, 0.5)
    assert (rows[1]["steps_to_target"], rows[1]["time_to_target_s"]) == (4, 2.0)
    assert (rows[2]["steps_to_target"], rows[2]["time_to_target_s"]) == (2, 0.4)
    assert [r["vs_reference"] for r in rows] == pytest.approx([1.25, 5.0, 1.0])
    train.add_target(rows, 0.95)
    assert rows[0]["steps_to_target"] is rows[1]["time_to_target_s"] is None
    assert [r["vs_reference"] for r in rows] == [None, None, 1.0]
    train.add_target(rows, 0.99)  # nobody, PowerSGD included, reached it
    assert [r["vs_reference"] for r in rows] == [None, None, None]
    train.add_target(rows, 0.1)  # reached before the first step: no ratio to take
    assert [r["time_to_target_s"] for r in rows] == [0.0] * 3
    assert [r["vs_reference"] for r in rows] == [None, None, None]
    lines = train.table([dict(r, median_step_s=0.1, bytes_per_step=1e6, bytes_source="counted")
                         for r in rows]).splitlines()
    assert lines[0].split()[:4] == ["method", "to", "target", "s"]


def test_methods_are_checked():
    train_methods.check_methods(train_methods.METHODS)
    with pytest.raises(ValueError, match="known: ddp/none"):
        train_methods.check_methods(["ccl/none", "ddp/bogus"])
    assert train_methods.kind("hook/3lc") == "hook"
    assert [train_methods.kind(m) for m in ("ddp/fp16", "ccl/3lc", "local")] == \
        ["ddp", "ccl", "local"]
