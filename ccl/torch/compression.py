"""Horovod's ``Compression`` for ``ccl.torch``: its compressor interface, plus every ccl codec.

Horovod's compressors are classes with two static methods,
``compress(tensor) -> (tensor, ctx)`` and ``decompress(tensor, ctx)``,
applied around an allreduce. :attr:`Compression.none` and
:attr:`Compression.fp16` behave that way here too. :meth:`Compression.codec`
goes further: it names a ccl codec (``"3lc"``, ``"thc"``, ``"topk"``, ...)
that compresses every chunk on the wire, with error feedback kept per
tensor name where the codec keeps it.

>>> import torch
>>> from ccl.torch.compression import Compression
>>> t, ctx = Compression.fp16.compress(torch.ones(3))
>>> t.dtype, Compression.fp16.decompress(t, ctx).dtype
(torch.float16, torch.float32)
>>> Compression.codec("3lc", s=1.5)
Compression.codec(ThreeLCCodec(s=1.5))
"""

import torch

from ..codecs import Codec, get_codec

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "CodecCompressor", "Compression",
           "resolve_codec"]


class Compressor:
    """Horovod's interface: compress before the collective, decompress after it."""

    @staticmethod
    def compress(tensor):
        """Return ``(compressed tensor, context for decompress)``."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Return the tensor restored from ``compress``'s output and context."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: the tensor travels as it is."""

    @staticmethod
    def compress(tensor):
        """Return ``(tensor, None)``."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Return ``tensor``."""
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 and come back in their own dtype."""

    @staticmethod
    def compress(tensor):
        """Cast a floating-point tensor to float16; the context is its dtype."""
        if tensor.dtype.is_floating_point:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        """Cast back to the dtype ``compress`` saw."""
        return tensor.type(ctx) if ctx.is_floating_point else tensor


class CodecCompressor(Compressor):
    """A ccl codec as a ``compression=``: chunks are encoded on the wire, not around it.

    ``compress``/``decompress`` are identities (the codec works inside the
    collective); ``codec`` is what :func:`ccl.torch.allreduce` and
    :func:`ccl.torch.DistributedOptimizer` hand to ccl's collectives.

    Parameters
    ----------
    codec : Codec, str or dict
        A codec, its id or its config (see :func:`ccl.codecs.get_codec`).
    **params
        Codec parameters when ``codec`` is an id.
    """

    def __init__(self, codec, **params):
        self.codec = get_codec(codec, **params)

    def compress(self, tensor):
        """Return ``(tensor, None)``: the codec encodes inside the collective."""
        return tensor, None

    def decompress(self, tensor, ctx):
        """Return ``tensor``."""
        return tensor

    def __repr__(self):
        return f"Compression.codec({self.codec!r})"


class Compression:
    """The compressions ``compression=`` takes, as in Horovod, plus ccl's codecs.

    ``Compression.none`` sends tensors as they are; ``Compression.fp16``
    casts floating-point tensors to float16 for the collective and back
    after it (Horovod's ``compress``/``decompress`` interface);
    :meth:`codec` makes any ccl codec a compression.

    Examples
    --------
    >>> import torch
    >>> from ccl.torch import Compression
    >>> t, ctx = Compression.fp16.compress(torch.ones(2))
    >>> t.dtype, Compression.fp16.decompress(t, ctx).dtype
    (torch.float16, torch.float32)
    >>> Compression.codec("topk").codec.codec_id
    'topk'
    """

    #: No compression.
    none = NoneCompressor
    #: float16 on the wire (Horovod's ``--fp16-allreduce``).
    fp16 = FP16Compressor

    @staticmethod
    def codec(codec, **params):
        """A ccl codec as a compression, e.g. ``Compression.codec("3lc", s=1.5)``.

        Parameters
        ----------
        codec : Codec, str or dict
            A codec, its id or its config (see :func:`ccl.codecs.get_codec`).
        **params
            Codec parameters when ``codec`` is an id.

        Returns
        -------
        CodecCompressor
            What ``compression=`` takes.
        """
        return CodecCompressor(codec, **params)


def resolve_codec(compression):
    """The ccl codec a ``compression=`` stands for, or None for Horovod-style compressors.

    Parameters
    ----------
    compression : Compressor class or instance, CodecCompressor, Codec, str or dict
        What the user passed.

    Returns
    -------
    tuple
        ``(codec, compressor)``: ``codec`` is a :class:`ccl.codecs.Codec` when
        the compression is one of ccl's codecs (``compressor`` is then None);
        otherwise ``codec`` is None and ``compressor`` has ``compress`` and
        ``decompress``.

    Raises
    ------
    TypeError
        For anything else.
    ValueError
        For an unknown codec id or bad codec parameters.
    """
    if compression is None or compression is NoneCompressor:
        return None, NoneCompressor
    if isinstance(compression, CodecCompressor):
        return compression.codec, None
    if isinstance(compression, (Codec, str, dict)):
        return get_codec(compression), None
    if callable(getattr(compression, "compress", None)) and \
            callable(getattr(compression, "decompress", None)):
        return None, compression
    raise TypeError("compression must be hvd.Compression.none, hvd.Compression.fp16, "
                    "hvd.Compression.codec(...), a ccl codec (or its id), or an object with "
                    f"compress() and decompress(); got {compression!r}")
