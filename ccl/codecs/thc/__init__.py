"""The ``thc`` codec: Tensor Homomorphic Compression.

* :mod:`.codec`: the codec and its wire format;
* ``_kernels.py``: the numba kernels (rotation, quantization, lane sums);
* ``_tables.py``: the quantization and receiver tables;
* ``_cuda.py``: the device twin (loaded by :mod:`ccl.codecs.device`).
"""

from .codec import THCCodec

__all__ = ["THCCodec"]
