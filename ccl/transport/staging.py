"""Handing device payloads to MPI: CUDA-aware detection and pinned host staging.

Each channel routes the payloads of its current collective through a
:class:`Route`: host arrays go to MPI as they are, device arrays through the
:class:`Stager` of their backend. A CUDA-aware MPI reads and writes device
memory itself: ccl gives it the device payload once the stream that produced
it has finished (``Backend.synchronize()``), because mpi4py cannot see
cupy's streams. Any other MPI gets host memory: only the *compressed*
payload is copied into a page-locked (pinned) host buffer, sent, received
into another, and copied back to the device.

Pinned buffers are expensive to allocate, so :class:`PinnedPool` keeps them
across calls, one free list per power-of-two size class. The allocator is
injected, which lets the pool and the staging logic run (and be tested)
with plain numpy buffers on a machine without a GPU.
"""

from __future__ import annotations

import ctypes
import os
from typing import Callable, Mapping

import numpy as np

from .. import config
from .._xp import Backend

__all__ = ["PinnedPool", "Stager", "Route", "cuda_aware", "detect_cuda_aware", "size_class"]

_MIN_CLASS = 1 << 12  # 4 KiB: smaller payloads share one class


def size_class(nbytes: int) -> int:
    """The buffer size that serves ``nbytes``: the next power of two, at least 4 KiB."""
    return max(_MIN_CLASS, 1 << max(0, int(nbytes) - 1).bit_length())


class PinnedPool:
    """Reusable host buffers, one free list per size class.

    Parameters
    ----------
    alloc : callable
        ``alloc(nbytes)`` returns a 1-D uint8 host buffer of ``nbytes`` bytes
        (``cupyx.empty_pinned`` on a GPU, ``numpy.empty`` in tests).

    Attributes
    ----------
    allocations : int
        Buffers allocated so far (a reused buffer is not counted again).
    """

    def __init__(self, alloc: Callable[[int], np.ndarray]) -> None:
        self._alloc = alloc
        self._free: dict[int, list[np.ndarray]] = {}  # size class -> free buffers
        self.allocations = 0

    def acquire(self, nbytes: int) -> np.ndarray:
        """A buffer of at least ``nbytes`` bytes, reused when one of its class is free.

        Returns the whole buffer; slice ``[:nbytes]`` for the payload.
        """
        cls = size_class(nbytes)
        free = self._free.get(cls)
        if free:
            return free.pop()
        self.allocations += 1
        return self._alloc(cls)

    def release(self, buf: np.ndarray) -> None:
        """Return ``buf`` (from :meth:`acquire`) for reuse."""
        self._free.setdefault(buf.size, []).append(buf)

    def held_bytes(self) -> int:
        """Bytes of free buffers kept for reuse."""
        return sum(size * len(bufs) for size, bufs in self._free.items())


class Stager:
    """Turns device payloads into MPI buffers and back, for one backend.

    Parameters
    ----------
    backend : ccl._xp.Backend
        A device backend (its ``upload``/``download``/``synchronize``).
    aware : bool
        The MPI reads device memory (CUDA-aware): no staging, only a
        stream synchronisation before each send.
    pool : PinnedPool, optional
        Where staging buffers come from (default: the backend's pinned memory).

    Staging buffers given out by :meth:`send_buffer` and :meth:`recv_buffer`
    stay in use until :meth:`release_all` (the end of the collective), when
    every request that used them has completed.
    """

    def __init__(self, backend: Backend, aware: bool, pool: PinnedPool | None = None) -> None:
        self.backend = backend
        self.aware = aware
        self.pool = PinnedPool(backend.pinned_empty) if pool is None else pool
        self._held: list[np.ndarray] = []  # given out during the current collective

    def _stage(self, nbytes):
        buf = self.pool.acquire(nbytes)
        self._held.append(buf)
        return buf[:nbytes]

    def send_buffer(self, payload):
        """What to hand to MPI to send the device ``payload``."""
        if self.aware:
            self.backend.synchronize()  # MPI cannot see the stream that wrote it
            return payload
        host = self._stage(payload.size)
        if payload.size:
            self.backend.download(payload, host)
        return host

    def recv_buffer(self, nbytes: int):
        """A buffer MPI can receive ``nbytes`` into."""
        if self.aware:
            buf = self.backend.xp.empty(nbytes, dtype=np.uint8)
            self.backend.synchronize()  # the allocation must exist before MPI writes it
            return buf
        return self._stage(nbytes)

    def finish(self, buf):
        """The device payload of a completed receive into ``buf`` (from :meth:`recv_buffer`)."""
        if self.aware:
            return buf
        out = self.backend.xp.empty(buf.size, dtype=np.uint8)
        if buf.size:
            self.backend.upload(out, buf)
        return out

    def release_all(self, reuse: bool = True) -> None:
        """Give every staging buffer back to the pool (all requests have completed).

        ``reuse=False`` forgets them instead: a send that may still read one
        keeps it alive, and the pool never hands it out again.
        """
        if reuse:
            for buf in self._held:
                self.pool.release(buf)
        self._held = []


class Route:
    """How one channel hands the payloads of its current collective to MPI.

    Host arrays go to MPI as they are. Device arrays go through the
    :class:`Stager` of their backend (and of the CUDA-aware answer), kept for
    the channel's life so that its pinned buffers are reused from call to
    call. :meth:`use` picks the route for the current collective; :meth:`end`
    goes back to host memory once the collective is over.

    Attributes
    ----------
    backend : ccl._xp.Backend or None
        The backend of the current collective's arrays (None before the
        first :meth:`use`; kept after :meth:`end`).
    """

    def __init__(self) -> None:
        self.backend: Backend | None = None
        self._stager: Stager | None = None  # None: host memory
        self._stagers: dict[tuple[str, bool], Stager] = {}

    def use(self, backend: Backend, aware: bool | None = None) -> None:
        """Route the current collective's payloads for ``backend``'s arrays.

        ``aware`` overrides the CUDA-aware detection (:func:`cuda_aware`).
        """
        self.backend = backend
        if not backend.device:
            self._stager = None
            return
        aware = cuda_aware() if aware is None else aware
        key = (backend.name, aware)
        if key not in self._stagers:
            self._stagers[key] = Stager(backend, aware)
        self._stager = self._stagers[key]

    @property
    def current(self) -> Stager | None:
        """The stager the current collective's payloads go through (None: host memory)."""
        return self._stager

    def stager(self, name: str, aware: bool) -> Stager | None:
        """The stager kept for the backend called ``name`` and ``aware`` (None: none yet)."""
        return self._stagers.get((name, aware))

    def send_buffer(self, payload):
        """What to hand to MPI to send ``payload``."""
        return payload if self._stager is None else self._stager.send_buffer(payload)

    def recv_buffer(self, nbytes: int):
        """A buffer MPI can receive ``nbytes`` into."""
        if self._stager is None:
            return np.empty(nbytes, dtype=np.uint8)
        return self._stager.recv_buffer(nbytes)

    def finish(self, buf):
        """The payload of a completed receive into ``buf`` (from :meth:`recv_buffer`)."""
        return buf if self._stager is None else self._stager.finish(buf)

    def uncompressed(self, x, run: Callable):
        """``run(array, xp)``: an MPI call on uncompressed data, where MPI can read it.

        Not CUDA-aware, the whole array crosses to the host and the result
        back (uncompressed data has no smaller payload to stage).
        """
        stager = self._stager
        if stager is None:
            return run(x, np)
        be = stager.backend
        if not stager.aware:
            return be.to_device(run(be.to_host(x), np))
        be.synchronize()
        return run(x, be.xp)

    def end(self, reuse: bool = True) -> None:
        """Go back to host memory after a collective.

        The staging buffers go back to their pool; with ``reuse=False`` (a
        send may still read one) they are forgotten instead, never handed
        out again.
        """
        stager, self._stager = self._stager, None
        if stager is not None:
            stager.release_all(reuse=reuse)


# ------------------------------------------------------------------ detection
_ENV_HINTS = (
    ("MPICH_GPU_SUPPORT_ENABLED", "1"),       # Cray MPICH
    ("MV2_USE_CUDA", "1"),                    # MVAPICH2
    ("OMPI_MCA_opal_cuda_support", "true"),   # Open MPI built with CUDA, switched on
)


def _query_library():
    """``MPIX_Query_cuda_support()`` of the loaded MPI library, or None if it has none."""
    try:
        from mpi4py import MPI

        if not MPI.Is_initialized():
            return None
        lib = ctypes.CDLL(None)  # the process's global symbols: the MPI mpi4py loaded
        query = getattr(lib, "MPIX_Query_cuda_support", None)
        if query is None:
            return None
        query.restype = ctypes.c_int
        return bool(query())
    except (OSError, ImportError, AttributeError):  # pragma: no cover - platform specific
        return None


def _memory_kinds():
    """The ``mpi_memory_alloc_kinds`` info value of MPI >= 4.1 (``""`` if unknown)."""
    try:
        from mpi4py import MPI

        info = MPI.COMM_WORLD.Get_info()
        try:
            return info.Get("mpi_memory_alloc_kinds") or ""
        finally:
            info.Free()
    except Exception:  # pragma: no cover - MPI < 4.1 or an implementation without it
        return ""


def detect_cuda_aware(environ: Mapping[str, str] | None = None,
                      query: Callable[[], bool | None] | None = None,
                      memory_kinds: Callable[[], str] | None = None) -> bool:
    """Whether the MPI library can send and receive device memory.

    The order, from the most to the least reliable (docs/gpu.md):

    1. ``CCL_CUDA_AWARE=0|1``, the user's override;
    2. the MPI 4.1 ``mpi_memory_alloc_kinds`` info key listing a ``cuda`` kind;
    3. ``MPIX_Query_cuda_support()`` of the loaded library (Open MPI, MPICH);
    4. vendor switches in the environment (Cray, MVAPICH2, Open MPI);
    5. otherwise not CUDA-aware: staging always works, a device pointer
       given to an MPI that cannot read it crashes.

    Parameters
    ----------
    environ : mapping, optional
        Defaults to ``os.environ``.
    query, memory_kinds : callable, optional
        Stand-ins for the library queries (tests).

    Raises
    ------
    ValueError
        If ``CCL_CUDA_AWARE`` is set to something other than 0 or 1.
    """
    env = os.environ if environ is None else environ
    override = config.read("CCL_CUDA_AWARE", env)
    if override is not None:
        return override
    kinds = (_memory_kinds if memory_kinds is None else memory_kinds)()
    if "cuda" in kinds.lower():
        return True
    supported = (_query_library if query is None else query)()
    if supported is not None:
        return supported
    return any(env.get(name, "").strip().lower() == value for name, value in _ENV_HINTS)


_DETECTED = None


def cuda_aware() -> bool:
    """:func:`detect_cuda_aware`, decided once per process (``CCL_CUDA_AWARE`` is read then)."""
    global _DETECTED
    if _DETECTED is None:
        _DETECTED = detect_cuda_aware()
    return _DETECTED
