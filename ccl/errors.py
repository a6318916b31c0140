"""Exceptions raised by ccl.

Every collective raises the same exception class on every rank, so a
``try``/``except`` around a collective never leaves some ranks blocked.
"""

__all__ = [
    "CCLError",
    "PayloadError",
    "MismatchError",
    "NonFiniteError",
    "CompressionOverflowError",
    "LaunchError",
]


class CCLError(Exception):
    """Base class of every ccl-specific error."""


class PayloadError(CCLError, ValueError):
    """A payload is malformed, truncated, or was made by another codec."""


class MismatchError(CCLError):
    """Ranks disagree on shape, dtype, codec, algorithm, op or collective.

    Raised on every rank of the communicator. ``field`` names what differs
    and ``ranks`` maps each distinct value to the ranks that passed it.
    """

    def __init__(self, message, field=None, ranks=None):
        super().__init__(message)
        self.field = field
        self.ranks = ranks


class NonFiniteError(CCLError, FloatingPointError):
    """NaN or Inf input with ``check_finite=True`` (raised on every rank)."""


class CompressionOverflowError(CCLError, ArithmeticError):
    """A compressed sum exceeded what its format can hold (e.g. fp16 > 65504).

    Raised on every rank instead of returning a silently saturated result.
    """


class LaunchError(CCLError, RuntimeError):
    """The launcher started N > 1 processes but MPI sees a 1-rank world (see ``ccl.launch``).

    ``expected`` is what the launcher said, ``world_size`` what MPI sees, and
    ``variable`` the environment variable the expectation came from.
    """

    def __init__(self, message, expected=None, world_size=None, variable=None):
        super().__init__(message)
        self.expected = expected
        self.world_size = world_size
        self.variable = variable
