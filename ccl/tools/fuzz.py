"""Fuzzing the payload decoders: ``python -m ccl.tools.fuzz --examples N``.

docs/reliability.md promises that a decoder given *any* byte string returns a valid
result or raises :class:`ccl.PayloadError`: never another exception, a
crash, a hang or an out-of-bounds access. This module turns that promise
into hypothesis properties, used twice: briefly by the test suite
(``mpi_tests/test_hardening_fuzz.py``, every registered codec) and for many
examples by the command line, whose input counts ``docs/reliability.md``
records.

Each example is one input of one kind (:data:`KINDS`):

``random``
    arbitrary bytes;
``random-body``
    a header valid for the codec (random element count, flags and
    contributors) in front of arbitrary bytes, so the body parser meets
    garbage;
``truncate``, ``extend``
    a valid payload cut short, or with bytes appended;
``bitflip``
    a valid payload with one bit flipped;
``header``
    a valid payload with one header field (:data:`HEADER_FIELDS`) set to
    another value (boundaries, off-by-ones, random);
``body``
    a valid payload with a run of body bytes overwritten;
``body-fields``
    a valid payload whose first body bytes (where codecs keep kinds, widths
    and counts) and contributor count are set to small or extreme values, so
    combinations such as "integer lanes of width 0 for 2^32-1 contributors"
    come up.

Any of them may also be handed over as a non-contiguous ``uint8`` array (a
strided view of the same bytes), as a caller slicing a buffer would.

Valid payloads encode arrays drawn by hypothesis (sizes 0 to 300, any finite
float32, sometimes NaN) under random contexts. The property
(:func:`check_decode`) decodes with ``decode_with_header``, the collectives'
path; homomorphic codecs also add the input to a valid payload
(:func:`check_add`).
"""

import argparse
import faulthandler
import struct
import sys
import time
import traceback

import numpy as np

from ..codecs import HEADER_SIZE, CodecContext, get_codec, registered_codecs
from ..errors import PayloadError
from . import VARIANTS

try:
    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("ccl.tools.fuzz needs hypothesis: pip install 'ccl[test]'") from exc

__all__ = ["KINDS", "HEADER_FIELDS", "VARIANTS", "edit_header", "check_decode", "check_add",
           "cases", "codecs_to_fuzz", "fuzz_codec", "main"]

KINDS = ("random", "random-body", "truncate", "extend", "bitflip", "header", "body",
         "body-fields")

#: field -> (offset, struct format) in the 32-byte header (docs/wire-format.md).
HEADER_FIELDS = {
    "magic": (0, "<2s"), "version": (2, "<B"), "wire_id": (3, "<B"), "flags": (4, "<B"),
    "dtype": (5, "<B"), "reserved": (6, "<H"), "contributors": (8, "<I"),
    "config_hash": (12, "<I"), "n": (16, "<Q"), "body_len": (24, "<Q"),
}

_FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def edit_header(payload, field, value):
    """Return a copy of ``payload`` with header ``field`` set to ``value``.

    ``value`` is an int (bytes for ``magic``), wrapped to the field's width.
    A payload shorter than the field is returned unchanged (as a copy).
    """
    offset, fmt = HEADER_FIELDS[field]
    out = np.array(payload, dtype=np.uint8, copy=True)
    width = struct.calcsize(fmt)
    if out.size < offset + width:
        return out
    if field != "magic":
        value = int(value) % (1 << (8 * width))
    out[offset:offset + width] = np.frombuffer(struct.pack(fmt, value), dtype=np.uint8)
    return out


def check_decode(codec, payload, ctx=None):
    """Decode ``payload``: return the values, or None on PayloadError.

    Anything else (another exception, a result of the wrong kind or length)
    raises ``AssertionError`` or propagates, which is a failed property.
    """
    try:
        values, header = codec.decode_with_header(payload, ctx)
    except PayloadError:
        return None
    assert isinstance(values, np.ndarray), f"decode returned {type(values).__name__}"
    assert values.shape == (header.n,), f"decoded shape {values.shape}, header n={header.n}"
    assert values.dtype in _FLOAT_DTYPES, f"decoded dtype {values.dtype}"
    return values


def check_add(codec, valid, payload, ctx=None):
    """Homomorphic codecs: ``add(valid, payload)`` is PayloadError or a decodable payload."""
    for a, b in ((valid, payload), (payload, valid)):
        try:
            total = codec.add(a, b, ctx)
        except PayloadError:
            continue
        assert isinstance(total, np.ndarray) and total.dtype == np.uint8 and total.ndim == 1
        check_decode(codec, total, ctx)


def _contexts(n=None):
    """Decode contexts: none, or one with small step/key/chunk, with or without ``n``.

    ``n`` is offered as the expected count only when it is small: a receiver
    that expects 2^40 elements holds such an array itself, so allocating it
    is no fault of the decoder.
    """
    counts = st.none() if n is None or n > 1 << 16 else st.sampled_from([None, n, n + 1])
    return st.one_of(st.none(), st.builds(
        CodecContext, step=st.integers(0, 3), key=st.sampled_from([None, "w", 7]),
        chunk=st.integers(0, 3), rank=st.integers(0, 3), n=counts))


_ARRAYS = hnp.arrays(
    np.float32, st.integers(0, 300),
    elements=st.one_of(st.floats(-3.0, 3.0, width=32),
                       st.floats(allow_nan=False, allow_infinity=False, width=32)))


def _header_values(field, valid):
    """Replacement values for ``field``: boundaries, off-by-ones and random ones."""
    offset, fmt = HEADER_FIELDS[field]
    if field == "magic":
        return st.binary(min_size=2, max_size=2)
    width = struct.calcsize(fmt)
    (current,) = struct.unpack(fmt, valid[offset:offset + width].tobytes())
    top = (1 << (8 * width)) - 1
    near = [current - 1, current + 1, current * 2, current // 2, 0, 1, top, top >> 1,
            1 << 31, 1 << 32, 1 << 40]
    return st.one_of(st.sampled_from([v for v in near if 0 <= v <= top]),
                     st.integers(0, top))


@st.composite
def cases(draw, codec):
    """Hypothesis strategy: ``(kind, payload, ctx, valid)`` for ``codec``.

    ``valid`` is the valid payload the input was derived from (None for the
    ``random`` kinds); ``ctx`` is the decode context.
    """
    kind, payload, ctx, valid = draw(_case(codec))
    if draw(st.integers(0, 3)) == 0:
        payload = _strided(payload)
    return kind, payload, ctx, valid


def _strided(payload):
    """The same bytes as a non-contiguous view (every other byte of a larger buffer)."""
    buffer = np.zeros(2 * payload.size, dtype=np.uint8)
    buffer[::2] = payload
    return buffer[::2]


@st.composite
def _case(draw, codec):
    kind = draw(st.sampled_from(KINDS))
    if kind == "random":
        raw = draw(st.binary(max_size=400))
        return kind, np.frombuffer(raw, np.uint8).copy(), draw(_contexts()), None
    if kind == "random-body":
        raw = np.frombuffer(draw(st.binary(max_size=400)), np.uint8)
        n = draw(st.one_of(st.sampled_from([0, 1, raw.size, 5 * raw.size + 3, 1 << 40]),
                           st.integers(0, 4 * raw.size + 64)))
        flags = draw(st.sampled_from([0, 0, 0, 1, 2, 3, 4, 7]))
        payload = codec.pack(raw, n, flags=flags,
                             contributors=draw(st.sampled_from([1, 1, 2, 3, 255, 2**32 - 1])))
        return kind, payload, draw(_contexts(n)), None
    x = draw(_ARRAYS)
    if draw(st.integers(0, 9)) == 0 and x.size:
        x[draw(st.integers(0, x.size - 1))] = np.nan  # a flagged, header-only payload
    encode_ctx = draw(_contexts())
    valid = codec.encode(x, encode_ctx)
    ctx = encode_ctx if draw(st.booleans()) else draw(_contexts(x.size))
    size = valid.size
    if kind == "truncate":
        payload = valid[:draw(st.integers(0, size - 1))].copy()
    elif kind == "extend":
        payload = np.concatenate([valid, np.frombuffer(draw(st.binary(min_size=1,
                                                                      max_size=16)), np.uint8)])
    elif kind == "bitflip":
        payload = valid.copy()
        payload[draw(st.integers(0, size - 1))] ^= np.uint8(1 << draw(st.integers(0, 7)))
    elif kind == "header":
        field = draw(st.sampled_from(sorted(HEADER_FIELDS)))
        payload = edit_header(valid, field, draw(_header_values(field, valid)))
    elif kind == "body-fields":
        payload = edit_header(valid, "contributors",
                              draw(st.sampled_from([1, 2, 3, 2**31, 2**32 - 1])))
        if size > HEADER_SIZE:
            i = draw(st.integers(HEADER_SIZE, min(size, HEADER_SIZE + 4) - 1))
            payload[i] = draw(st.sampled_from([0, 1, 2, 4, 255]))
        if draw(st.booleans()):  # the body cut after its own header, lengths kept consistent
            keep = draw(st.sampled_from([0, 8, 16, 24, 32, 40]))
            payload = edit_header(payload[:HEADER_SIZE + keep], "body_len",
                                  min(keep, max(size - HEADER_SIZE, 0)))
    else:  # body: overwrite a run of body bytes (a header-only payload stays as it is)
        payload = valid.copy()
        if size > HEADER_SIZE:
            start = draw(st.integers(HEADER_SIZE, size - 1))
            run = np.frombuffer(draw(st.binary(min_size=1, max_size=size - start)), np.uint8)
            payload[start:start + run.size] = run
    return kind, payload, ctx, valid


def codecs_to_fuzz(ids=None):
    """Every registered codec's default configuration plus :data:`VARIANTS` (of ``ids``)."""
    ids = registered_codecs() if ids is None else list(ids)
    configs = [{"id": cid} for cid in ids]
    configs += [v for v in VARIANTS if v["id"] in ids]
    return [get_codec(c) for c in configs]


def _warm(codec):
    """Compile the codec's kernels before the per-example watchdog starts ticking."""
    x = np.linspace(-1, 1, 257, dtype=np.float32)
    payload = codec.encode(x)
    codec.decode(payload)
    if codec.homomorphic:
        codec.add(payload, payload)


def fuzz_codec(codec, examples, rng_seed=0, example_timeout=60.0):
    """Run the decoder property on ``codec`` for ``examples`` hypothesis examples.

    A single input that takes longer than ``example_timeout`` seconds (a
    hang) dumps every thread's stack and exits the process with status 1.

    Returns
    -------
    dict
        ``inputs`` (payloads decoded, shrinking included), ``results`` and
        ``payload_errors`` (how they ended), ``kinds`` (inputs per kind) and
        ``seconds``.
    """
    stats = {"inputs": 0, "results": 0, "payload_errors": 0, "kinds": dict.fromkeys(KINDS, 0)}
    _warm(codec)

    @seed(rng_seed)
    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(case=cases(codec))
    def prop(case):
        kind, payload, ctx, valid = case
        faulthandler.dump_traceback_later(example_timeout, exit=True, file=sys.__stderr__)
        try:
            # garbage decodes to garbage numbers; overflow warnings are not failures
            with np.errstate(all="ignore"):
                values = check_decode(codec, payload, ctx)
                if codec.homomorphic and valid is not None:
                    check_add(codec, valid, payload, ctx)
        finally:
            faulthandler.cancel_dump_traceback_later()
        stats["inputs"] += 1
        stats["kinds"][kind] += 1
        stats["results" if values is not None else "payload_errors"] += 1

    start = time.perf_counter()
    prop()
    stats["seconds"] = time.perf_counter() - start
    return stats


def main(argv=None):
    """Command line: fuzz every registered codec (or ``--codecs``); exit 1 on a failure."""
    parser = argparse.ArgumentParser(prog="python -m ccl.tools.fuzz", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=2000,
                        help="hypothesis examples per codec configuration (default 2000)")
    parser.add_argument("--codecs", default=None,
                        help="comma-separated codec ids (default: every registered codec)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    parser.add_argument("--example-timeout", type=float, default=60.0,
                        help="seconds one input may take before it counts as a hang")
    args = parser.parse_args(argv)
    ids = args.codecs.split(",") if args.codecs else None
    total, failed = 0, False
    started = time.perf_counter()
    print(f"{'codec':<55} {'inputs':>8} {'results':>8} {'PayloadError':>12} {'s':>7}")
    for codec in codecs_to_fuzz(ids):
        try:
            stats = fuzz_codec(codec, args.examples, args.seed, args.example_timeout)
        except Exception as exc:  # a failed property; hypothesis notes the input on exc
            print(f"{codec!r:<55} FAILED", flush=True)
            traceback.print_exception(exc, file=sys.stdout)
            failed = True
            continue
        total += stats["inputs"]
        print(f"{codec!r:<55} {stats['inputs']:>8} {stats['results']:>8} "
              f"{stats['payload_errors']:>12} {stats['seconds']:>7.1f}", flush=True)
    print(f"total: {total} inputs in {time.perf_counter() - started:.0f} s, "
          f"{'FAILED' if failed else 'no failure'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
