"""The cost model's inputs for a codec: its speeds, payload bits and one-shot error.

:func:`codec_figures` gives :mod:`ccl.collectives.model` a codec's
:class:`CodecFigures`: those ``python -m ccl.bench calibrate`` measured and
kept in a per-user file (:func:`calibration_path`), else the codec's stated
one-core speeds with its one-shot error and payload bits measured on
:data:`ERROR_SAMPLE` values, once per process and configuration
(:func:`measure_figures`).
"""

import json
import os
from collections import namedtuple

import numpy as np

__all__ = ["CodecFigures", "codec_figures", "measure_figures", "calibration_path",
           "load_calibration", "save_calibration", "HEADER_BYTES", "ERROR_SAMPLE"]

#: Bytes of header per payload message (ccl's 32-byte frame and a codec's own, typically).
HEADER_BYTES = 56
#: A codec's inputs to the model: one-core encode and decode GB/s of float32 input, payload
#: bits per value of one contribution, the one-shot relative error, and whether payloads add
#: exactly (homomorphic without rounding).
CodecFigures = namedtuple("CodecFigures", ["encode_gbps", "decode_gbps", "bits", "error",
                                           "exact_sum"])

#: Elements of the sample the one-shot error is measured on where no calibration has it.
ERROR_SAMPLE = 1 << 16


_measured = {}
_calibrations = {}


def calibration_path(environ=None):
    """The per-user calibration file, beside the kernel cache: ``~/.cache/ccl/model.json``.

    ``$XDG_CACHE_HOME/ccl/model.json`` where ``XDG_CACHE_HOME`` is set.
    """
    environ = os.environ if environ is None else environ
    xdg = environ.get("XDG_CACHE_HOME", "").strip()
    if not os.path.isabs(xdg):
        xdg = os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "ccl", "model.json")


def load_calibration(path=None):
    """``{config_hash (hex): CodecFigures}`` from the calibration file; {} if there is none.

    A file that is not a calibration is ignored (the stated figures are used).
    Read once per process and file version (its modification time).
    """
    path = path or calibration_path()
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        return {}
    if _calibrations.get(path, (None,))[0] != stamp:
        try:
            with open(path) as f:
                data = json.load(f)
            found = {key: CodecFigures(*(float(value[k]) if k != "exact_sum" else
                                         bool(value[k]) for k in CodecFigures._fields))
                     for key, value in data["codecs"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            found = {}
        _calibrations[path] = (stamp, found)
    return _calibrations[path][1]


def save_calibration(found, path=None):
    """Write ``{config_hash (hex): CodecFigures}`` (with codec ids, for people) atomically."""
    path = path or calibration_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = {"codecs": {key: dict(fig._asdict()) for key, fig in found.items()}}
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return path


def measure_figures(codec, elements=ERROR_SAMPLE, timed=False, seed=7):
    """A codec's :class:`CodecFigures` measured on standard normal float32 values.

    The one-shot error and payload bits of one encode and decode of
    ``elements`` values; whether two payloads add exactly (homomorphic codecs
    whose sum decodes to the sum of the decodes); with ``timed``, one core's
    encode and decode GB/s (the best of five), else the codec's stated ones.
    Deterministic without ``timed`` (a fixed seed), so every rank finds the
    same figures.
    """
    import copy
    import time

    from .._xp import host_norm
    from ..codecs.context import CodecContext
    from ..threads import budgeted

    # a copy, so that nothing adapts the caller's codec; by value, not through the registry:
    # a user's codec need not be registered to be used in a collective
    codec = copy.deepcopy(codec)
    rng = np.random.default_rng(seed)
    x, y = (rng.standard_normal(elements).astype(np.float32) for _ in range(2))
    # what the collectives agree on first: the larger of the two inputs' statistics
    ctx = CodecContext(shared=np.maximum(codec.shared_stats(x), codec.shared_stats(y)),
                       n=elements)
    with budgeted(1):
        payload = codec.encode(x, ctx)
        decoded = np.asarray(codec.decode(payload, ctx), dtype=np.float64)
        error = host_norm(decoded - x) / host_norm(x)
        bits = (payload.size - HEADER_BYTES) * 8 / elements
        exact = False
        if codec.homomorphic:
            other = codec.encode(y, ctx)
            both = np.asarray(codec.decode(codec.add(payload, other, ctx), ctx),
                              dtype=np.float64)
            alone = decoded + np.asarray(codec.decode(other, ctx), dtype=np.float64)
            exact = bool(host_norm(both - alone) <= 1e-6 * host_norm(alone))
        speeds = (codec.encode_gbps, codec.decode_gbps)
        if timed:
            enc, dec = [], []
            for _ in range(5):
                start = time.perf_counter()
                payload = codec.encode(x)
                mid = time.perf_counter()
                codec.decode(payload)
                enc.append(mid - start)
                dec.append(time.perf_counter() - mid)
            speeds = (x.nbytes / min(enc) / 1e9, x.nbytes / min(dec) / 1e9)
    return CodecFigures(float(speeds[0]), float(speeds[1]), float(max(bits, 0.0)), error, exact)


def codec_figures(codec, calibration=None):
    """The model's inputs for ``codec``: calibrated where the file has them, else found now.

    Without a calibration of this configuration the stated speeds are used,
    and the one-shot error and bits are measured on ``ERROR_SAMPLE``
    values, once per process and configuration.
    """
    key = f"{codec.config_hash:016x}"
    calibration = load_calibration() if calibration is None else calibration
    if key in calibration:
        return calibration[key]
    if key not in _measured:
        _measured[key] = measure_figures(codec)
    return _measured[key]
