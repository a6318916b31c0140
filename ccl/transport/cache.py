"""What ccl keeps per communicator: the cache on the user's communicator, and what was measured.

Two caches, one per side of the private duplicate:

* :func:`comm_cache` is a dict kept on the *user's* communicator as an MPI
  attribute, so it is freed with it: it holds the communicator's channel
  (:func:`ccl.transport.p2p.channel`) and the module-level functions'
  error-feedback state.
* :class:`Measurements` is kept on a channel: what ``auto`` and the thread
  budget found about its ranks (the link, the latency, the share of cores,
  the codec speeds, the thread budget), found once because finding it is
  collective and takes time. The modules that find these things
  (``ccl.collectives.link``, :mod:`ccl.threads`) pass the finding as a
  callable; the cache runs it the first time and remembers the answer, so
  they never write the channel's state themselves.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable, TypeVar, cast

from mpi4py import MPI

__all__ = ["comm_cache", "Measurements"]

T = TypeVar("T")

_KEYVAL = None
# Guards the creation of the per-communicator caches (no MPI calls under it).
_CACHE_LOCK = threading.Lock()


def _delete_cache(comm, keyval, cache):
    for value in cache.values():
        try:
            free = getattr(value, "free", None)
            if free is not None:
                free()
        except Exception:  # pragma: no cover - the MPI library may be finalizing
            pass


def comm_cache(comm: MPI.Comm) -> _Cache:
    """The dict ccl keeps on the user's communicator ``comm`` (freed with it).

    Holds the :class:`~ccl.transport.p2p.Channel` under ``"channel"`` and
    whatever else ccl keeps per communicator (the module-level functions'
    error-feedback state). Values with a ``free()`` method are freed when
    ``comm`` is. Its ``lock`` attribute guards the creation of entries.
    """
    global _KEYVAL
    with _CACHE_LOCK:
        if _KEYVAL is None:
            _KEYVAL = MPI.Comm.Create_keyval(delete_fn=_delete_cache)
        cache = cast("_Cache | None", comm.Get_attr(_KEYVAL))
        if cache is None:
            cache = _Cache()
            comm.Set_attr(_KEYVAL, cache)
        return cache


class _Cache(dict):
    """What ccl keeps on one communicator, with a lock for creating its entries."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()


class Measurements:
    """What was found about one channel's ranks, found once (see the module docstring).

    Every method returns what was found before; given a callable where
    nothing was, it calls it (collectively, on every rank alike: the callers
    reach it after the call's agreement), keeps the answer and returns it.
    Without a callable it only looks (None: not found yet). The collectives
    find things while they hold the channel (``Channel.collective()``), so
    two threads never find the same thing at once.
    """

    def __init__(self) -> None:
        self._found: dict[Hashable, Any] = {}
        self._latest_profile: dict | None = None

    def _once(self, key: Hashable, find: Callable[[], T] | None) -> T | None:
        found = self._found.get(key)
        if found is None and find is not None:
            found = self._found[key] = find()
        return found

    def link(self, probe: Callable[[], tuple[float, float]] | None = None
             ) -> tuple[float, float] | None:
        """``(link_gbps, spread)`` measured between the ranks (``auto.probe_link``)."""
        return self._once("link", probe)

    def latency(self, probe: Callable[[], float] | None = None) -> float | None:
        """Seconds per step of point-to-point messages (``auto.probe_latency``)."""
        return self._once("latency", probe)

    def thread_budget(self, find: Callable[[], tuple[int | None, float]] | None = None
                      ) -> tuple[int | None, float] | None:
        """``(numba threads of this rank, smallest share of cores of any rank)``.

        :func:`ccl.threads.channel_budget` finds it at the first call.
        """
        return self._once("thread budget", find)

    def cores_share(self, find: Callable[[bool], dict] | None = None,
                    measure: bool = False) -> dict | None:
        """The agreed share of cores (:func:`ccl.threads.cores_share`'s dict).

        ``find(measure)`` runs where nothing was found, and again where
        ``measure`` asks for the other work on the machine to be measured but
        the share kept was found without (its ``other_cores`` is None).
        """
        found = self._found.get("cores share")
        if find is not None and (found is None or measure and found["other_cores"] is None):
            found = self._found["cores share"] = find(measure)
        return found

    def profile(self, given: Hashable, find: Callable[[], dict] | None = None) -> dict | None:
        """The link profile ``auto`` decides from, per link speed ``given``.

        ``ccl.collectives.link.profile`` finds it; the latest found is
        :attr:`latest_profile`.
        """
        key = ("profile", given)
        if key not in self._found and find is not None:
            self._found[key] = self._latest_profile = find()
        return self._found.get(key)

    @property
    def latest_profile(self) -> dict | None:
        """The link profile found last (``Communicator.stats()["auto"]``), or None."""
        return self._latest_profile

    def codec_speeds(self, config_hash: int,
                     find: Callable[[], tuple[str, tuple[float, float]]] | None = None
                     ) -> tuple[float, float] | None:
        """``(encode_gbps, decode_gbps)`` of the codec configuration ``config_hash``.

        ``find()`` returns ``(codec_id, speeds)``; the id names the speeds in
        :meth:`codec_speeds_found`.
        """
        found = self._once(("codec", config_hash), find)
        return None if found is None else found[1]

    def codec_speeds_found(self) -> dict[int, tuple[str, tuple[float, float]]]:
        """``{config hash: (codec id, (encode_gbps, decode_gbps))}`` of every codec timed."""
        return {key[1]: found for key, found in self._found.items()
                if isinstance(key, tuple) and key[0] == "codec"}
