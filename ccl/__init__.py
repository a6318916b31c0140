"""ccl: MPI collectives that compress what they send.

>>> import ccl
>>> sorted(ccl.__all__)[:3]
['CCLError', 'Communicator', 'CompressionOverflowError']
"""

from __future__ import annotations

from typing import Iterable

from . import codecs, config
from .api import allgather, compressed_allreduce, reduce_scatter
from .communicator import Communicator
from .errors import (CCLError, CompressionOverflowError, LaunchError, MismatchError,
                     NonFiniteError, PayloadError, PeerError)

__version__ = "0.1.0"

config.warn_unknown()  # a misspelt CCL_* variable would otherwise be ignored silently

__all__ = [
    "compressed_allreduce", "reduce_scatter", "allgather", "Communicator", "codecs",
    "warmup", "config", "CCLError", "PayloadError", "MismatchError", "NonFiniteError",
    "CompressionOverflowError", "LaunchError", "PeerError", "__version__",
]


def warmup(codec_ids: Iterable[str] | None = None) -> None:
    """Compile every codec's kernels now, on tiny arrays, instead of on first use.

    Numba compiles a kernel on its first call, which can take seconds per
    kernel; compiled kernels are cached on disk (:func:`ccl._jit.cache_directory`),
    so after the first process on a machine this loads them instead. Call it
    before timing anything, and once per node before launching many ranks
    that would otherwise all compile at once.

    Parameters
    ----------
    codec_ids : iterable of str, optional
        Codecs to warm (default: every registered codec).

    Examples
    --------
    >>> import ccl
    >>> ccl.warmup(["fp16", "bf16"])
    """
    from .threads import torch_threads_kept

    with torch_threads_kept():  # numba's first parallel kernel would reset torch's count
        _compile(codec_ids)


def _compile(codec_ids: Iterable[str] | None) -> None:
    import numpy as np

    for codec_id in codec_ids or codecs.registered_codecs():
        codec = codecs.get_codec(codec_id)
        for dtype in (np.float32, np.float64):
            if np.dtype(dtype) not in codec.input_dtypes:
                continue
            # a small and a large input: some kernels switch to a parallel variant on
            # large arrays, and each variant compiles on its first call
            for n in (67, (1 << 18) + 67):
                x = np.sin(np.arange(n, dtype=dtype))
                payload = codec.encode(x)
                codec.decode(payload)
                if codec.homomorphic:
                    codec.decode(codec.add(payload, payload))
