"""Error-feedback state: residuals per key and lossy point, and step counters.

A lossy encode at point ``(role, chunk)`` of a tensor ``key`` keeps a
residual ``e``: ``p = input + e; c = encode(p); e = p - decode(c)``. Residuals
remember the element range they belong to, so when a key's layout changes
(another algorithm, codec, rank count or chunk map) they are *flushed into
the next input* at their positions instead of being dropped: nothing is lost.
Only a change of the tensor's size or dtype drops them.

Updates are staged during a collective and committed only when it succeeds,
so a collective that raises (on every rank) leaves the state as it was.

**Learning-rate-corrected error feedback** (BytePS-Compress's "corrected"
EF). A residual holds what a step did not send, in units of the input (a
gradient or a momentum); the update it will contribute to is multiplied by
the learning rate of the step that sends it. When the rate changes from
eta(t-1) to eta(t), a residual carried over unchanged would move the
parameters by eta(t)/eta(t-1) times what was withheld. With ``lr`` set
(:meth:`ccl.Communicator.set_lr`), every key remembers the rate its
residuals were made at, and the first call at another rate scales them by
eta(t-1)/eta(t), so what they add to the update is what was withheld.
"""

import numpy as np

from ._xp import array_module, to_numpy

__all__ = ["ErrorFeedback", "KeyState", "WORKER", "RELAY", "OWNER"]

#: The three kinds of lossy point: a rank's own contribution, a partial sum
#: re-encoded on its way, and the final chunk encoded by its owner.
WORKER, RELAY, OWNER = "worker", "relay", "owner"
_ROLES = (WORKER, RELAY, OWNER)
# the dtypes a residual's layout may name
_DTYPES = (np.dtype(np.float32).str, np.dtype(np.float64).str)


class KeyState:
    """Error-feedback state of one key.

    Attributes
    ----------
    layout : tuple
        What the residuals were made for: (n, dtype, algorithm, codec hash, ranks).
    step : int
        Collectives completed with this key (seeds shared randomness).
    residuals : dict
        ``(role, chunk) -> (start, stop, array)``.
    lr : float or None
        The learning rate the residuals were made at (None: not corrected).
    """

    __slots__ = ("layout", "step", "residuals", "lr", "_pending")

    def __init__(self, layout):
        self.layout = layout
        self.step = 0
        self.residuals = {}
        self.lr = None  # the learning rate the residuals were made at (corrected EF)
        self._pending = {}

    def residual(self, point):
        """The committed residual at ``point`` (or None)."""
        entry = self.residuals.get(point)
        return None if entry is None else entry[2]

    def stage(self, point, start, stop, residual):
        """Stage a new residual for ``point``; it takes effect at :meth:`commit`."""
        self._pending[point] = (start, stop, residual)

    def commit(self, skip_chunks=()):
        """Apply the staged residuals and advance the step.

        Residuals of chunks in ``skip_chunks`` (chunks whose result is NaN
        because some rank's input was not finite) are left as they were.
        """
        for point, entry in self._pending.items():
            if point[1] not in skip_chunks:
                self.residuals[point] = entry
        self._pending = {}
        self.step += 1

    def discard(self):
        """Forget the staged residuals (the collective failed)."""
        self._pending = {}

    def rescale(self, lr):
        """Scale the residuals by ``self.lr / lr`` and remember ``lr`` (corrected EF).

        A rate of None or 0 (a schedule's first step) changes nothing: the
        residuals keep the last positive rate they were made at.
        """
        if not lr:
            return
        if self.lr is not None and self.lr != lr:
            self.scale(self.lr / lr)
        self.lr = lr

    def scale(self, factor):
        """Multiply every committed residual by ``factor`` (decayed or corrected feedback)."""
        for point, (start, stop, res) in self.residuals.items():
            self.residuals[point] = (start, stop, (res * factor).astype(res.dtype, copy=False))

    def held(self, n, dtype=np.float64, xp=np):
        """Sum of all residuals placed at their element ranges (length ``n``, module ``xp``)."""
        total = xp.zeros(n, dtype=dtype)
        for start, stop, residual in self.residuals.values():
            total[start:stop] += residual
        return total


class ErrorFeedback:
    """Error-feedback residuals and steps for many keys (one instance per Communicator)."""

    def __init__(self):
        self._keys = {}
        #: The current learning rate of learning-rate-corrected error feedback (None: off).
        self.lr = None

    def get(self, key):
        """The :class:`KeyState` of ``key`` or None."""
        return self._keys.get(key)

    def step(self, key):
        """Collectives completed with ``key`` (0 for a new key)."""
        state = self._keys.get(key)
        return 0 if state is None else state.step

    def begin(self, key, layout, x):
        """Return the key's state for a collective with ``layout`` on working input ``x``.

        If the layout changed but the size and dtype did not, the old
        residuals are added into ``x`` (which must be a private working copy)
        and cleared. Returns ``(state, x)``.
        """
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = KeyState(layout)
        state.rescale(self.lr)
        if state.layout != layout:
            old_n, old_dtype = state.layout[:2]
            new_n, new_dtype = layout[:2]
            _move_residuals(state, array_module(x))
            if state.residuals and (old_n, old_dtype) == (new_n, new_dtype):
                x = x + state.held(new_n, x.dtype, array_module(x))
            state.residuals.clear()
            state.layout = layout
        _move_residuals(state, array_module(x))
        return state, x

    def state_dict(self):
        """Return a picklable snapshot: ``{key: {"layout", "step", "lr", "residuals"}}``.

        Residual arrays are copied. Keys must be strings or other picklable
        objects; the snapshot is meant for ``torch.save``/``pickle`` of a
        checkpoint *file*, never for the wire.
        """
        out = {}
        for key, state in self._keys.items():
            out[key] = {
                "layout": tuple(state.layout),
                "step": state.step,
                "lr": state.lr,
                "residuals": {point: (start, stop, res.copy())
                              for point, (start, stop, res) in state.residuals.items()},
            }
        return out

    def load_state_dict(self, snapshot):
        """Replace the state with a snapshot from :meth:`state_dict`.

        Everything is checked before anything is replaced: on a bad snapshot
        the state stays as it was.

        Raises
        ------
        ValueError
            If the snapshot is not shaped like :meth:`state_dict` output: not a
            dict, a layout that is not one, a residual of another dtype than
            its layout's, not 1-D, of the wrong length for its range, outside
            the tensor, or holding NaN or Inf.
        """
        if not isinstance(snapshot, dict):
            raise ValueError(f"an error-feedback state is a dict of keys, got "
                             f"{type(snapshot).__name__}")
        keys = {}
        for key, entry in snapshot.items():
            try:
                keys[key] = _checked_key(key, entry)
            except (AttributeError, KeyError, TypeError, IndexError) as exc:
                raise ValueError(f"key {key!r} is not an error-feedback state: "
                                 f"{type(exc).__name__}: {exc}") from None
        self._keys = keys


def _checked_key(key, entry):
    """A :class:`KeyState` from a snapshot entry, every part validated."""
    layout = tuple(entry["layout"])
    n, dtype = layout[0], layout[1]
    if not isinstance(n, (int, np.integer)) or n < 0 or dtype not in _DTYPES:
        raise ValueError(f"key {key!r}: layout {layout!r} does not start with an element "
                         "count and a float32/float64 dtype")
    step = entry["step"]
    if not isinstance(step, (int, np.integer)) or isinstance(step, bool) or step < 0:
        raise ValueError(f"key {key!r}: step must be a non-negative int, got {step!r}")
    state = KeyState(layout)
    state.step = int(step)
    lr = entry.get("lr")
    if lr is not None and not (isinstance(lr, (int, float, np.floating)) and lr > 0
                               and np.isfinite(lr)):
        raise ValueError(f"key {key!r}: lr must be a positive number or None, got {lr!r}")
    state.lr = None if lr is None else float(lr)
    for point, (start, stop, res) in entry["residuals"].items():
        role, chunk = point
        if role not in _ROLES or not isinstance(chunk, (int, np.integer)):
            raise ValueError(f"key {key!r}: {point!r} is not a lossy point")
        if not (isinstance(start, (int, np.integer)) and isinstance(stop, (int, np.integer))
                and 0 <= start <= stop <= n):
            raise ValueError(f"key {key!r}: residual {point!r} covers {start}:{stop}, "
                             f"outside the tensor's {n} elements")
        xp = array_module(res)
        if getattr(res, "dtype", None) != np.dtype(dtype) or res.ndim != 1 \
                or res.size != stop - start:
            raise ValueError(f"key {key!r}: residual {point!r} must be a 1-D {np.dtype(dtype)} "
                             f"array of {stop - start} elements for range {start}:{stop}, got "
                             f"{getattr(res, 'dtype', type(res).__name__)} of shape "
                             f"{getattr(res, 'shape', None)}")
        if not bool(xp.isfinite(res).all()):
            raise ValueError(f"key {key!r}: residual {point!r} holds NaN or Inf")
        state.residuals[(role, int(chunk))] = (int(start), int(stop), xp.array(res, copy=True))
    return state


def _move_residuals(state, xp):
    """Put the residuals of ``state`` in module ``xp`` (a host checkpoint loaded for a GPU run)."""
    for point, (start, stop, res) in list(state.residuals.items()):
        if array_module(res) is not xp:
            state.residuals[point] = (start, stop,
                                      to_numpy(res) if xp is np else xp.asarray(res))
