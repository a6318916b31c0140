"""``python -m ccl.bench.train``'s ``hvd/`` rows: a Horovod program's setup on ccl.torch.

Correctness only: no figure here is a speed.
"""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

STEPS, HIDDEN = 4, 32
METHODS = ["ddp/fp16", "hvd/fp16", "hvd/3lc"]
PARAMETERS = 64 * HIDDEN + HIDDEN + HIDDEN * HIDDEN + HIDDEN + HIDDEN * 10 + 10


@pytest.mark.mpi
@pytest.mark.max_ranks(3)
def test_horovod_rows_train_and_send_what_their_compression_sends(comm, tmp_path):
    import torch

    from ccl.bench import train

    threads = torch.get_num_threads()
    path = comm.bcast(str(tmp_path / "train.json"), root=0)
    try:
        assert train.main(["--hidden", str(HIDDEN), "--steps", str(STEPS), "--batch", "16",
                           "--eval-every", "1", "--warmup", "1", "--methods", *METHODS,
                           "--json", path], comm=comm) == 0
    finally:
        torch.set_num_threads(threads)
    comm.Barrier()
    with open(path) as f:
        rows = {r["method"]: r for r in json.load(f)["rows"]}
    comm.Barrier()
    # torch's PowerSGD hook always joins the comparison (the time-to-target reference)
    assert list(rows) == METHODS + ["ddp/powersgd"]
    ddp, fp16, threelc = rows["ddp/fp16"], rows["hvd/fp16"], rows["hvd/3lc"]
    # the same initial weights (broadcast from rank 0 as Horovod does) and batches
    assert fp16["losses"][0] == threelc["losses"][0] == pytest.approx(ddp["losses"][0])
    # fp16 averaging through ccl.torch and through DDP's fp16 hook: nearly the same steps
    assert fp16["losses"] == pytest.approx(ddp["losses"], rel=1e-2)
    assert fp16["bytes_source"] == threelc["bytes_source"] == "counted"
    assert fp16["compressed_buckets"] == fp16["buckets"]  # compression= always compresses
    if comm.size == 1:
        assert fp16["bytes_per_step"] == threelc["bytes_per_step"] == 0
        return
    ring = 2 * (comm.size - 1) / comm.size
    # half of the fp32 ring's bytes, plus payload headers
    assert ring * 2 * PARAMETERS <= fp16["bytes_per_step"] <= 1.1 * ring * 2 * PARAMETERS
    assert 0 < threelc["bytes_per_step"] < fp16["bytes_per_step"] / 2
    assert all(0 <= c[2] <= 1 for r in rows.values() for c in r["curve"])
