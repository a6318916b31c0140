"""Horovod's ``HOROVOD_*`` environment variables: the ones with a meaning here, and a warning.

``HOROVOD_FUSION_THRESHOLD`` (bytes) is the default bucket size cap of
:func:`~ccl.torch.DistributedOptimizer` (``fusion_threshold_bytes``);
``HOROVOD_TIMELINE`` (a file) records a timeline from ``init`` to
``shutdown`` (see :func:`~ccl.torch.start_timeline`).
Every other ``HOROVOD_*`` variable set in the environment has no effect on
``ccl.torch`` (its cycle time, timeline, stall check, autotuning and
controllers are Horovod's own machinery): :func:`warn_ignored` says so once.

>>> fusion_threshold({"HOROVOD_FUSION_THRESHOLD": "1048576"}, default=64)
1048576
>>> ignored({"HOROVOD_CYCLE_TIME": "5", "HOROVOD_FUSION_THRESHOLD": "1"})
['HOROVOD_CYCLE_TIME']
"""

import os
import warnings

__all__ = ["fusion_threshold", "ignored", "warn_ignored", "USED"]

#: The variables ``ccl.torch`` reads.
USED = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_TIMELINE")

_WARNED = set()


def fusion_threshold(environ=None, default=None):
    """``HOROVOD_FUSION_THRESHOLD`` as an int, else ``default``.

    Parameters
    ----------
    environ : mapping, optional
        Default ``os.environ``.
    default : int, optional
        What to return when the variable is not set.

    Returns
    -------
    int
        The bucket size cap in bytes.

    Raises
    ------
    ValueError
        If the variable is not a positive integer.
    """
    value = (os.environ if environ is None else environ).get("HOROVOD_FUSION_THRESHOLD")
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise ValueError(f"HOROVOD_FUSION_THRESHOLD must be a positive number of bytes, got "
                         f"{value!r}")
    return number


def ignored(environ=None):
    """The ``HOROVOD_*`` variables set that ``ccl.torch`` does not read (sorted).

    Parameters
    ----------
    environ : mapping, optional
        Default ``os.environ``.

    Returns
    -------
    list of str
        Their names.
    """
    environ = os.environ if environ is None else environ
    return sorted(n for n in environ if n.startswith("HOROVOD_") and n not in USED)


def warn_ignored(environ=None):
    """Warn once per process about every ``HOROVOD_*`` variable that has no effect here."""
    names = [n for n in ignored(environ) if n not in _WARNED]
    if names:
        _WARNED.update(names)
        warnings.warn(f"ccl.torch ignores {', '.join(names)} (Horovod's own settings; ccl reads "
                      f"only {', '.join(USED)})", RuntimeWarning, stacklevel=3)
