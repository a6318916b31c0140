"""The ``3lc`` codec: three-value quantization, quartic and zero-run encoding.

* :mod:`.codec`: the codec and its public encoding steps;
* ``_kernels.py``: the numba kernels;
* ``_cuda.py``: the device twin (loaded by :mod:`ccl.codecs.device`).
"""

from .codec import ThreeLCCodec, quartic_decode, quartic_encode, scale_for, zre_decode, zre_encode

__all__ = ["ThreeLCCodec", "scale_for", "quartic_encode", "quartic_decode", "zre_encode",
           "zre_decode"]
