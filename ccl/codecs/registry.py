"""The codec registry: ids to classes (:func:`register_codec`, :func:`get_codec`)."""

from __future__ import annotations

from typing import Any, Mapping, TypeVar

from .base import Codec
from .configurable import check_parameters
from .header import claim_wire_id

__all__ = ["register_codec", "registered_codecs", "get_codec"]

_REGISTRY: dict[str, type[Codec]] = {}
CodecT = TypeVar("CodecT", bound=Codec)


def register_codec(cls: type[CodecT]) -> type[CodecT]:
    """Register a :class:`Codec` subclass under its ``codec_id`` (usable as a decorator).

    ``cls`` is the subclass, with ``codec_id`` and ``wire_id`` set.

    Returns
    -------
    type
        ``cls`` itself, so the function works as a class decorator.

    Raises
    ------
    ValueError
        If the id is not lower case, or the id or wire id is taken by another class.

    Examples
    --------
    >>> from ccl.codecs import FP16Codec, register_codec
    >>> register_codec(FP16Codec) is FP16Codec          # registering again is harmless
    True
    >>> class Clash(FP16Codec):
    ...     codec_id = "fp16"
    >>> register_codec(Clash)
    Traceback (most recent call last):
    ...
    ValueError: codec 'fp16' is already registered by FP16Codec
    """
    codec_id, wire_id = cls.codec_id, cls.wire_id
    if not isinstance(codec_id, str) or codec_id != codec_id.lower() or not codec_id:
        raise ValueError(f"codec_id must be a non-empty lower-case string, got {codec_id!r}")
    existing = _REGISTRY.get(codec_id)
    if existing is not None and existing is not cls:
        raise ValueError(f"codec {codec_id!r} is already registered by {existing.__name__}")
    claim_wire_id(wire_id, codec_id)
    _REGISTRY[codec_id] = cls
    return cls


def registered_codecs() -> list[str]:
    """Return the registered codec ids, sorted.

    Returns
    -------
    list of str
        Every id :func:`get_codec` accepts.

    Examples
    --------
    >>> from ccl.codecs import registered_codecs
    >>> {"none", "fp16", "3lc", "thc", "topk"} <= set(registered_codecs())
    True
    """
    return sorted(_REGISTRY)


def get_codec(spec: str | Mapping[str, Any] | Codec | None = None,
              **params: Any) -> Codec:
    """Return a codec from an id, a numcodecs-style config dict, or a codec.

    Parameters
    ----------
    spec : str, dict, Codec or None
        ``"3lc"``; ``{"id": "3lc", "s": 1.5}`` (not modified); a :class:`Codec`
        (returned as is); ``None`` means ``"none"`` (no compression).
    **params
        Codec parameters when ``spec`` is an id.

    Returns
    -------
    Codec
        The codec (a new instance unless ``spec`` was one).

    Raises
    ------
    ValueError
        For an unknown id (the message lists the known ones), an unknown
        parameter (the message lists the codec's parameters) or a bad value.
    TypeError
        For a spec of another type, or parameters given with a config or codec.

    Examples
    --------
    >>> from ccl.codecs import get_codec
    >>> get_codec("fp16")
    FP16Codec()
    >>> get_codec({"id": "none"}) == get_codec("none")
    True
    >>> get_codec({"id": "thc", "bit": 4})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: codec 'thc' has no parameter 'bit' (did you mean 'bits'?); its parameters: ...
    """
    if isinstance(spec, Codec):
        if params:
            raise TypeError("parameters cannot be given together with a Codec instance")
        return spec
    if spec is None:
        spec = "none"
    if isinstance(spec, dict):
        if params:
            raise TypeError("parameters cannot be given together with a config dict")
        config = dict(spec)
        if "id" not in config:
            raise ValueError("a codec config dict needs an 'id' key, e.g. {'id': 'fp16'}")
        codec_id = config.pop("id")
        params = config
    elif isinstance(spec, str):
        codec_id = spec
    else:
        raise TypeError(f"codec must be an id string, a config dict, a Codec or None; "
                        f"got {type(spec).__name__}")
    cls = _REGISTRY.get(str(codec_id).lower())
    if cls is None and str(codec_id).lower() == "powersgd":
        raise ValueError("'powersgd' is not a codec (it approximates whole weight matrices "
                         "with two allreduces, not chunks): pass codec='powersgd' to "
                         "ccl.torch.DistributedOptimizer or ccl.torch.ddp_comm_hook, or "
                         f"use ccl.torch.PowerSGD; known codecs: "
                         f"{', '.join(registered_codecs())}")
    if cls is None:
        raise ValueError(f"unknown codec {codec_id!r}; known codecs: "
                         f"{', '.join(registered_codecs())}")
    check_parameters(cls, params)
    return cls(**params)
