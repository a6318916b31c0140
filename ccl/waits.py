"""Deprecated alias of :mod:`ccl.transport.waits`, where the waits moved.

Every name still works from here, with a ``DeprecationWarning``; import
them from ``ccl.transport.waits`` instead. This alias will be removed.
"""

import warnings

from .transport import waits as _waits

__all__ = list(_waits.__all__)


def __getattr__(name):
    value = getattr(_waits, name)  # AttributeError for a name the module never had
    warnings.warn(f"ccl.waits is deprecated: import {name} from ccl.transport.waits",
                  DeprecationWarning, stacklevel=2)
    return value


def __dir__():
    return sorted(set(globals()) | set(_waits.__all__))
