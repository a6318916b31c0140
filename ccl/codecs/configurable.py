"""A codec's configuration: its public attributes, and what follows from them.

The configuration of a codec is the set of its public instance attributes
(the constructor arguments under the same names; private state starts with
``_``), as in numcodecs. :class:`Configurable` derives everything else from
that one rule: ``get_config()``, ``from_config()``, equality, hashing,
``repr`` and the CRC32 :attr:`~Configurable.config_hash` that every payload
header carries, so that a payload made with another configuration is
rejected. :class:`ccl.codecs.Codec` inherits it.
"""

from __future__ import annotations

import difflib
import inspect
import json
import zlib
from typing import Any, Mapping, TypeVar

__all__ = ["Configurable", "check_parameters"]

_C = TypeVar("_C", bound="Configurable")


def check_parameters(cls, params):
    """Raise ``ValueError`` unless every name in ``params`` is a parameter of ``cls``.

    Python's own ``TypeError`` for an unexpected keyword names neither the
    codec's parameters nor the likely intended one; this message does.

    Parameters
    ----------
    cls : type
        A codec class.
    params : mapping
        The keyword arguments about to be given to ``cls``.

    Raises
    ------
    ValueError
        Naming the unknown parameters, the closest known name, and every
        parameter with its default.

    Examples
    --------
    >>> from ccl.codecs import THCCodec
    >>> check_parameters(THCCodec, {"bit": 4})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: codec 'thc' has no parameter 'bit' (did you mean 'bits'?); its parameters: ...
    """
    signature = inspect.signature(cls.__init__)
    known = {name: p for name, p in signature.parameters.items()
             if name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        return
    unknown = [name for name in params if name not in known]
    if not unknown:
        return
    close = difflib.get_close_matches(unknown[0], known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    listed = ", ".join(name if p.default is p.empty else f"{name}={p.default!r}"
                       for name, p in known.items()) or "none"
    names = ", ".join(repr(name) for name in unknown)
    raise ValueError(f"codec {cls.codec_id!r} has no parameter{'s' * (len(unknown) > 1)} "
                     f"{names}{hint}; its parameters: {listed}")


class Configurable:
    """The configuration of a codec: its public attributes, and what follows from them.

    A subclass sets the class attribute ``codec_id`` and stores its
    parameters as public attributes under their argument names.

    Examples
    --------
    >>> from ccl.codecs import get_codec
    >>> codec = get_codec("thc", bits=2)
    >>> codec == get_codec(codec.get_config()), codec == get_codec("thc", bits=3)
    (True, False)
    """

    codec_id = None

    def get_config(self) -> dict[str, Any]:
        """Return the configuration as a JSON-serialisable dict with an ``"id"``.

        Returns
        -------
        dict
            ``{"id": codec_id, **public attributes}``; :func:`get_codec` and
            :meth:`from_config` accept it.

        Examples
        --------
        >>> from ccl.codecs import get_codec
        >>> get_codec("topk", density=0.05).get_config()
        {'id': 'topk', 'density': 0.05, 'k': None}
        """
        public = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        return {"id": self.codec_id, **public}

    @classmethod
    def from_config(cls: type[_C], config: Mapping[str, Any]) -> _C:
        """Build a codec from :meth:`get_config` output (the dict is not modified).

        Parameters
        ----------
        config : dict
            A configuration; its ``"id"`` (optional) must be this class's.

        Returns
        -------
        Codec
            A new instance of this class.

        Raises
        ------
        ValueError
            If the id names another codec, or a parameter is unknown or invalid.
        """
        config = dict(config)
        codec_id = config.pop("id", cls.codec_id)
        if codec_id != cls.codec_id:
            raise ValueError(f"config is for codec {codec_id!r}, not {cls.codec_id!r}")
        check_parameters(cls, config)
        return cls(**config)

    @property
    def config_hash(self) -> int:
        """CRC32 of the canonical JSON configuration (written into payload headers)."""
        cached = self.__dict__.get("_config_hash")
        if cached is None:
            text = json.dumps(self.get_config(), sort_keys=True, default=str)
            cached = zlib.crc32(text.encode("utf-8"))
            self.__dict__["_config_hash"] = cached
        return cached

    def __setattr__(self, name, value):
        # Changing a parameter changes the configuration: forget the cached hash.
        if not name.startswith("_"):
            self.__dict__.pop("_config_hash", None)
        object.__setattr__(self, name, value)

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self):
        return hash((type(self), self.config_hash))

    def __repr__(self):
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "id")
        return f"{type(self).__name__}({params})"
