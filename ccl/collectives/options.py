"""The options of a collective call, validated once, in one frozen object.

:class:`Options` gathers everything a call is configured with besides its
input and key: the codec, op, algorithm, NaN policy, timeout, partitioning,
the compression threshold, the pipeline's segment size and the link speed.
``ccl.Communicator`` holds one as its defaults; each call replaces the
fields it overrides. Fields left as None take their value from the
environment when the call runs (``CCL_TIMEOUT``, ``CCL_SEGMENT_BYTES``,
``CCL_LINK_GBPS``; see :mod:`ccl.config`), so a bad variable on one rank
is reported through the agreement like any other bad argument.
"""

from __future__ import annotations

import dataclasses

from .. import config
from ..codecs import Codec, get_codec
from .algorithms import ALGORITHM_NAMES, FLAT, OPS

__all__ = ["Options"]

#: How many :meth:`Options.replace` results are remembered (see ``_memo_key``).
_MEMO_SIZE = 256
_memo = {}


def _threshold(value, name, zero):
    """A size knob where None and 0 both mean "off"."""
    return config.byte_count(value, name, zero) or None


@dataclasses.dataclass(frozen=True)
class Options:
    """Validated options of a collective (see :func:`ccl.compressed_allreduce`).

    Build with :meth:`make` (which validates and normalises); derive a
    per-call variant with :meth:`replace`.

    Attributes
    ----------
    codec : ccl.codecs.Codec
    op : str
        ``"sum"`` or ``"mean"``.
    algorithm : str
        A name of ``ccl.collectives.ALGORITHM_NAMES``.
    check_finite : bool
    timeout : float or None
        Seconds; ``math.inf`` waits forever; None: ``CCL_TIMEOUT``.
    partition_bytes, min_compress_bytes : int or None
        None: one partition; compress everything.
    segment_bytes : int or None
        0: no pipelining; None: ``CCL_SEGMENT_BYTES``, else the default.
    link_gbps : float, "probe" or None
        None: ``CCL_LINK_GBPS``, else measured.
    cross_algorithm : str or None
        The flat algorithm ``hierarchical`` runs across nodes (None: the one
        that fits the codec).
    """

    codec: Codec
    op: str = "sum"
    algorithm: str = "auto"
    check_finite: bool = False
    timeout: float | None = None
    partition_bytes: int | None = None
    min_compress_bytes: int | None = None
    segment_bytes: int | None = None
    link_gbps: float | str | None = None
    cross_algorithm: str | None = None

    @classmethod
    def make(cls, codec=None, op="sum", algorithm="auto", check_finite=False, timeout=None,
             partition_bytes=None, min_compress_bytes=None, segment_bytes=None,
             link_gbps=None, cross_algorithm=None):
        """Validate the arguments and return the options.

        Raises
        ------
        TypeError, ValueError
            With a message that says what is accepted.
        """
        codec = get_codec(codec)
        if op not in OPS:
            raise ValueError(f"op must be one of {', '.join(map(repr, OPS))}, got {op!r}")
        if algorithm not in ALGORITHM_NAMES:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHM_NAMES)}; "
                             f"got {algorithm!r}")
        if cross_algorithm is not None and cross_algorithm not in FLAT:
            raise ValueError(f"cross_algorithm must be one of {', '.join(FLAT)} or None; "
                             f"got {cross_algorithm!r}")
        if not isinstance(check_finite, bool):
            raise TypeError(f"check_finite must be True or False, got {check_finite!r}")
        return cls(codec=codec, op=op, algorithm=algorithm, check_finite=check_finite,
                   timeout=config.timeout_seconds(timeout),
                   partition_bytes=_threshold(partition_bytes, "partition_bytes",
                                              "one partition"),
                   min_compress_bytes=_threshold(min_compress_bytes, "min_compress_bytes",
                                                 "compress everything"),
                   segment_bytes=config.segment_bytes(segment_bytes),
                   link_gbps=config.link_gbps(link_gbps), cross_algorithm=cross_algorithm)

    def replace(self, **changes):
        """These options with ``changes`` (None values keep the current field), validated.

        The module-level functions pass the same changes at every call: the
        validated result is remembered (keyed as ``_memo_key`` says), so a
        repeated call does not validate them again.
        """
        changes = {k: v for k, v in changes.items() if v is not None}
        if not changes:
            return self
        key = _memo_key(self, changes)
        if key is None:
            return self.updated(**changes)
        hit = _memo.get(key)
        if hit is None:
            if len(_memo) >= _MEMO_SIZE:
                _memo.clear()
            # the entry holds the objects whose ids are in its key, so no id is reused
            hit = _memo[key] = (self, changes, self.updated(**changes))
        result = hit[2]
        spec = changes.get("codec")
        if (spec is not None and not isinstance(spec, Codec)
                and callable(getattr(result.codec, "state_dict", None))):
            # a codec that keeps state between calls (SIDCo's stages) was a new one at
            # every call before this memo: it still is
            result = dataclasses.replace(result, codec=get_codec(spec))
        return result

    def updated(self, **changes):
        """These options with ``changes`` taken literally (None resets a field), validated."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields.update(changes)
        return Options.make(**fields)


def _memo_key(options, changes):
    """A key that names ``options`` and ``changes`` exactly, or None where none is safe.

    The options and any codec count by identity (an equal codec is another
    object, with its own state), scalars by type and value (``1`` is not
    ``True``); anything else (a config dict can change in place) is not
    remembered.
    """
    parts = [id(options)]
    for name in sorted(changes):
        value = changes[name]
        if type(value) in (str, int, float, bool):
            parts.append((name, type(value), value))
        elif isinstance(value, Codec):
            parts.append((name, id(value)))
        else:
            return None
    return tuple(parts)
