"""The ``dithering`` codec: unbiased stochastic rounding to ``s`` levels.

* :mod:`.codec`: the codec and its numba kernels;
* ``_cuda.py``: the device twin (loaded by :mod:`ccl.codecs.device`).
"""

from .codec import DitheringCodec

__all__ = ["DitheringCodec"]
