"""What the codecs' device twins share: launches, device random numbers, host plumbing.

Imported only by the twins (``_<family>_cuda.py``), which
:mod:`ccl.codecs.device` imports when a device array is first encoded: a
CPU-only run never imports numba.cuda.

Each numba.cuda kernel of a twin is the device twin of a CPU kernel and
writes the same bytes: the payloads of the two paths are interchangeable,
and bit-identical wherever the codec is deterministic. Four rules keep them
so:

* every element is computed by the same scalar formula, in the same
  precision; scalar helpers are the CPU kernels' own Python functions
  (``py_func``) compiled for the device (:func:`twin`), with the helpers
  they call rebound to their device twins;
* reductions whose float result reaches the payload (onebit's ``sum|x|``,
  dithering's ``sum x**2``) reproduce the CPU kernel's summation order
  exactly: one thread per (block, accumulator) of the CPU loop, the few
  partial sums combined on the host in the CPU's order
  (:func:`ordered_total`);
* mixed float32/float64 arithmetic is written out as float64 (the simulator
  would otherwise compute it in float32, numpy's rule for Python scalars);
* no ``a * b + c`` is left to the compiler where it could be contracted
  into a fused multiply-add (NVVM contracts by default): such a sum
  multiplies with :func:`mul_rn`, which is never fused.

Kernels use grid-stride loops, so any launch shape is correct: under the
CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) :func:`launch` uses 2 blocks of
8 threads, which keeps the simulator fast and still crosses block
boundaries.
"""

import types

import numba
import numpy as np

# numba-cuda up to 0.30 registers an overload of ``np.row_stack`` when it compiles its first
# kernel; numpy 2.5 removed that name (an alias of ``np.vstack`` since numpy 1.x, deprecated
# in 2.0), so every kernel failed to compile with numpy 2.5 and numba-cuda 0.30.4 (seen on
# an H100). The alias lets such numba-cuda releases compile; newer ones never look it up.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402  (after the alias numba-cuda's kernels need)

from . import _shared_kernels as _S

__all__ = ["SIMULATOR", "launch", "launch_blocks", "device_function", "twin", "mix64",
           "mulhi64", "stream64", "uniform_below", "mul_rn", "scatter", "LOW32", "TWO32",
           "empty_body", "put", "zeros", "ordered_total"]

SIMULATOR = bool(numba.config.ENABLE_CUDASIM)
_THREADS = 8 if SIMULATOR else 256
_MAX_BLOCKS = 2 if SIMULATOR else 65535

LOW32 = np.uint64(0xFFFFFFFF)
TWO32 = 4294967296.0


def launch(be, kernel, n, *args):
    """Launch ``kernel`` on ``be``'s stream with threads for ``n`` work items (none if 0).

    Kernels loop grid-stride inside, so the grid size only affects speed.
    """
    if n:
        blocks = max(1, min(_MAX_BLOCKS, (int(n) + _THREADS - 1) // _THREADS))
        kernel[blocks, _THREADS, be.stream()](*args)


def launch_blocks(be, kernel, blocks, *args):
    """Launch ``kernel`` with a thread block for each of ``blocks`` pieces of work (none if 0).

    For kernels whose threads share a piece of work (in shared memory); they
    loop over the pieces block-stride, so any grid size is correct.
    """
    if blocks:
        kernel[max(1, min(_MAX_BLOCKS, int(blocks))), _THREADS, be.stream()](*args)


def device_function(func):
    """``func`` compiled as a numba.cuda device function."""
    return cuda.jit(device=True)(func)


def twin(func, **rebind):
    """Compile a CPU kernel's Python function for the device, its callees rebound to twins.

    ``func`` is an ``njit`` dispatcher; ``rebind`` maps the names of the
    global helpers it calls to their device functions.
    """
    py = func.py_func
    scope = dict(py.__globals__, **rebind)
    return device_function(types.FunctionType(py.__code__, scope, py.__name__, py.__defaults__,
                                              py.__closure__))


# ----------------------------------------------------------------- SplitMix64, Lemire
mix64 = device_function(_S.mix64.py_func)
mulhi64 = device_function(_S.mulhi64.py_func)
stream64 = twin(_S.stream64, mix64=mix64)
uniform_below = twin(_S.uniform_below, stream64=stream64, mulhi64=mulhi64)

if SIMULATOR:
    @device_function
    def mul_rn(a, b):
        """``a * b`` in float64, never fused into an add."""
        return a * b
else:  # pragma: no cover - needs a GPU
    from numba.cuda import libdevice

    mul_rn = libdevice.dmul_rn


# ----------------------------------------------------------------- shared kernels
@cuda.jit
def scatter(values, idx, out):
    """``out[idx[i]] = values[i]``."""
    for i in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        out[idx[i]] = values[i]


# ----------------------------------------------------------------- host plumbing
def empty_body(be):
    """An empty device body (a flagged encode's)."""
    return be.xp.empty(0, dtype=np.uint8)


def put(be, dst, host_bytes):
    """Write ``host_bytes`` (bytes or a uint8 array) into the device array ``dst``."""
    be.upload(dst, np.frombuffer(bytes(host_bytes), dtype=np.uint8))


def zeros(be, size=1, dtype=np.int32):
    """A zeroed device array: a kernel's flag or atomic result."""
    return be.xp.zeros(size, dtype=dtype)


def ordered_total(partial, lanes):
    """A CPU kernel's float64 total from its per-block lane sums, in the CPU's order.

    ``partial`` (on the host) holds ``lanes`` sums per block. The lanes of a
    block are combined pairwise (``(a0 + a1) + (a2 + a3)`` ...), then the
    blocks are added one after the other.
    """
    a = partial.reshape(-1, lanes)
    while a.shape[1] > 1:
        a = a[:, 0::2] + a[:, 1::2]
    return float(np.add.accumulate(a[:, 0])[-1]) if a.shape[0] else 0.0
