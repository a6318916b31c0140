"""Horovod's ``HOROVOD_*`` environment variables: the ones with a meaning here, and a warning.

Read by ``ccl.torch``:

``HOROVOD_FUSION_THRESHOLD`` (bytes)
    the default bucket size cap of :func:`~ccl.torch.DistributedOptimizer`
    (``fusion_threshold_bytes``);
``HOROVOD_TIMELINE`` (a file)
    records a timeline from ``init`` to ``shutdown`` (see
    :func:`~ccl.torch.start_timeline`; ``CCL_TIMELINE`` is its twin);
``HOROVOD_STALL_CHECK_TIME_SECONDS``, ``HOROVOD_STALL_CHECK_DISABLE``
    the period of ccl's stall inspector (:mod:`ccl.transport.waits`), where
    ``CCL_STALL_CHECK_SECONDS`` is not set: a rank that waits that long in a
    collective warns which ranks have not joined it (disabled: never).

Every other ``HOROVOD_*`` variable set in the environment has no effect on
``ccl.torch``: :func:`warn_ignored` says so once, with the reason where one
is known (:data:`REASONS`; ``HOROVOD_CYCLE_TIME``: ccl starts a collective
when it is submitted, there is no cycle to time).

>>> fusion_threshold({"HOROVOD_FUSION_THRESHOLD": "1048576"}, default=64)
1048576
>>> ignored({"HOROVOD_CYCLE_TIME": "5", "HOROVOD_FUSION_THRESHOLD": "1"})
['HOROVOD_CYCLE_TIME']
>>> stall_check({"HOROVOD_STALL_CHECK_TIME_SECONDS": "30"})
30.0
>>> stall_check({"HOROVOD_STALL_CHECK_DISABLE": "1"})
inf
"""

import math
import os
import warnings

from .. import config

__all__ = ["fusion_threshold", "stall_check", "ignored", "warn_ignored", "USED", "REASONS"]

#: The variables ``ccl.torch`` reads.
USED = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_TIMELINE", "HOROVOD_STALL_CHECK_TIME_SECONDS",
        "HOROVOD_STALL_CHECK_DISABLE")
#: Why some of the others have no effect here.
REASONS = {
    "HOROVOD_CYCLE_TIME": "ccl starts each collective when it is submitted, not on a cycle",
    "HOROVOD_TIMELINE_MARK_CYCLES": "ccl has no cycles to mark",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "CCL_TIMEOUT ends a stalled job",
    "HOROVOD_HIERARCHICAL_ALLREDUCE": "algorithm='auto' runs hierarchically where it pays",
    "HOROVOD_AUTOTUNE": "algorithm='auto' decides per call from measured link and codec speeds",
    "HOROVOD_CPU_OPERATIONS": "ccl runs on MPI only",
    "HOROVOD_CONTROLLER": "ccl runs on MPI only",
}

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


def stall_check(environ=None):
    """The stall inspector's period Horovod's variables in ``environ`` ask for, or None.

    ``math.inf`` (never warn) when ``HOROVOD_STALL_CHECK_DISABLE`` is on;
    a value that is not a switch or seconds >= 0 raises ``ValueError``.
    """
    environ = os.environ if environ is None else environ
    if config.switch(environ.get("HOROVOD_STALL_CHECK_DISABLE"),
                     "HOROVOD_STALL_CHECK_DISABLE"):
        return math.inf
    value = environ.get("HOROVOD_STALL_CHECK_TIME_SECONDS")
    return config.period_seconds(value, "HOROVOD_STALL_CHECK_TIME_SECONDS")


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
        why = "".join(f"; {n}: {REASONS[n]}" for n in names if n in REASONS)
        warnings.warn(f"ccl.torch ignores {', '.join(names)} (Horovod's own settings; ccl reads "
                      f"only {', '.join(USED)}){why}", RuntimeWarning, stacklevel=3)
