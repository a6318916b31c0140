"""numba kernels of the ``randomk`` codec: Floyd's sorted draw of the indices, gather, scatter."""

import numpy as np

from ..._jit import njit, prange
from .._shared_kernels import sized_kernel, uniform_below

__all__ = ["popcount", "sample_sorted", "gather_unscaled", "gather", "scatter"]

_BLOCK_WORDS = 1024  # 65536 candidate indices per parallel block of the bitmap scan
_ONE = np.uint64(1)
_SIX = np.uint64(6)
_LOW6 = np.uint64(63)


@njit
def popcount(w):
    # SWAR population count; LLVM turns this idiom into one popcnt instruction.
    w = w - ((w >> np.uint64(1)) & np.uint64(0x5555555555555555))
    w = (w & np.uint64(0x3333333333333333)) + ((w >> np.uint64(2)) & np.uint64(0x3333333333333333))
    w = (w + (w >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return (w * np.uint64(0x0101010101010101)) >> np.uint64(56)


@sized_kernel(size_arg=1)
def sample_sorted(seed, d, k, out):
    """Write ``k`` distinct indices drawn uniformly from ``[0, d)`` into ``out``, ascending."""
    invert = 2 * k > d
    m = d - k if invert else k
    nwords = (d + 63) // 64
    words = np.zeros(nwords, dtype=np.uint64)
    # Floyd: for j = d-m .. d-1 pick t uniform in [0, j]; if t is taken, take j instead.
    # Every m-subset comes out with equal probability.
    first = d - m
    for c in range(m):
        j = np.uint64(first + c)
        t = uniform_below(seed, c, j + _ONE)
        if (words[t >> _SIX] >> (t & _LOW6)) & _ONE:
            t = j
        words[t >> _SIX] |= _ONE << (t & _LOW6)
    if invert:
        for w in prange(nwords):
            words[w] = ~words[w]
        if d % 64:
            words[nwords - 1] &= (_ONE << np.uint64(d % 64)) - _ONE
    nblocks = (nwords + _BLOCK_WORDS - 1) // _BLOCK_WORDS
    offsets = np.zeros(nblocks + 1, dtype=np.int64)
    for b in prange(nblocks):
        count = 0
        for w in range(b * _BLOCK_WORDS, min((b + 1) * _BLOCK_WORDS, nwords)):
            count += popcount(words[w])
        offsets[b + 1] = count
    for b in range(nblocks):
        offsets[b + 1] += offsets[b]
    for b in prange(nblocks):
        pos = offsets[b]
        for w in range(b * _BLOCK_WORDS, min((b + 1) * _BLOCK_WORDS, nwords)):
            word = words[w]
            while word:
                low = word & (~word + _ONE)
                out[pos] = 64 * w + np.int64(popcount(low - _ONE))
                pos += 1
                word ^= low


@sized_kernel(size_arg=1)
def gather(x, idx, factor, out):
    for i in prange(idx.size):
        out[i] = x[idx[i]] * factor


@sized_kernel(size_arg=1)
def gather_unscaled(x, idx, out):
    for i in prange(idx.size):
        out[i] = x[idx[i]]


@sized_kernel(size_arg=1)
def scatter(values, idx, out):
    for i in prange(idx.size):
        out[idx[i]] = values[i]
