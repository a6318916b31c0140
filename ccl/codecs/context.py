"""What a codec is told about the encode at hand: :class:`CodecContext`, and input checks.

Collectives build one context per encode (step, key, chunk, rank, agreed
statistics, expected element count); the seeds derived from it make shared
randomness agree on every rank without communication.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Hashable

import numpy as np

from .._xp import backend_of
from ._shared_kernels import masked_max

__all__ = ["CodecContext", "all_finite"]


def _seed_words(value):
    """Map an int, str or None to a 32-bit word for seeding, identically on every rank."""
    if value is None:
        return 0
    if isinstance(value, (int, np.integer)):
        return int(value) & 0xFFFFFFFF
    return zlib.crc32(str(value).encode("utf-8"))


@dataclass(frozen=True)
class CodecContext:
    """Where an encode happens: what a codec needs to seed and agree.

    Collectives build one per encode; standalone ``codec.encode(x)`` uses the
    default (step 0, rank 0, no agreed parameters).

    Attributes
    ----------
    step : int
        Call counter of the key (or of the communicator for keyless calls).
    key : str or None
        The user's key for this tensor.
    chunk : int
        Which chunk of the tensor is being encoded.
    rank : int
        The encoding rank (seeds per-rank randomness such as stochastic rounding).
    shared : numpy.ndarray or None
        For codecs with :meth:`Codec.shared_stats`: this chunk's statistics
        reduced with MAX over all ranks. ``None`` means "use the local ones".
    n : int or None
        The element count the receiver expects; a payload claiming another
        count is a :class:`ccl.PayloadError` before anything is allocated.

    Parameters
    ----------
    step, key, chunk, rank, shared, n
        The attributes above (all optional).

    Examples
    --------
    >>> from ccl.codecs import CodecContext
    >>> a, b = CodecContext(step=3, key="w", chunk=1), CodecContext(step=3, key="w", chunk=1)
    >>> a.seed(42) == b.seed(42)                       # shared randomness agrees
    True
    >>> a.seed(42, per_rank=True) == CodecContext(step=3, key="w", chunk=1, rank=1).seed(
    ...     42, per_rank=True)
    False
    """

    step: int = 0
    key: Hashable | None = None
    chunk: int = 0
    rank: int = 0
    shared: np.ndarray | None = field(default=None, compare=False)
    n: int | None = None

    def seed(self, base_seed: int, per_rank: bool = False) -> int:
        """Return a 64-bit seed derived from ``(base_seed, step, key, chunk[, rank])``.

        The same arguments give the same seed on every rank, so shared
        randomness (rotations, random-k indices) agrees without
        communication; ``per_rank=True`` mixes in the rank for independent
        draws (stochastic rounding).

        Parameters
        ----------
        base_seed : int, str or None
            The codec's configured seed.
        per_rank : bool
            Mix in ``rank``.

        Returns
        -------
        int
            A non-negative 63-bit seed.
        """
        words = [_seed_words(base_seed), _seed_words(self.step), _seed_words(self.key),
                 _seed_words(self.chunk), (self.rank + 1) if per_rank else 0]
        state = np.random.SeedSequence(words).generate_state(2, dtype=np.uint32)
        return (int(state[0]) | (int(state[1]) << 32)) & 0x7FFFFFFFFFFFFFFF

    def rng(self, base_seed: int, per_rank: bool = False) -> np.random.Generator:
        """Return a numpy ``Generator`` seeded by :meth:`seed`.

        Parameters
        ----------
        base_seed : int, str or None
            The codec's configured seed.
        per_rank : bool
            Mix in ``rank``.

        Returns
        -------
        numpy.random.Generator
            A Philox generator.
        """
        return np.random.Generator(np.random.Philox(self.seed(base_seed, per_rank)))


_EXPONENT_MASKS = {np.dtype(np.float32): (np.uint32, np.uint32(0x7F800000)),
                   np.dtype(np.float64): (np.uint64, np.uint64(0x7FF0000000000000))}


def all_finite(x):
    """Return True when the 1-D float array ``x`` (host or device) holds no NaN or Inf."""
    if x.size == 0:
        return True
    be = backend_of(x)
    if be.device:
        return be.all_finite(x)
    masks = _EXPONENT_MASKS.get(x.dtype)
    if masks is None:
        return bool(np.isfinite(x).all())
    view, mask = masks
    # the exponent field is all ones exactly for NaN and Inf
    return masked_max(x.view(view), mask) != mask
