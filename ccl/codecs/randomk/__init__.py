"""The ``randomk`` codec: k values at indices every rank draws from a shared seed.

* :mod:`.codec`: the codec, its index sampler and numba kernels;
* ``_cuda.py``: the device twin (loaded by :mod:`ccl.codecs.device`).
"""

from .codec import RandomKCodec, randomk_indices

__all__ = ["RandomKCodec", "randomk_indices"]
