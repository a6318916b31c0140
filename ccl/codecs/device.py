"""Encode, decode and add on device arrays: each codec's device twin, found by its class.

:class:`ccl.codecs.Codec` sends device input here (cupy arrays, or numpy
arrays inside :func:`ccl._xp.simulated_device`). Payloads stay on the device
as ``uint8`` arrays with the same header and body bytes as the CPU path:
only the 32-byte header and each codec's few body-header bytes are written
from (or read into) host memory.

The device work of a codec family is its *device twin*, a class of static
methods in a module beside the codec (``threelc.py`` has
``_threelc_cuda.py``) built on the numba.cuda helpers of
:mod:`ccl.codecs._cuda_common`. A codec class names its twin in the class
attribute ``device_twin``, a string ``"package.module:Class"``. This module
imports no codec and no numba.cuda: the twin's module is imported the first
time a device array of that codec is encoded or decoded.

The twin is found along the class hierarchy (:func:`twin_for`): the nearest
class of the codec's MRO that declares ``device_twin`` in its own body gives
it, so a subclass of a built-in codec uses the built-in twin. A subclass
that overrides one of the host methods the twin stands in for
(:attr:`DeviceTwin.replaces`: ``_encode``, ``_decode`` and ``_add``, plus
what a twin adds) does not get that twin, which would ignore the override:
it takes the host path, its own CPU code on a host copy, with the result
moved back to the device. ``device_twin = None`` asks for the host path
explicitly; a codec that declares nothing (a user's codec) takes it too.
Either way every codec accepts device input.
"""

import importlib
import threading

import numpy as np

from .context import all_finite
from .header import FLAG_NONFINITE, HEADER_SIZE, Header

__all__ = ["DeviceTwin", "TWIN_ATTRIBUTE", "twin_for", "encode", "decode", "add", "pack",
           "body_buffer"]

TWIN_ATTRIBUTE = "device_twin"
_NOT_DECLARED = object()
_TWINS = {}  # codec class -> its twin class, or None for the host path
# .armed: inside encode() on this thread; .raw: then the buffer of the last body_buffer()
_ROOM = threading.local()


class DeviceTwin:
    """Base class of a codec family's device twin: static methods on device arrays.

    A twin mirrors the codec's host methods and must write the same payload
    bytes (see :mod:`ccl.codecs._cuda_common` for the rules that keep the
    two paths bit-identical). ``be`` is the array's :class:`ccl._xp.Backend`.

    Attributes
    ----------
    replaces : tuple of str
        The codec's host methods this twin stands in for. A subclass of the
        codec that overrides one of them takes the host path instead.
    add : callable or None
        ``add(codec, ha, a_body, hb, b_body, ctx, be)``, the device twin of
        ``Codec._add`` returning a full payload; None (the default) adds on
        the host.
    """

    replaces = ("_encode", "_decode", "_add")
    add = None

    @staticmethod
    def encode(codec, x, ctx, be):
        """Twin of ``codec._encode``: ``x`` is finite, 1-D and contiguous; ``(body, flags)``."""
        raise NotImplementedError

    @staticmethod
    def decode(codec, header, body, ctx, be):
        """Twin of ``codec._decode`` for an unflagged payload's body (header validated)."""
        raise NotImplementedError


def _load(spec, owner):
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"{owner.__name__}.{TWIN_ATTRIBUTE} must be 'package.module:Class', "
                         f"got {spec!r}")
    twin = importlib.import_module(module)
    for part in name.split("."):
        twin = getattr(twin, part)
    return twin


def twin_for(cls):
    """The device twin of the codec class ``cls``, or None when it takes the host path.

    Walks ``cls.__mro__`` to the nearest class that declares ``device_twin``
    and imports the twin it names (once per class). Returns None when no
    class declares one, when the nearest declaration is None, or when a
    class between ``cls`` and the declaring class overrides a method of the
    twin's ``replaces``: that override would be ignored by the twin.

    Parameters
    ----------
    cls : type
        A :class:`ccl.codecs.Codec` subclass.

    Returns
    -------
    type or None
        The twin (a :class:`DeviceTwin` subclass), or None.
    """
    try:
        return _TWINS[cls]
    except KeyError:
        pass
    twin = None
    for depth, klass in enumerate(cls.__mro__):
        spec = vars(klass).get(TWIN_ATTRIBUTE, _NOT_DECLARED)
        if spec is _NOT_DECLARED:
            continue
        if spec is not None:
            twin = _load(spec, klass)
            overridden = any(name in vars(sub) for sub in cls.__mro__[:depth]
                             for name in twin.replaces)
            twin = None if overridden else twin
        break
    _TWINS[cls] = twin
    return twin


def body_buffer(be, nbytes):
    """An empty ``uint8`` device body of ``nbytes`` with room for the header in front of it.

    A twin's encode that writes its body here lets :func:`encode` put the
    header in front instead of copying the body into a new payload (on an
    H100 that copy was a tenth of a 256 MB fp16 encode). Only the buffer of
    the calling thread's latest call is taken up that way; any other body is
    copied.
    """
    raw = be.xp.empty(HEADER_SIZE + int(nbytes), dtype=np.uint8)
    if getattr(_ROOM, "armed", False):
        _ROOM.raw = raw
    return raw[HEADER_SIZE:]


def _address(a):
    face = getattr(a, "__cuda_array_interface__", None) or a.__array_interface__
    return face["data"][0]


def _in_room(body, room):
    """The payload ``room`` would make around ``body`` (its bytes already in place), or None."""
    if room is None or body.nbytes == 0 or body.ndim != 1 or not body.flags.c_contiguous:
        return None
    if (_address(body) != _address(room) + HEADER_SIZE
            or body.nbytes > room.size - HEADER_SIZE):
        return None
    return room[:HEADER_SIZE + body.nbytes]


def pack(codec, body, n, be, flags=0, contributors=1, dtype=np.float32, room=None):
    """A device payload: the header (written from the host) followed by the device ``body``.

    Parameters
    ----------
    codec : Codec
        The codec whose wire id and configuration hash the header carries.
    body : device array
        The body, ``uint8``.
    n : int
        Elements the payload decodes to.
    be : ccl._xp.Backend
        The device backend of ``body``.
    flags, contributors, dtype
        As in :meth:`ccl.codecs.Codec.pack`.
    room : device array, optional
        The buffer of :func:`body_buffer` that ``body`` was written into: the
        header goes in front of it and the body is not copied.

    Returns
    -------
    device array
        1-D ``uint8`` payload.
    """
    header = Header(codec.wire_id, flags, np.dtype(dtype), contributors, codec.config_hash,
                    int(n), int(body.nbytes))
    out = _in_room(body, room)
    if out is None:
        out = be.xp.empty(HEADER_SIZE + body.nbytes, dtype=np.uint8)
        out[HEADER_SIZE:] = body if body.dtype == np.uint8 else body.view(np.uint8)
    be.upload(out[:HEADER_SIZE], np.frombuffer(header.pack(), dtype=np.uint8))
    return out


def encode(codec, x, ctx, be):
    """Device path of :meth:`Codec.encode` (``x`` already checked: 1-D, contiguous).

    Parameters
    ----------
    codec : Codec
        The codec.
    x : device array
        The input.
    ctx : CodecContext
        The encode's context.
    be : ccl._xp.Backend
        ``x``'s backend.

    Returns
    -------
    device array
        The payload.
    """
    shared_bad = ctx.shared is not None and not np.isfinite(ctx.shared).all()
    if shared_bad or not all_finite(x):
        return be.to_device(codec.flagged_payload(x.size, FLAG_NONFINITE))
    twin = twin_for(type(codec))
    if twin is None:  # the CPU code on a host copy
        body, flags = codec._encode(be.to_host(x), ctx)
        body = be.to_device(np.asarray(body, dtype=np.uint8))
        room = None
    else:
        _ROOM.armed, _ROOM.raw = True, None
        try:
            body, flags = twin.encode(codec, x, ctx, be)
        finally:
            room, _ROOM.armed, _ROOM.raw = _ROOM.raw, False, None
    return pack(codec, body, x.size, be, flags=flags, dtype=codec.decoded_dtype(x.dtype),
                room=room)


def decode(codec, header, body, ctx, be):
    """Device path of ``Codec._decode`` for an unflagged payload.

    Parameters
    ----------
    codec : Codec
        The codec.
    header : Header
        The payload's validated header.
    body : device array
        The payload after its header.
    ctx : CodecContext
        The encode's context.
    be : ccl._xp.Backend
        ``body``'s backend.

    Returns
    -------
    device array
        ``header.n`` decoded values.
    """
    twin = twin_for(type(codec))
    if twin is None:
        return be.to_device(codec._decode(header, be.to_host(body), ctx))
    return twin.decode(codec, header, body, ctx, be)


def add(codec, ha, a_body, hb, b_body, ctx, be):
    """Device path of ``Codec._add`` for two unflagged payloads.

    Parameters
    ----------
    codec : Codec
        A homomorphic codec.
    ha, hb : Header
        The two payloads' validated headers.
    a_body, b_body : device array
        The two payloads after their headers.
    ctx : CodecContext
        The encodes' context.
    be : ccl._xp.Backend
        The bodies' backend.

    Returns
    -------
    device array
        The payload of the sum.
    """
    twin = twin_for(type(codec))
    if twin is None or twin.add is None:
        return be.to_device(codec._add(ha, be.to_host(a_body), hb, be.to_host(b_body), ctx))
    return twin.add(codec, ha, a_body, hb, b_body, ctx, be)
