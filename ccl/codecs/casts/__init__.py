"""The cast codecs ``none``, ``fp16`` and ``bf16``: every value in a fixed-width format.

* :mod:`.codec`: the codecs;
* ``_kernels.py``: the numba casts to and from the 16-bit formats;
* ``_cuda.py``: the device twin (loaded by :mod:`ccl.codecs.device`).
"""

from .codec import BF16Codec, FP16Codec, NoneCodec

__all__ = ["NoneCodec", "FP16Codec", "BF16Codec"]
