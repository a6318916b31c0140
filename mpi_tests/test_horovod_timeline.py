"""hvd.start_timeline / stop_timeline and HOROVOD_TIMELINE: one Chrome trace of every rank."""

import json
import os
import subprocess
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")

import ccl.torch as ct  # noqa: E402
from mpi_tests.helpers.launch import ROOT  # noqa: E402

# the torch layer above the collectives: 1-3 ranks (conftest.py says why)
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(3)]


def test_trace_holds_every_rank_and_phase(comm):
    ct.init(comm)
    try:
        path = ct.broadcast_object(tempfile.mkstemp(suffix=".json")[1]
                                   if ct.rank() == 0 else None)
        ct.start_timeline(path)
        ct.allreduce(torch.ones(3), name="traced.allreduce")
        ct.allgather(torch.ones(1), name="traced.allgather")
        ct.stop_timeline()
        ct.allreduce(torch.ones(3), name="not.traced")
        ct.stop_timeline()  # nothing recording: nothing written, no hang
        if ct.rank() == 0:
            with open(path) as f:
                events = json.load(f)["traceEvents"]
            os.unlink(path)
            names = {(e["pid"], e["name"]) for e in events if e["ph"] == "X"}
            for rank in range(ct.size()):
                assert (rank, "traced.allreduce") in names
                assert (rank, "traced.allgather") in names
                assert (rank, "NEGOTIATE") in names
            assert not any(e.get("name") == "not.traced" for e in events)
            assert all(e["dur"] >= 0 for e in events if e["ph"] == "X")
    finally:
        ct.shutdown()


def _spans_inside(events, outer):
    """The events of ``outer``'s rank and thread that lie within its time span."""
    end = outer["ts"] + outer["dur"]
    return [e for e in events if e["pid"] == outer["pid"] and e["tid"] == outer["tid"]
            and e is not outer and outer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= end + 1]


def _check_picture(path, steps):
    """python -m ccl.bench.timeline_plot finds the steps and draws one."""
    pytest.importorskip("matplotlib")
    from ccl.bench import timeline_plot

    events, rows = timeline_plot.load(path)
    assert len(rows) >= ct.size()
    first, last = timeline_plot.step_window(events, 0), timeline_plot.step_window(events)
    assert first[0] < first[1] <= last[0] < last[1]
    with pytest.raises(ValueError, match=f"holds {steps} step"):
        timeline_plot.step_window(events, steps)
    png = path + ".png"
    assert timeline_plot.main([path, "--png", png, "--step", "1"]) == 0
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    os.unlink(png)


@pytest.mark.parametrize("compression", ["fp16", "3lc"])
def test_training_steps_trace_measured_phases_of_every_rank(comm, compression):
    """A few DistributedOptimizer steps: every rank's buckets with their phases and bytes."""
    ct.init(comm)
    try:
        path = ct.broadcast_object(tempfile.mkstemp(suffix=".json")[1]
                                   if ct.rank() == 0 else None)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 10))
        codec = (ct.Compression.fp16 if compression == "fp16"
                 else ct.Compression.codec(compression))
        optimizer = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                            named_parameters=model.named_parameters(),
                                            compression=codec)
        ct.start_timeline(path)
        steps = 3
        for _ in range(steps):
            optimizer.zero_grad()
            model(torch.randn(8, 32)).sum().backward()
            optimizer.step()
        ct.stop_timeline()
        if ct.rank() != 0:
            return
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        _check_picture(path, steps)
        os.unlink(path)
        spans = [e for e in events if e["ph"] == "X"]
        names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
        assert names == {(r, f"rank {r}") for r in range(ct.size())}
        for rank in range(ct.size()):
            calls = [e for e in spans if e["pid"] == rank and e["cat"] == "allreduce"
                     and "collective" in e["args"]]
            assert len(calls) >= steps  # one per bucket and step
            for call in calls:
                args = call["args"]
                assert args["completed"] and args["codec"] == compression
                assert args["bytes"] > 0
                assert (args["bytes_sent"] > 0) == (ct.size() > 1)
                inside = {e["name"] for e in _spans_inside(spans, call)}
                assert {"NEGOTIATE", "ENCODE", "DECODE"} <= inside, inside
                if ct.size() > 1:
                    assert "WIRE" in inside
            encodes = [e for e in spans if e["pid"] == rank and e["name"] == "ENCODE"]
            # a compressing codec: its payloads are smaller than what it encodes
            assert 0 < sum(e["args"]["payload_bytes"] for e in encodes) \
                < sum(e["args"]["bytes"] for e in encodes)
    finally:
        ct.shutdown()


@pytest.mark.serial
@pytest.mark.parametrize("variable", ["CCL_TIMELINE", "HOROVOD_TIMELINE"])
def test_timeline_variable_records_codec_phases(tmp_path, variable):
    """The variable alone records from init to shutdown, the codec's phases included."""
    path = tmp_path / "trace.json"
    script = ("import torch, ccl.torch as hvd; hvd.init(); "
              "hvd.allreduce(torch.ones(64), name='x', "
              "compression=hvd.Compression.codec('fp16')); hvd.shutdown()")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    env[variable] = str(path)
    for name in ("PMI_SIZE", "PMI_RANK", "PMI_FD", "PMI_PORT", "HYDI_CONTROL_FD",
                 "CCL_TIMELINE", "HOROVOD_TIMELINE"):
        if name != variable:
            env.pop(name, None)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    names = {e["name"] for e in json.loads(path.read_text())["traceEvents"]}
    assert {"x", "x.0", "NEGOTIATE", "ENCODE", "DECODE"} <= names, names


@pytest.mark.serial
def test_horovod_timeline_variable_writes_at_shutdown(tmp_path):
    path = tmp_path / "trace.json"
    script = ("import torch, ccl.torch as hvd; hvd.init(); "
              "hvd.allreduce(torch.ones(2), name='x'); hvd.shutdown()")
    env = dict(os.environ, HOROVOD_TIMELINE=str(path),
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    for name in ("PMI_SIZE", "PMI_RANK", "PMI_FD", "PMI_PORT", "HYDI_CONTROL_FD"):
        env.pop(name, None)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    events = json.loads(path.read_text())["traceEvents"]
    assert any(e.get("name") == "x" and e["ph"] == "X" for e in events)
