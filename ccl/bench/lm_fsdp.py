"""``python -m ccl.bench.lm --fsdp``: the LM benchmark's model sharded with FSDP2, ccl inside.

The benchmark's causal transformer is ``fully_shard``-ed per block (and as a
whole) on a gloo group and trained with AdamW, the same batches, schedule
and initial weights in every row of one run:

- ``fsdp2``: FSDP2 as it is (gloo's reduce-scatter and all-gather, fp32);
- ``fsdp/<codec>``: :func:`ccl.torch.fsdp_compress` with that gradient codec
  (``none``: ccl's exact reduce-scatter), weights gathered by FSDP;
- ``fsdp/<codec>+<weights>``: the same with ccl's all-gather of the weights
  with the codec ``<weights>`` (``--fsdp-rows thc+bf16``).

Bytes are this rank's payload bytes per step. ccl counts its own; FSDP's
collectives are counted by wrappers of torch's own (``Counted*`` below) as
a ring moves them, ``(p - 1) / p`` of the buffer, as ccl counts the MPI
library's. Reported per row: the final validation loss and its ratio to
``fsdp2``'s, the training time, the time to ``fsdp2``'s final loss, the
gradient and total bytes per step and their ratios to ``fsdp2``'s.
"""

import json

__all__ = ["FSDP_ROWS", "add_arguments", "main_fsdp"]

FSDP_ROWS = ("none", "thc", "3lc", "thc+bf16")


def add_arguments(parser):
    """Add the FSDP options to ``python -m ccl.bench.lm``'s parser."""
    parser.add_argument("--fsdp", action="store_true",
                        help="run the FSDP2 rows instead (fsdp2, then --fsdp-rows)")
    parser.add_argument("--fsdp-rows", nargs="+", default=list(FSDP_ROWS),
                        help="gradient codec[+weights codec] of each fsdp/ row")
    parser.add_argument("--reshard-after-forward", type=int, choices=(0, 1), default=1,
                        help="FSDP2's reshard_after_forward (1: weights gathered again "
                             "for backward)")


def _counted():
    """torch's default FSDP collectives, counting what a ring would send."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import (DefaultAllGather,
                                                                       DefaultReduceScatter)

    class Counter:
        gradients = weights = 0

    counter = Counter()

    class CountedReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            p = group.size()
            counter.gradients += input_tensor.numel() * input_tensor.element_size() * (p - 1) // p
            return super().__call__(output_tensor, input_tensor, group, op, async_op)

    class CountedAllGather(DefaultAllGather):
        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            p = group.size()
            counter.weights += input_tensor.numel() * input_tensor.element_size() * (p - 1)
            return super().__call__(output_tensor, input_tensor, group, async_op)

    return counter, CountedReduceScatter, CountedAllGather


def _row(comm, spec, data, args, make_model, train):
    """Train one row: ``None`` for ``fsdp2``, else ``"<codec>[+<weights>]"``."""
    import torch
    from torch.distributed.fsdp import FSDPModule, fully_shard

    import ccl.torch as ct

    model = make_model(args)
    reshard = bool(args.reshard_after_forward)
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    counter, reduce_scatter, all_gather = _counted()
    fsdp_modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    codec, weights = (spec.split("+") + [None])[:2] if spec else (None, None)
    state = None
    if spec is not None:  # the default algorithm, auto
        state = ct.fsdp_compress(model, codec=codec, all_gather_codec=weights,
                                 min_compress_bytes=args.min_compress_bytes)
    for m in fsdp_modules:  # what ccl does not send, FSDP sends: counted
        if spec is None:
            m.set_custom_reduce_scatter(reduce_scatter())
        if weights is None:
            m.set_custom_all_gather(all_gather())

    def stats():
        ours = {} if state is None else state.stats()
        gradients = counter.gradients + ours.get("bytes_gradients", 0)
        total = gradients + counter.weights + ours.get("bytes_weights", 0)
        return {"bytes_sent": total, "bytes_gradients": gradients}

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98),
                            weight_decay=args.weight_decay)
    row = train(comm, "fsdp2" if spec is None else f"fsdp/{spec}", model, opt, data, args,
                stats)
    row["gradient_bytes_per_step"] = comm.bcast(stats()["bytes_gradients"] / args.steps)
    return row


def _table(rows, seconds_to):
    exact = rows[0]
    lines = [f"{'method':<18} {'val loss':>8} {'vs fsdp2':>8} {'train s':>8} "
             f"{'step vs fsdp2':>13} {'to fsdp2 loss s':>15} {'grad KB/step':>12} "
             f"{'vs fsdp2':>8} {'total KB/step':>13} {'vs fsdp2':>8}"]
    for r in rows:
        reach = seconds_to(r["curve"], exact["final_val_loss"])
        grad, total = r["gradient_bytes_per_step"], r["bytes_per_step"]
        lines.append(
            f"{r['method']:<18} {r['final_val_loss']:8.4f} "
            f"{r['final_val_loss'] / exact['final_val_loss']:8.3f} {r['train_seconds']:8.1f} "
            f"{r['train_seconds'] / exact['train_seconds']:12.2f}x "
            f"{'-' if reach is None else f'{reach:.1f}':>15} {grad / 1e3:12.1f} "
            f"{grad / exact['gradient_bytes_per_step']:7.3f}x {total / 1e3:13.1f} "
            f"{total / exact['bytes_per_step']:7.3f}x")
        r["seconds_to_fsdp2_loss"] = reach
    return "\n".join(lines)


def main_fsdp(comm, data, args, make_model, train, seconds_to, title):
    """Run ``fsdp2`` and the ``--fsdp-rows``; print the table, write ``--json`` (rank 0)."""
    import ccl.torch as ct

    from .gloo import gloo_group

    rows = []
    ct.init(comm)
    try:
        for spec in [None] + list(args.fsdp_rows):
            with gloo_group(comm):  # a group per row: nothing of one run reaches the next
                rows.append(_row(comm, spec, data, args, make_model, train))
    finally:
        ct.shutdown()
    if comm.rank == 0:
        print(_table(rows, seconds_to))
        print(f"({title}; FSDP2 per block, reshard_after_forward "
              f"{bool(args.reshard_after_forward)}, AdamW lr {args.lr} cosine to 10%, "
              f"min_compress_bytes {args.min_compress_bytes})")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"title": title, "args": vars(args), "rows": rows}, f, indent=1)
    return 0
