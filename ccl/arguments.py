"""The one rule for the arguments of ccl's entry points, and the errors that teach it.

* The functions :func:`ccl.compressed_allreduce`, :func:`ccl.reduce_scatter`
  and :func:`ccl.allgather` take the array and the codec positionally;
  everything else is keyword-only.
* The :class:`ccl.Communicator` methods take only the array positionally:
  the codec is the communicator's (set at construction, overridable with
  ``codec=``), and a key, an op or an algorithm is named.

Python's own ``TypeError`` for an extra positional argument ("takes 2
positional arguments but 3 were given") says what is wrong, not what to
write. Where the first cut of the API took the key second,
``c.allreduce(x, "fp16")`` quietly ran uncompressed under a key named
"fp16"; :func:`array_first` turns such calls into a ``TypeError`` that
spells out the call that was meant.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar, Union

if TYPE_CHECKING:
    from mpi4py import MPI

    from .codecs import Codec

__all__ = ["array_first", "looks_like_codec", "world_or", "by_look"]

# Types the entry points' annotations share (not exported: type checkers read them here).
#: What a ``codec`` argument takes: a codec, a registered id, a config dict, or None.
CodecLike = Union["Codec", str, Mapping[str, Any], None]
#: ``meant(extra_values) -> names``: the keyword each extra positional argument was meant for.
Meant = Callable[[Sequence[Any]], list[str]]
_F = TypeVar("_F", bound=Callable[..., Any])


def looks_like_codec(value: object) -> bool:
    """Whether ``value`` is what a ``codec`` argument takes (a codec, its id or config).

    Parameters
    ----------
    value : object
        Any argument.

    Returns
    -------
    bool
        True for a :class:`ccl.codecs.Codec`, a registered codec id or a
        config dict with an ``"id"``.
    """
    from .codecs import Codec, registered_codecs

    if isinstance(value, Codec):
        return True
    if isinstance(value, dict):
        return "id" in value
    return isinstance(value, str) and value.lower() in registered_codecs()


def _kind(value: object) -> str | None:
    """The keyword an argument of this look is usually passed as (None: no telling)."""
    from mpi4py import MPI

    from .collectives.algorithms import ALGORITHM_NAMES, OPS

    if isinstance(value, MPI.Comm):
        return "comm"
    if isinstance(value, bool):
        return "check_finite"
    if isinstance(value, str) and value in OPS:
        return "op"
    if isinstance(value, str) and value in ALGORITHM_NAMES:
        return "algorithm"
    if looks_like_codec(value):
        return "codec"
    if isinstance(value, (int, float)):
        return "timeout"
    return None


def by_look(order: Sequence[str]) -> Meant:
    """A ``meant`` for :func:`array_first`: each extra argument's keyword by its look.

    A communicator is ``comm``, ``"mean"`` an ``op``, ``"ring"`` an
    ``algorithm``, a codec id a ``codec``, a bool ``check_finite``, a number
    ``timeout``; anything else takes the next name of ``order`` not taken
    yet (the order the arguments once had positionally).

    Parameters
    ----------
    order : tuple of str
        The keyword-only parameters, in their old positional order.

    Returns
    -------
    callable
        ``meant(extra_values) -> list of names``.
    """
    def meant(extra: Sequence[Any]) -> list[str]:
        kinds = [_kind(value) for value in extra]
        names = [kind if kind in order else None for kind in kinds]
        rest = iter(name for name in order if name not in names)
        return [name or next(rest, "?") for name in names]
    return meant


def _shown(value: object) -> str:
    """``value`` as it would be written in a call (long reprs by their type)."""
    text = repr(value)
    return text if len(text) <= 40 else f"<{type(value).__name__}>"


def array_first(positional: int, meant: Meant, call: str,
                method: bool = False) -> Callable[[_F], _F]:
    """Decorate an entry point so that extra positional arguments raise a helpful TypeError.

    The decorated function keeps its signature (``inspect.signature`` and
    the documentation show it); a call with more than ``positional``
    positional arguments raises ``TypeError`` naming the call to write
    instead, with each extra argument given the keyword it most likely
    meant.

    Parameters
    ----------
    positional : int
        How many arguments may be positional (``self`` not counted).
    meant : callable
        ``meant(extra_values) -> list of parameter names``: the keyword each
        extra positional argument was most likely meant for.
    call : str
        How the call is written, up to its positional arguments (for
        example ``"c.allreduce(x"``).
    method : bool
        The function is a method (its ``self`` is positional too).

    Returns
    -------
    callable
        The decorator.
    """
    def decorate(func: _F) -> _F:
        @functools.wraps(func)
        def checked(*args: Any, **kwargs: Any) -> Any:
            if len(args) > positional + method:
                extra = args[positional + method:]
                named = ", ".join(f"{name}={_shown(value)}"
                                  for name, value in zip(meant(extra), extra))
                raise TypeError(
                    f"{func.__qualname__}() takes {positional} positional argument(s), "
                    f"everything else by keyword; got {len(args) - method}. "
                    f"Write {call}, {named})")
            return func(*args, **kwargs)
        return checked  # type: ignore[return-value]  # wraps keeps the signature
    return decorate


def world_or(comm: MPI.Intracomm | None, call: str | None = None) -> MPI.Intracomm:
    """``comm``, or ``MPI.COMM_WORLD`` for None; anything but an intracommunicator raises.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm or None
        The user's communicator.
    call : str, optional
        How a codec given in its place is passed instead, with ``...`` for
        the codec (for the message), e.g. ``"ccl.Communicator(codec=...)"``.

    Returns
    -------
    mpi4py.MPI.Intracomm

    Raises
    ------
    TypeError
        If ``comm`` is not an ``mpi4py.MPI.Intracomm`` (a codec passed in
        its place says how to pass it).
    """
    from mpi4py import MPI

    if comm is None:
        return MPI.COMM_WORLD
    if isinstance(comm, MPI.Intracomm):
        return comm
    hint = (f"; a codec goes by keyword: {call.replace('...', _shown(comm))}"
            if call and looks_like_codec(comm) else "")
    raise TypeError(f"comm must be an mpi4py.MPI.Intracomm such as MPI.COMM_WORLD, got "
                    f"{_shown(comm)}{hint}")
