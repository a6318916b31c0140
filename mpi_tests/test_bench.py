"""The benchmark commands on tiny inputs: they run, and the rows they write make sense.

Figures are checked for shape and range only; no test asserts a time. The
serial tests call each command's ``main`` in-process; the MPI-marked one runs
``ccl.bench accuracy`` on the test's communicator.
"""

import json
import math

import numba
import numpy as np
import pytest

import ccl
from ccl.bench import accuracy, gradients, selection, steady
from ccl.bench import codecs as bench_codecs
from ccl.codecs import get_codec, registered_codecs
from ccl.testing import assert_same_on_all_ranks, rank_input

SELECTION_KEYS = {"kind", "method", "config", "density", "k", "achieved_density", "time_s",
                  "cpu_s", "speedup", "cpu_speedup", "n", "reps", "data"}
CODEC_METHODS = {"sidco exp M=1", "sidco exp M=2", "sidco gpareto M=1", "sidco gpareto M=2",
                 "sidco gamma M=1", "sidco gamma M=2", "dgc", "topk"}


def _rows(main, argv, tmp_path):
    path = tmp_path / "rows.json"
    assert main(argv + ["--json", str(path)]) == 0
    return json.loads(path.read_text())


def _needs_torch():
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")


@pytest.mark.serial
def test_selection_rows_on_laplace_data(tmp_path):
    threads = numba.get_num_threads()
    n = 20000
    rows = _rows(selection.main, ["--elements", str(n), "--reps", "2",
                                  "--densities", "0.01", "0.002"], tmp_path)
    assert numba.get_num_threads() == threads  # the one-thread setting is undone
    assert len(rows) == 2 * (len(CODEC_METHODS) + 2)
    assert {r["method"] for r in rows} == CODEC_METHODS | {"argpartition", "copy"}
    for r in rows:
        assert SELECTION_KEYS <= set(r) and r["kind"] == "selection" and r["n"] == n
        assert r["data"] == "laplace" and r["threads"] == 1
        assert r["time_s"] > 0 and r["cpu_s"] >= 0 and r["speedup"] > 0
        assert r["k"] == math.ceil(r["density"] * n)
        if r["method"] == "argpartition":
            assert r["speedup"] == 1.0 and r["achieved_density"] == r["k"] / n
        elif r["method"] == "copy":
            assert r["achieved_density"] is None and r["config"] is None
        else:
            assert r["config"]["density"] == r["density"]
            if r["method"] == "topk":
                assert r["achieved_density"] == r["k"] / n
            # a fit may miss k, but never sends more than ceil(4k/3) (dgc: k); on the
            # Laplace data the fits assume, it lands well above half of k
            assert 0.5 * r["k"] / n <= r["achieved_density"] <= math.ceil(4 * r["k"] / 3) / n


def test_gradient_data_is_one_step_tiled_or_cut():
    grads = [[np.full(3, s, np.float32), np.arange(2, dtype=np.float32) + 10 * s]
             for s in range(4)]
    x, source, step = selection.gradient_data(12, grads)
    assert (source, step, x.dtype, x.size) == (5, 3, np.float32, 12)
    np.testing.assert_array_equal(x[:5], [3, 3, 3, 30, 31])
    np.testing.assert_array_equal(x[5:10], x[:5])
    np.testing.assert_array_equal(x[10:], x[:2])
    x, _, _ = selection.gradient_data(4, grads, step=1)
    np.testing.assert_array_equal(x, [1, 1, 1, 10])


@pytest.mark.serial
def test_selection_on_gradients_reports_steady_state_density(tmp_path):
    _needs_torch()
    n = 100000
    rows = _rows(selection.main, ["--data", "gradients", "--grad-steps", "6", "--elements",
                                  str(n), "--reps", "1", "--densities", "0.01"], tmp_path)
    timed = [r for r in rows if r["kind"] == "selection"]
    steady = [r for r in rows if r["kind"] == "steady_state"]
    assert len(timed) == len(CODEC_METHODS) + 2
    assert {r["method"] for r in steady} == CODEC_METHODS
    for r in timed:
        assert r["data"] == "gradients" and r["grad_step"] == 5 and r["n"] == n
        assert r["source_elements"] < n  # the MLP's gradient is tiled up to n
    for r in steady:
        assert r["density"] == 0.01 and r["steps"] == 6
        assert 0 <= r["kept_fraction"] <= 1 and 0 < r["bits_per_value"] < 32
        assert math.isfinite(r["running_error"])
    topk = next(r for r in steady if r["method"] == "topk")
    # per layer max(1, ceil(0.01 n)): at least the target, a little more for the tiny biases
    assert 0.01 <= topk["kept_fraction"] < 0.02


@pytest.mark.serial
def test_steady_rows_on_real_gradients(tmp_path):
    _needs_torch()
    rows = _rows(steady.main, ["--models", "cnn", "--steps", "6", "--zero-steps", "30",
                               "--codecs", '{"id": "topk", "density": 0.05}', "onebit"],
                 tmp_path)
    assert [(r["model"], r["codec"]) for r in rows] == [("cnn", "topk"), ("cnn", "onebit")]
    topk, onebit = rows
    assert topk["density_ratio"] == 1.0  # exactly k per layer: every layer has k nonzeros
    assert onebit["density_ratio"] is None
    for r in rows:
        assert 0 < r["bits_per_value"] < 32 and r["steps"] == 6 and r["zero_steps"] == 30
    # 30 zero steps at 5% deliver what top-k held after 6 gradient steps
    assert topk["err_grad"] > 0.1 and topk["err_zero"] < 1e-3


@pytest.mark.serial
def test_codecs_rows(tmp_path):
    n = 4096
    rows = _rows(bench_codecs.main, ["--threads", "1", "--elements", str(n), "--reps", "1",
                                     "--codecs", "fp16",
                                     '{"id":"topk","density":0.01}', '{"id":"thc","bits":4}'],
                 tmp_path)
    assert [r["codec"] for r in rows] == ["fp16", "topk", "thc"]
    for r in rows:
        assert set(r) == {"codec", "config", "n", "encode_gbs", "decode_gbs", "copy_gbs",
                          "bits_per_value", "threads"} and r["n"] == n and r["threads"] == 1
        assert all(0 < r[k] < math.inf for k in ("encode_gbs", "decode_gbs", "copy_gbs"))
    bits = {r["codec"]: r["bits_per_value"] for r in rows}
    header = 8 * 32 / n
    assert bits["fp16"] == pytest.approx(16 + header)
    assert 4 + header < bits["thc"] < 4.2  # 4-bit indices, header, THC's 24-byte body head
    assert 0.01 * 32 < bits["topk"] < 0.01 * 64 + 1  # 41 pairs of value + index bits


@pytest.mark.serial
def test_gradients_rows(tmp_path):
    _needs_torch()
    rows = _rows(gradients.main, ["--steps", "6", "--codecs", "3lc"], tmp_path)
    assert len(rows) == 1
    r = rows[0]
    assert r["codec"] == "3lc" and r["steps"] == 6
    assert 0 < r["kept_fraction"] <= 1
    assert 0 < r["bits_per_value"] < 32 and r["ratio"] == pytest.approx(32 / r["bits_per_value"])
    assert 0 <= r["running_error"] < math.inf


@pytest.mark.serial
def test_torch_digits_seeds_and_ddp_reference(tmp_path):
    _needs_torch()
    from ccl.bench import torch_digits

    path = tmp_path / "digits.json"
    assert torch_digits.main(["--epochs", "2", "--hidden", "16", "--seeds", "0", "3",
                              "--codecs", "none", "onebit", "--ddp-hooks", "none",
                              "--json", str(path)]) == 0
    out = json.loads(path.read_text())
    rows = {r["method"]: r for r in out["rows"]}
    assert list(rows) == ["ccl/none", "ccl/onebit", "ddp/none"]
    assert len(out["runs"]) == 6 and [r["seed"] for r in out["runs"]] == [0] * 3 + [3] * 3
    for name, row in rows.items():
        runs = [r for r in out["runs"] if r["method"] == name]
        assert row["seeds"] == [0, 3] and row["schedule"] == "cosine"
        assert row["final_accuracies"] == [r["final_accuracy"] for r in runs]
        assert row["final_accuracy"] == pytest.approx(np.mean(row["final_accuracies"]))
        assert len(row["accuracies"]) == len(row["losses"]) == 2
        assert 0 < row["final_accuracy"] <= 1
    # one rank, no compression: ccl's optimizer and DDP take the very same steps
    assert rows["ccl/none"]["final_accuracies"] == rows["ddp/none"]["final_accuracies"]
    assert rows["ccl/none"]["losses"] == rows["ddp/none"]["losses"]
    assert rows["ccl/onebit"]["bytes_sent"] == rows["ccl/none"]["bytes_sent"] == 0


@pytest.mark.serial
def test_lm_runs_every_method_on_stdlib_text(tmp_path):
    _needs_torch()
    from ccl.bench import lm

    text = lm.stdlib_text(20_000)
    assert text.size == 20_000 and np.array_equal(text, lm.stdlib_text(20_000))
    assert int(text.max()) < len(lm.VOCAB)
    path, png = tmp_path / "lm.json", tmp_path / "lm.png"
    assert lm.main(["--steps", "3", "--warmup", "1", "--eval-every", "2", "--val-windows", "8",
                    "--text-bytes", "40000", "--d-model", "16", "--codecs", "onebit",
                    "--json", str(path), "--plot", str(png)]) == 0
    rows = {r["method"]: r for r in json.loads(path.read_text())["rows"]}
    assert list(rows) == ["adamw", "do/onebit", "cadam/onebit", "ddp/adamw", "ddp/powersgd"]
    for row in rows.values():
        assert row["curve"]["step"] == [0, 2, 3]
        assert all(0 < loss < math.inf for loss in row["curve"]["val_loss"])
    # one rank: DDP's AdamW takes exact AdamW's steps, so it reaches its loss at the end
    assert rows["ddp/adamw"]["final_val_loss"] == pytest.approx(rows["adamw"]["final_val_loss"],
                                                              rel=1e-5)
    reach = rows["adamw"]["seconds_to_adamw_loss"]
    assert reach == rows["adamw"]["train_seconds"]
    assert rows["adamw"]["vs_ddp_adamw_time"] == reach / rows["ddp/adamw"]["train_seconds"]
    # two updates of exact AdamW (a one-step warm-up leaves CompressedAdam's variance rough)
    assert rows["adamw"]["final_val_loss"] < rows["adamw"]["curve"]["val_loss"][0]
    assert rows["adamw"]["bytes_per_step"] == 0 and png.stat().st_size > 0


@pytest.mark.serial
def test_lm_diloco_rows(tmp_path):
    _needs_torch()
    from ccl.bench import lm

    path = tmp_path / "lm.json"
    assert lm.main(["--steps", "6", "--eval-every", "3", "--val-windows", "8",
                    "--text-bytes", "40000", "--d-model", "16", "--methods", "adamw", "diloco",
                    "--diloco-codecs", "none", "topk", "sparseloco", "--sync-every", "3",
                    "--overlap", "1", "--outer-momentum", "0.5", "--sparse-block", "512",
                    "--error-decay", "0.9", "--json", str(path)]) == 0
    rows = {r["method"]: r for r in json.loads(path.read_text())["rows"]}
    assert list(rows) == ["adamw", "diloco/none", "diloco/topk", "diloco/sparseloco"]
    for name in ("diloco/none", "diloco/topk", "diloco/sparseloco"):
        curve = rows[name]["curve"]
        assert curve["step"] == [0, 3, 6]
        # evaluated on the global weights: the first outer step lands after step 4
        assert curve["val_loss"][1] == curve["val_loss"][0]
        assert curve["val_loss"][2] < curve["val_loss"][0]


def test_lm_time_to_a_loss_interpolates_between_evaluations():
    from ccl.bench.lm import seconds_to

    curve = {"seconds": [0.0, 10.0, 20.0], "val_loss": [4.0, 3.0, 2.0]}
    assert seconds_to(curve, 2.5) == 15.0 and seconds_to(curve, 3.0) == 10.0
    assert seconds_to(curve, 4.5) == 0.0 and seconds_to(curve, 1.9) is None


def test_decode_reencode_variant_is_thc_but_not_homomorphic():
    thc = get_codec("thc", bits=3)
    for stats, agreed in (("own", False), ("agreed", True)):
        variant = accuracy.decode_reencode(thc, stats)
        assert type(variant) is not type(thc) and isinstance(variant, type(thc))
        assert not variant.homomorphic and thc.homomorphic
        assert variant.codec_id == "thc" and variant.get_config() == thc.get_config()
        assert accuracy.agrees(variant) is agreed
        # the same payloads: the wire format is unchanged
        x = rank_input(0, 3000)
        np.testing.assert_array_equal(variant.encode(x), thc.encode(x))
    assert "thcDecodeReencode" not in registered_codecs()
    assert type(get_codec("thc")) is type(thc)
    sparse = get_codec("topk")
    assert accuracy.decode_reencode(sparse) is sparse
    with pytest.raises(ValueError, match="own"):
        accuracy.decode_reencode(thc, "local")


def _accuracy_rows(comm, tmp_path, extra):
    path = comm.bcast(str(tmp_path / "rows.json"), root=0)  # rank 0 writes, all read
    assert accuracy.main(["--codecs", '{"id":"thc","bits":4}', "--algorithms", "ring",
                          "--elements", "4096", "--steps", "3", "--json", path] + extra,
                         comm=comm) == 0
    comm.Barrier()
    with open(path) as f:
        rows = json.load(f)
    comm.Barrier()  # nobody leaves (and rank 0's tmp_path may go) before all have read
    return rows


@pytest.mark.mpi
@pytest.mark.max_ranks(3)
def test_accuracy_decode_reencode_rows(comm, tmp_path):
    (plain,) = _accuracy_rows(comm, tmp_path, [])
    (reenc,) = _accuracy_rows(comm, tmp_path, ["--decode-reencode"])
    assert plain["homomorphic"] is True and plain["agreed_stats"] is True
    assert reenc["homomorphic"] is False and reenc["agreed_stats"] is False
    for r in (plain, reenc):
        assert r["codec"] == "thc" and r["config"]["bits"] == 4 and r["ranks"] == comm.size
        assert r["algorithm"] == "ring" and r["steps"] == 3
        # 4-bit THC of normal data: an error well below the signal, and finite
        assert 0 < r["single_error"] < 0.5 and 0 < r["running_error"] < 0.5
    if comm.size > 1:
        # relays forward 4-bit indices instead of (at least 8-bit) integer lanes
        assert 0 < reenc["sent_bytes"] < plain["sent_bytes"]


@pytest.mark.mpi
def test_decode_reencode_results_agree_on_every_rank(comm):
    codec = accuracy.decode_reencode(get_codec("thc", bits=2))
    x = rank_input(comm.rank, 5000)
    y = ccl.compressed_allreduce(x, codec, comm=comm, algorithm="ring", key="t")
    assert_same_on_all_ranks(comm, y)
    assert np.isfinite(y).all()


@pytest.mark.serial
def test_report_targets_and_network_merge_from_recorded_rows(tmp_path):
    """The report's targets summary and its --only-network merge, on made-up rows (no runs)."""
    import argparse

    from tools.report import NETWORK_NOTE, merge_network, render, targets_table

    fit = dict(codec="3lc", algorithm="ring", segment_bytes=1 << 20, speedup=13.0, bound=1.1)
    auto = dict(codec="fp16", algorithm="auto", resolved="mpi", segment_bytes=None,
                speedup=0.5)
    lines = targets_table({"100mbit": [fit], "10gbit": [auto]}).splitlines()
    assert [line.rsplit("|", 2)[-2].strip() for line in lines[2:]] == ["met", "missed"]
    assert "`3lc` ≥ 12x" in lines[2] and "13.00x" in lines[2] and "auto→mpi" in lines[3]

    args = argparse.Namespace(rates=["1gbit"], ranks=4, quick=False, sizes=None)
    page = tmp_path / "benchmarks.md"
    page.write_text(render([("Allreduce on shared memory", "cmd shm", "shm text", "", None),
                            ("Emulated cluster: 4 hosts at 1gbit", "cmd old", "old", "", None)],
                           args, "then", 60))
    new = [("Emulated cluster: 4 hosts at 1gbit", "cmd new", "new", "| a |\n|---|", None)]
    merged = merge_network(page, new, args, "now", 120)
    assert "cmd old" not in merged and "cmd shm" in merged
    assert merged.index("cmd new") < merged.index("cmd shm")  # network sections first
    page.write_text(merged)
    assert merge_network(page, new, args, "now", 120).count(NETWORK_NOTE) == 1
