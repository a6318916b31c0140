"""Error-feedback state: residuals per key and lossy point, and step counters.

A lossy encode at point ``(role, chunk)`` of a tensor ``key`` keeps a
residual ``e``: ``p = input + e; c = encode(p); e = p - decode(c)``. Residuals
remember the element range they belong to, so when a key's layout changes
(another algorithm, codec, rank count or chunk map) they are *flushed into
the next input* at their positions instead of being dropped: nothing is lost.
Only a change of the tensor's size or dtype drops them.

Updates are staged during a collective and committed only when it succeeds,
so a collective that raises (on every rank) leaves the state as it was.
"""

import numpy as np

from ._xp import array_module, to_numpy

__all__ = ["ErrorFeedback", "KeyState"]


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
    """

    __slots__ = ("layout", "step", "residuals", "_pending")

    def __init__(self, layout):
        self.layout = layout
        self.step = 0
        self.residuals = {}
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
        elif state.layout != layout:
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
        """Return a picklable snapshot: ``{key: {"layout", "step", "residuals"}}``.

        Residual arrays are copied. Keys must be strings or other picklable
        objects; the snapshot is meant for ``torch.save``/``pickle`` of a
        checkpoint *file*, never for the wire.
        """
        out = {}
        for key, state in self._keys.items():
            out[key] = {
                "layout": tuple(state.layout),
                "step": state.step,
                "residuals": {point: (start, stop, res.copy())
                              for point, (start, stop, res) in state.residuals.items()},
            }
        return out

    def load_state_dict(self, snapshot):
        """Replace the state with a snapshot from :meth:`state_dict`.

        Raises
        ------
        ValueError
            If the snapshot is not shaped like :meth:`state_dict` output.
        """
        keys = {}
        try:
            for key, entry in snapshot.items():
                state = KeyState(tuple(entry["layout"]))
                state.step = int(entry["step"])
                for point, (start, stop, res) in entry["residuals"].items():
                    res = array_module(res).array(res, copy=True)
                    if res.ndim != 1 or res.size != int(stop) - int(start):
                        raise ValueError(f"residual {point!r} of key {key!r} has {res.size} "
                                         f"elements for range {start}:{stop}")
                    state.residuals[tuple(point)] = (int(start), int(stop), res)
                keys[key] = state
        except (AttributeError, KeyError, TypeError) as exc:
            raise ValueError(f"not an error-feedback state dict: {exc}") from None
        self._keys = keys


def _move_residuals(state, xp):
    """Put the residuals of ``state`` in module ``xp`` (a host checkpoint loaded for a GPU run)."""
    for point, (start, stop, res) in list(state.residuals.items()):
        if array_module(res) is not xp:
            state.residuals[point] = (start, stop,
                                      to_numpy(res) if xp is np else xp.asarray(res))
