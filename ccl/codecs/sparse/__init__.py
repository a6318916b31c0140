"""The sparsifying codecs ``topk``, ``dgc``, ``sidco`` and ``sparseloco``.

Each sends a few (index, value) pairs per chunk: the selected values travel
exactly (float32, or 2-bit levels for ``sparseloco``), everything else
decodes to zero and stays in the error feedback residual of the collective.
They share one wire format (``docs/codecs/sparse.md``) and differ only in
how they choose the indices:

* :mod:`.topk`: :class:`TopKCodec` takes the exact ``k`` largest
  magnitudes; :class:`DGCCodec` estimates a threshold from a strided sample;
* :mod:`.sidco`: :class:`SIDCoCodec` fits a sparsity-inducing distribution
  to the magnitudes and reads the threshold in closed form;
* :mod:`.sparseloco`: :class:`SparseLoCoCodec` is top-k per block with the
  kept values in 2 bits.

None is homomorphic (the union of two supports grows), so the collectives
allgather the payloads by default. Payload sizes vary with the data.

The family's private modules: ``_common.py`` (the wire format, decoding in
:class:`SparseCodec` and the selection helpers), ``_kernels.py`` (numba)
and ``_cuda.py`` (the device twin, device selections included).
"""

from ._common import SparseCodec, target_count
from .sidco import SIDCoCodec
from .sparseloco import SparseLoCoCodec
from .topk import DGCCodec, TopKCodec

__all__ = ["TopKCodec", "DGCCodec", "SIDCoCodec", "SparseLoCoCodec", "SparseCodec",
           "target_count"]
