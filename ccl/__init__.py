"""ccl: MPI collectives that compress what they send."""

from . import codecs
from .errors import (CCLError, CompressionOverflowError, MismatchError, NonFiniteError,
                     PayloadError)

__all__ = ["codecs", "CCLError", "PayloadError", "MismatchError", "NonFiniteError",
           "CompressionOverflowError"]
