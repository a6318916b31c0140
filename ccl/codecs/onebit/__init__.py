"""The ``onebit`` codec: one sign bit per value and one scale per chunk.

* :mod:`.codec`: the codec and its numba kernels;
* ``_cuda.py``: the device twin (loaded by :mod:`ccl.codecs.device`).
"""

from .codec import OneBitCodec

__all__ = ["OneBitCodec"]
