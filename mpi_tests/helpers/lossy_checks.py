"""Checks shared by the lossy codecs' tests: error-feedback loops (as the collectives run
them at one lossy point), parallel-versus-serial kernels, unaligned payloads."""

import numpy as np

from ccl.codecs import CodecContext


def run_error_feedback(codec, d, steps, seed=0, on_step=None):
    """Run ``p = x + e; c = encode(p); e = p - decode(c)`` on fresh N(0, 1) float32 inputs.

    The residual is kept in float64 (so ``p - decode(c)`` is exact) and every
    step uses ``CodecContext(step=t)``, as a collective does. Checks
    conservation: the decoded outputs plus the final residual sum to the
    inputs, to float64 rounding.

    Parameters
    ----------
    on_step : callable, optional
        Called as ``on_step(t, x, p, y, e)`` after each step.

    Returns
    -------
    dict
        ``max_abs_x`` and ``max_norm_x`` (over all steps), ``abs_e`` and
        ``norm_e`` (per step: max|e| and ||e||_2 after the step).
    """
    rng = np.random.default_rng(seed)
    e = np.zeros(d)
    total_in = np.zeros(d)
    total_out = np.zeros(d)
    abs_e, norm_e = np.empty(steps), np.empty(steps)
    max_abs_x = max_norm_x = 0.0
    for t in range(steps):
        x = rng.standard_normal(d).astype(np.float32)
        p = x + e
        ctx = CodecContext(step=t)
        y = codec.decode(codec.encode(p, ctx), ctx)
        e = p - y
        total_in += x
        total_out += y
        abs_e[t], norm_e[t] = np.abs(e).max(), np.linalg.norm(e)
        max_abs_x = max(max_abs_x, float(np.abs(x).max()))
        max_norm_x = max(max_norm_x, float(np.linalg.norm(x)))
        if on_step is not None:
            on_step(t, x, p, y, e)
    scale = max(1.0, float(np.abs(total_in).max()))
    np.testing.assert_allclose(total_out + e, total_in, rtol=0, atol=1e-9 * steps * scale)
    return {"max_abs_x": max_abs_x, "max_norm_x": max_norm_x, "abs_e": abs_e, "norm_e": norm_e}


def check_parallel_matches_serial(monkeypatch, codec, x, ctx=None):
    """Encode and decode ``x`` with the parallel kernels and again all serial: identical bytes.

    ``x`` should be larger than ``PARALLEL_MIN_SIZE`` so the parallel kernels run.
    """
    from ccl.codecs import _shared_kernels

    assert x.size >= _shared_kernels.PARALLEL_MIN_SIZE
    payload = codec.encode(x, ctx)
    decoded = codec.decode(payload, ctx)
    monkeypatch.setattr(_shared_kernels, "PARALLEL_MIN_SIZE", 1 << 62)
    np.testing.assert_array_equal(codec.encode(x, ctx), payload)
    np.testing.assert_array_equal(codec.decode(payload, ctx), decoded)
    return payload, decoded


def check_unaligned_decode(codec, x, ctx=None):
    """A payload at an odd address (as sliced from a receive buffer) decodes the same."""
    payload = codec.encode(x, ctx)
    buf = np.empty(payload.size + 1, np.uint8)[1:]
    buf[:] = payload
    np.testing.assert_array_equal(codec.decode(buf, ctx), codec.decode(payload, ctx))
