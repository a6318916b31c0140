"""Codecs: what ccl's collectives compress each chunk with.

Use :func:`get_codec` to build one by id (``"none"``, ``"fp16"``, ``"bf16"``,
...) or from a numcodecs-style config dict; subclass :class:`Codec` and
decorate with :func:`register_codec` to add one.

The framework (:class:`Codec`, the header and its framing, the registry,
:class:`CodecContext`, the device dispatch) lives in this package's
modules; each codec family is a subpackage (``casts``, ``threelc``,
``thc``, ``sparse``, ``onebit``, ``randomk``, ``dithering``) holding its
codecs, CPU kernels, device twin and tables.
"""

from .base import Codec
from .context import CodecContext
from .header import FLAG_NONFINITE, FLAG_OVERFLOW, HEADER_SIZE, Header
from .registry import get_codec, register_codec, registered_codecs
from .casts import BF16Codec, FP16Codec, NoneCodec
from .dithering import DitheringCodec
from .onebit import OneBitCodec
from .randomk import RandomKCodec
from .sparse import DGCCodec, SIDCoCodec, SparseLoCoCodec, TopKCodec
from .thc import THCCodec
from .threelc import ThreeLCCodec

__all__ = [
    "Codec", "CodecContext", "Header", "HEADER_SIZE", "FLAG_NONFINITE", "FLAG_OVERFLOW",
    "get_codec", "register_codec", "registered_codecs",
    "NoneCodec", "FP16Codec", "BF16Codec", "ThreeLCCodec", "THCCodec",
    "SIDCoCodec", "TopKCodec", "DGCCodec", "OneBitCodec", "RandomKCodec", "DitheringCodec",
    "SparseLoCoCodec",
]
