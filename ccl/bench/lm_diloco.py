"""The ``diloco/<codec>`` rows of ``python -m ccl.bench.lm``: DiLoCo with compressed outer syncs.

Each row trains the benchmark's model with :class:`ccl.torch.DiLoCo`: the
same AdamW, learning rate and schedule as the other rows as the inner
optimizer, an outer Nesterov step every ``--sync-every`` inner steps on the
pseudo-gradient averaged with that codec (``none``: uncompressed, the exact
DiLoCo to compare the codecs with; ``sparseloco``: top-k at
``--sparse-density`` with the kept values in 2 bits and error feedback,
SparseLoCo's compressor; ``topk``: the same top-k with float32 values).
Evaluations use the global weights (the outer model, as of each fragment's
last outer step); the outer steps still in flight are applied after the last
inner step, before the final evaluation. Compressed rows use the algorithm that fits the codec
(:func:`ccl.collectives.auto.fitting`), ``none`` the ring.

``python -m ccl.bench.lm_summary lm.json`` compares the rows on the loss
every one of them reaches (:mod:`ccl.bench.lm_summary`).
"""

from ccl.codecs import get_codec
from ccl.collectives.auto import fitting

__all__ = ["DILOCO_CODECS", "add_arguments", "run_diloco"]

DILOCO_CODECS = ("none", "thc", "sparseloco")


def add_arguments(parser):
    """Add the DiLoCo options to ``python -m ccl.bench.lm``'s parser."""
    parser.add_argument("--diloco-codecs", nargs="+", default=list(DILOCO_CODECS),
                        help="codecs of the diloco/ rows (none: exact DiLoCo)")
    parser.add_argument("--sync-every", type=int, default=20, help="DiLoCo's H")
    parser.add_argument("--outer-lr", type=float, default=0.7)
    parser.add_argument("--outer-momentum", type=float, default=0.9)
    parser.add_argument("--fragments", type=int, default=1)
    parser.add_argument("--overlap", type=int, default=None,
                        help="delay of the outer steps in inner steps (default: DiLoCo's "
                             "overlap=True)")
    parser.add_argument("--error-decay", type=float, default=1.0,
                        help="DiLoCo's error_decay (SparseLoCo's beta; 1: no decay)")
    parser.add_argument("--sparse-density", type=float, default=0.02,
                        help="density of diloco/topk, diloco/sidco and diloco/sparseloco")
    parser.add_argument("--sparse-block", type=int, default=None,
                        help="block of diloco/sparseloco's top-k (default: the whole chunk)")


def codec_of(spec, args):
    """The codec of ``diloco/<spec>`` (None for ``none``)."""
    if spec == "none":
        return None
    if spec == "sparseloco":
        return get_codec(spec, density=args.sparse_density, block=args.sparse_block)
    if spec in ("topk", "sidco"):
        return get_codec(spec, density=args.sparse_density)
    return get_codec(spec)


def run_diloco(comm, data, args, make_model, train):
    """One row per ``--diloco-codecs`` entry, trained by the benchmark's ``train``."""
    import torch

    import ccl.torch as ct

    class GlobalEval(torch.nn.Module):
        """The model in training, its global weights in evaluation."""

        def __init__(self, model, opt):
            super().__init__()
            self.model, self.opt = model, opt

        def forward(self, x):
            if self.training:
                return self.model(x)
            weights = dict(self.opt.global_parameters())
            return torch.func.functional_call(self.model, weights, (x,))

    class Flushing:
        """The optimizer ``train`` steps: DiLoCo, flushed after the last inner step."""

        def __init__(self, opt):
            self.opt, self.param_groups = opt, opt.param_groups

        def zero_grad(self):
            self.opt.zero_grad()

        def step(self):
            self.opt.step()
            if self.opt.communication_stats()["step"] == args.steps:
                self.opt.flush()

    rows = []
    ct.init(comm)
    try:
        for spec in args.diloco_codecs:
            model = make_model(args)
            inner = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98),
                                      weight_decay=args.weight_decay)
            codec = codec_of(spec, args)
            opt = ct.DiLoCo(model, inner, sync_every=args.sync_every, outer_lr=args.outer_lr,
                            outer_momentum=args.outer_momentum, codec=codec,
                            fragments=args.fragments,
                            overlap=True if args.overlap is None else args.overlap,
                            algorithm="ring" if codec is None else fitting(codec),
                            min_compress_bytes=args.min_compress_bytes,
                            error_decay=args.error_decay)
            rows.append(train(comm, f"diloco/{spec}", GlobalEval(model, opt), Flushing(opt),
                              data, args, opt.communication_stats, settle=opt.synchronize))
    finally:
        ct.shutdown()
    return rows

