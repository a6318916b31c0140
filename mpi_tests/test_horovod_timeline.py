"""hvd.start_timeline / stop_timeline and HOROVOD_TIMELINE: one Chrome trace of every rank."""

import json
import os
import subprocess
import sys
import tempfile

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")

import ccl.torch as ct  # noqa: E402
from conftest import ROOT  # noqa: E402

pytestmark = pytest.mark.mpi


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


@pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="serial test: runs its own process")
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
