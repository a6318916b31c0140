"""PowerSGD (Vogels et al., 2019) inside ``ccl.torch``: low-rank gradients, error feedback.

PowerSGD is not a codec: a codec compresses any chunk of any array on its
own, while PowerSGD needs a gradient's shape (it approximates each weight
matrix ``M``, ``n x m``, by ``P Q^T`` of rank ``r``) and two allreduces
that depend on each other. So it is a gradient-reduction *method* of
:func:`ccl.torch.DistributedOptimizer` and :func:`ccl.torch.ddp_comm_hook`,
chosen with ``codec="powersgd"`` (or ``{"id": "powersgd", "rank": 2, ...}``
or a :class:`PowerSGD`), and ``ccl.codecs.get_codec("powersgd")`` says so
instead of returning a codec.

One bucket's reduction, per weight matrix ``M`` (the gradient plus this
rank's residual):

1. ``Q`` (``m x r``, the same on every rank: the last step's averaged ``Q``,
   or seeded random numbers at the first compressed step) is orthonormalised;
   ``P = M Q``.
2. The ``P`` of every matrix of the bucket are summed over the ranks in one
   :meth:`ccl.Communicator.allreduce` with the **inner codec** (bf16 by
   default), then orthonormalised (Householder QR: rank-deficient ``P`` give
   no NaN, unlike Gram-Schmidt).
3. ``Q = M^T P`` of every matrix, averaged in a second allreduce (inner
   codec); the result is ``P Q^T``, and ``M - P Q^T`` is this rank's new
   residual, so the inner codec's rounding is fed back too.

The allreduces of ``P`` and ``Q`` are keyed ``"<bucket key>/P"`` and
``"/Q"``: an inner codec with error feedback of its own (thc) keeps its
residuals there, and a checkpoint of the communicator keeps their steps
(which seed a codec's shared randomness).

Vectors and matrices too small to gain ``min_compression_rate`` are averaged
exactly (the MPI library's ``Allreduce``) and keep no residual. The first
``warmup_steps`` steps are averaged exactly, as in ``torch``'s hook.
"""

import zlib

import torch

from ..codecs import get_codec
from .engine import Job
from .functions import from_array, to_array

__all__ = ["PowerSGD", "PowerSGDJob", "powersgd_method", "bucket_of", "METHOD_ID", "FACTORS",
           "SETTINGS"]

#: The id that selects PowerSGD where a codec is expected.
METHOD_ID = "powersgd"
#: Suffixes of the keys that a bucket's ``P`` and ``Q`` are allreduced under.
FACTORS = ("/P", "/Q")
#: The settings of :class:`PowerSGD` (its ``get_config()`` less the id).
SETTINGS = ("rank", "inner", "warmup_steps", "min_compression_rate", "warm_start", "seed")


def _int(name, value, low):
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"PowerSGD's {name} must be an int >= {low}, got {value!r}")
    return value


class PowerSGD:
    """PowerSGD's settings and state: warm-start ``Q`` and residuals, per bucket.

    Pass it (or ``"powersgd"``, or ``{"id": "powersgd", **settings}``) as the
    ``codec`` of :func:`ccl.torch.DistributedOptimizer` or
    :func:`ccl.torch.ddp_comm_hook`; each of them uses a fresh copy of the
    settings, so one instance may configure several.

    Parameters
    ----------
    rank : int
        Rank ``r`` of the approximation of each matrix (capped at its
        smaller side, where it is exact). ``torch``'s hook defaults to 1;
        4 is the rank of its comparison in ``python -m ccl.bench.train``.
    inner : Codec, str, dict or None
        The codec ``P`` and ``Q`` travel with (:func:`ccl.codecs.get_codec`).
        Default ``"bf16"``: half the bytes of float32 with float32's range
        (sums of ``P`` cannot overflow as with fp16), and its rounding goes
        into the residual. ``"none"`` sends float32, as ``torch``'s hook.
    warmup_steps : int
        Steps averaged exactly before compression starts (``torch``'s
        ``start_powerSGD_iter``, which defaults to 1000).
    min_compression_rate : float
        A matrix is compressed only if ``(n + m) r`` times this is below
        ``n m`` (as in ``torch``'s hook); 0 compresses every matrix.
    warm_start : bool
        Start each step's power iteration from the last step's ``Q``.
    seed : int
        Seed of the random starting ``Q`` (the same on every rank).

    Raises
    ------
    ValueError, TypeError
        Bad settings.

    Examples
    --------
    >>> from ccl.torch import PowerSGD
    >>> PowerSGD(rank=2).get_config()["inner"]
    {'id': 'bf16'}
    """

    def __init__(self, rank=4, inner="bf16", warmup_steps=2, min_compression_rate=2.0,
                 warm_start=True, seed=0):
        self.rank = _int("rank", rank, 1)
        if isinstance(inner, (str, dict)) and powersgd_method(inner) is not None:
            raise ValueError("PowerSGD's inner codec cannot be PowerSGD itself; use a codec "
                             "such as 'bf16', 'fp16', 'thc' or 'none'")
        self.inner = get_codec(inner)
        self.warmup_steps = _int("warmup_steps", warmup_steps, 0)
        rate = min_compression_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate >= 0 \
                or rate == float("inf"):
            raise ValueError(f"PowerSGD's min_compression_rate must be a finite number >= 0, "
                             f"got {rate!r}")
        self.min_compression_rate = float(rate)
        if not isinstance(warm_start, bool):
            raise TypeError(f"PowerSGD's warm_start must be True or False, got {warm_start!r}")
        self.warm_start = warm_start
        self.seed = _int("seed", seed, 0)
        self.q = {}  # bucket key -> the last step's averaged Q of its matrices, flat
        self.residuals = {}  # bucket key -> this rank's residual, flat as the bucket

    def get_config(self):
        """The settings, as a dict that ``codec=`` accepts (``"id": "powersgd"``).

        Returns
        -------
        dict
        """
        return {"id": METHOD_ID, "rank": self.rank, "inner": self.inner.get_config(),
                "warmup_steps": self.warmup_steps,
                "min_compression_rate": self.min_compression_rate,
                "warm_start": self.warm_start, "seed": self.seed}

    def __repr__(self):
        settings = {k: v for k, v in self.get_config().items() if k != "id"}
        return f"PowerSGD({', '.join(f'{k}={v!r}' for k, v in settings.items())})"

    # ------------------------------------------------------------------ layout
    def _ranks(self, shapes):
        """Per tensor of a bucket: ``(n, m, r)`` if it is compressed, else None."""
        out = []
        for shape in shapes:
            n = shape[0] if len(shape) > 1 else 0
            m = int(torch.Size(shape).numel()) // n if n else 0
            r = min(self.rank, n, m)
            worth = r > 0 and (n + m) * r * self.min_compression_rate < n * m
            out.append((n, m, r) if worth else None)
        return out

    def _start_q(self, key, step, sizes, like):
        """Orthonormal starting ``Q`` of every matrix: warm, or seeded by key and step."""
        warm = self.q.get(key) if self.warm_start else None
        if warm is None or warm.numel() != sum(m * r for m, r in sizes):
            # the same numbers on every rank, and after a checkpoint: no generator state
            seed = (self.seed * 1_000_003 + zlib.crc32(str(key).encode()) + step) % 2**63
            generator = torch.Generator().manual_seed(seed)
            warm = torch.randn(sum(m * r for m, r in sizes), generator=generator,
                               dtype=like.dtype).to(like.device)
        qs, at = [], 0
        for m, r in sizes:
            qs.append(_orthonormal(warm[at:at + m * r].view(m, r)))
            at += m * r
        return qs

    # --------------------------------------------------------------- reduction
    def reduce(self, communicator, key, flat, shapes, step, op="mean"):
        """Reduce one bucket (collective on ``communicator``; every rank, same order).

        Parameters
        ----------
        communicator : ccl.Communicator
            Carries the allreduces (its algorithm; ``P`` and ``Q`` with the
            inner codec, keyed ``key + "/P"`` and ``key + "/Q"``).
        key : str
            The bucket's name: its residual and ``Q`` are kept under it.
        flat : torch.Tensor
            This rank's gradients of the bucket, 1-D (not modified).
        shapes : sequence of torch.Size
            The shapes of the tensors ``flat`` holds, in order.
        step : int
            Steps completed (the first ``warmup_steps`` are exact).
        op : {"mean", "sum"}
            Average or sum over the ranks.

        Returns
        -------
        torch.Tensor
            The reduced bucket, 1-D, the same on every rank.
        """
        if step < self.warmup_steps:
            return _exact(communicator, flat, op)
        residual = self.residuals.get(key)
        work = flat + residual if residual is not None and residual.shape == flat.shape \
            else flat.clone()
        bounds = [0]
        for shape in shapes:
            bounds.append(bounds[-1] + int(torch.Size(shape).numel()))

        def part(tensor, i):
            return tensor[bounds[i]:bounds[i + 1]]

        ranks = self._ranks(shapes)
        plain = [i for i, r in enumerate(ranks) if r is None]
        low = [i for i, r in enumerate(ranks) if r is not None]
        out = torch.empty_like(work)
        if plain:  # exact and without residual (torch's hook leaves each rank's deviation)
            summed = _exact(communicator, torch.cat([part(work, i) for i in plain]), op)
            at = 0
            for i in plain:
                size = bounds[i + 1] - bounds[i]
                part(out, i).copy_(summed[at:at + size])
                part(work, i).zero_()
                at += size
        if low:
            matrices = [part(work, i).view(ranks[i][0], ranks[i][1]) for i in low]
            approx = self._low_rank(communicator, key, step, matrices, [ranks[i] for i in low])
            factor = communicator.size if op == "sum" else 1
            for i, a in zip(low, approx):
                part(out, i).copy_(a.reshape(-1) * factor)
                part(work, i).sub_(a.reshape(-1))  # what the mean missed: the residual
            self.residuals[key] = work
        return out

    def _low_rank(self, communicator, key, step, matrices, ranks):
        """The allreduces of ``P`` and ``Q``: each matrix's approximation of the mean."""
        qs = self._start_q(key, step, [(m, r) for _, m, r in ranks], matrices[0])
        ps = [a @ q for a, q in zip(matrices, qs)]
        p_sum = _inner(communicator, self.inner, torch.cat([p.reshape(-1) for p in ps]),
                       key + FACTORS[0])
        ps = [_orthonormal(p) for p in _split(p_sum, [(n, r) for n, _, r in ranks])]
        qs = [a.T @ p for a, p in zip(matrices, ps)]
        q_sum = _inner(communicator, self.inner, torch.cat([q.reshape(-1) for q in qs]),
                       key + FACTORS[1])
        self.q[key] = q_mean = q_sum / communicator.size
        return [p @ q.T for p, q in zip(ps, _split(q_mean, [(m, r) for _, m, r in ranks]))]

    # ------------------------------------------------------------------- state
    def state_dict(self, keys=None):
        """The warm-start ``Q`` and residuals (of ``keys`` only, if given), as tensors.

        Parameters
        ----------
        keys : collection of str, optional
            The bucket keys to save (default: all).

        Returns
        -------
        dict
            ``config``, ``q`` and ``residuals`` (``{bucket key: tensor}``).
        """
        def pick(table):
            return {k: v.detach().clone() for k, v in table.items() if keys is None or k in keys}

        return {"config": self.get_config(), "q": pick(self.q),
                "residuals": pick(self.residuals)}

    def check_state(self, state):
        """Raise ``ValueError`` unless ``state`` is a :meth:`state_dict` of these settings.

        Parameters
        ----------
        state : dict
            What :meth:`state_dict` returned (possibly after ``torch.load``).

        Raises
        ------
        ValueError
            If it is not one, or was saved with other settings.
        """
        try:
            config, q, residuals = state["config"], state["q"], state["residuals"]
        except (KeyError, TypeError):
            raise ValueError("not a PowerSGD state (what PowerSGD.state_dict() "
                             "returns)") from None
        if config != self.get_config() or not isinstance(q, dict) \
                or not isinstance(residuals, dict):
            raise ValueError(f"the state was saved with PowerSGD settings {config!r}, this "
                             f"one uses {self.get_config()!r}")

    def load_state_dict(self, state, own=True):
        """Load a checked :meth:`state_dict`; residuals too if ``own`` (saved by this rank).

        Parameters
        ----------
        state : dict
            What :meth:`state_dict` returned, checked by :meth:`check_state`.
        own : bool
            Whether this rank saved it: residuals are per rank and start
            from zero otherwise, while ``Q``, the same on every rank, loads
            from any rank's state.
        """
        self.q = {k: v.detach().clone() for k, v in state["q"].items()}
        self.residuals = {k: v.detach().clone() for k, v in state["residuals"].items()} \
            if own else {}

    def keep(self, keys):
        """Forget the ``Q`` and residuals of buckets not in ``keys`` (DDP rebuilt them).

        Parameters
        ----------
        keys : collection of str
            The bucket keys still in use.
        """
        self.q = {k: v for k, v in self.q.items() if k in keys}
        self.residuals = {k: v for k, v in self.residuals.items() if k in keys}


def _orthonormal(a):
    """Orthonormal columns spanning ``a``'s (Householder QR: deterministic, no NaN)."""
    return torch.linalg.qr(a, mode="reduced")[0]


def _split(flat, shapes):
    out, at = [], 0
    for n, r in shapes:
        out.append(flat[at:at + n * r].view(n, r))
        at += n * r
    return out


def _exact(communicator, x, op):
    """The MPI library's exact allreduce of a tensor (counted in the communicator's stats)."""
    x = x.contiguous()
    result = communicator.allreduce(to_array(x), codec="none", algorithm="auto", op=op)
    return from_array(result, like=x)


def _inner(communicator, codec, x, key):
    """The sum of ``x`` over the ranks, sent with PowerSGD's inner codec under ``key``.

    Keyed, so that the codec's shared randomness follows the key's steps, which
    a checkpoint keeps (a keyless call's follows the communicator's calls).
    """
    x = x.contiguous()
    return from_array(communicator.allreduce(to_array(x), key=key, codec=codec, op="sum"),
                      like=x)


def bucket_of(key):
    """The bucket key a key of the communicator belongs to (itself, or P's or Q's owner)."""
    for suffix in FACTORS:
        if isinstance(key, str) and key.endswith(suffix):
            return key[:-len(suffix)]
    return key


def powersgd_method(codec):
    """A fresh :class:`PowerSGD` if ``codec`` selects it, else None.

    Parameters
    ----------
    codec : object
        What a ``codec=`` argument got: ``"powersgd"``, ``{"id": "powersgd",
        ...}`` or a :class:`PowerSGD` select it.

    Returns
    -------
    PowerSGD or None

    Raises
    ------
    ValueError, TypeError
        Bad PowerSGD settings.
    """
    if isinstance(codec, PowerSGD):
        settings = codec.get_config()
    elif isinstance(codec, str) and codec.lower() == METHOD_ID:
        settings = {}
    elif isinstance(codec, dict) and str(codec.get("id", "")).lower() == METHOD_ID:
        settings = codec
    else:
        return None
    settings = {k: v for k, v in settings.items() if k != "id"}
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise ValueError(f"PowerSGD has no setting(s) {unknown}; its settings: "
                         f"{', '.join(SETTINGS)}")
    return PowerSGD(**settings)


class PowerSGDJob(Job):
    """One bucket's PowerSGD reduction, run by the :class:`~ccl.torch.engine.Engine`."""

    __slots__ = ("method", "flat", "shapes", "step", "op")

    def __init__(self, method, flat, key, shapes, step, op="mean", on_done=None):
        super().__init__(None, key, on_done=on_done)
        self.method, self.flat, self.shapes, self.step, self.op = method, flat, shapes, step, op

    def reduce(self, communicator):
        """The bucket's reduction (:meth:`PowerSGD.reduce`), as an array."""
        return to_array(self.method.reduce(communicator, self.key, self.flat, self.shapes,
                                           self.step, self.op))
