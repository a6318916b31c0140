"""One checkpoint format for everything in ``ccl.torch`` that keeps error feedback.

``DistributedOptimizer`` and ``CompressedAdam`` (under ``"ccl"`` in their
``state_dict()``), the DDP hook's :class:`~ccl.torch.DDPHookState`,
:class:`~ccl.torch.fsdp.FSDPState` and :class:`~ccl.torch.DiLoCo` save the
same entries (``save``), checked in one place (``checked``) and loaded
under one policy (``owns``, ``restore``):

- ``version`` (:data:`FORMAT_VERSION`), ``owner`` (which object saved it),
  ``rank`` and ``size`` (of the saving rank), ``layout`` (what the
  parameters and buckets were: a state of another layout is refused),
  ``steps`` (the object's step count, or None) and ``communicators`` (each
  :meth:`ccl.Communicator.state_dict` with error feedback, arrays as tensors
  so that ``torch.load(..., weights_only=True)`` reads them), then what the
  owner keeps besides (``powersgd``, DiLoCo's global weights, ...).
- **The policy.** Everything in a state is the same on every rank except the
  error-feedback residuals. A state saved by the loading rank at the same
  world size loads whole; any other (rank 0's file on every rank, or a job
  restarted at another size) loads everything else, the steps included,
  while the residuals start from zero, with one
  :class:`~ccl.torch.ResidualsNotLoadedWarning`. As with a plain ``torch.optim`` state
  dict, nothing is refused for the world size alone.

Files of an earlier format version still load: ``checked`` upgrades them.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["FORMAT_VERSION", "ResidualsNotLoadedWarning", "save", "checked", "owns", "restore",
           "load_steps", "to_torch_tree", "to_numpy_tree"]

#: Version of the checkpoint format. 1: each object had a format of its own.
FORMAT_VERSION = 2


class ResidualsNotLoadedWarning(UserWarning):
    """A checkpoint's error-feedback residuals were saved by another rank or world size.

    They are per rank, so they start from zero; everything else loaded.
    ``warnings.simplefilter("ignore", ResidualsNotLoadedWarning)`` silences
    it where that is intended (every rank loading rank 0's file).

    Examples
    --------
    >>> import warnings, ccl.torch as ct
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", ct.ResidualsNotLoadedWarning)
    ...     optimizer.load_state_dict(torch.load("opt-0.pt"))  # doctest: +SKIP
    """


def save(owner: str, *, rank: int, size: int, layout: Any, steps: int | None,
         communicators: Sequence[dict], **entries: Any) -> dict:
    """A checkpoint entry in the current format.

    Parameters
    ----------
    owner : str
        The saving object's kind (one of ``OWNERS``).
    rank, size : int
        The saving rank and the world size (of its process set).
    layout : object
        Compared at load time: a value of plain Python types.
    steps : int or None
        The owner's step count.
    communicators : sequence of dict
        :meth:`ccl.Communicator.state_dict` of each communicator with error
        feedback (numpy arrays: stored as tensors).
    **entries
        What the owner keeps besides (tensors, numbers, lists, dicts).

    Returns
    -------
    dict
    """
    return {"version": FORMAT_VERSION, "owner": owner, "rank": int(rank), "size": int(size),
            "layout": layout, "steps": steps,
            "communicators": [to_torch_tree(c) for c in communicators], **entries}


# What version 1 called the common entries, per owner: {version 2 name: version 1 name}.
_V1 = {"DistributedOptimizer": {"layout": "buckets", "steps": "steps"},
       "CompressedAdam": {"layout": "params", "steps": "step"},
       "DDPHookState": {"layout": None, "steps": "steps"},
       "FSDPState": {"layout": "modules", "steps": None},
       "DiLoCo": {"layout": "layout", "steps": "step"}}


def _upgrade(state: dict, owner: str) -> dict:
    """A version-1 state of ``owner`` in the current format."""
    names = _V1[owner]
    entry = {k: v for k, v in state.items() if k not in names.values()
             and k != "communicator"}
    entry.update(version=FORMAT_VERSION, owner=owner)
    for new, old in names.items():
        entry[new] = None if old is None else state[old] if new == "layout" else state.get(old)
    if owner != "FSDPState":  # FSDP's was a list already
        entry["communicators"] = [state["communicator"]]
    return entry


def checked(state: Any, owner: str, *, layout: Any = None,
            layout_error: str = "the state was saved over other parameters",
            codecs: Sequence[dict] = ()) -> dict:
    """Validate a saved state for ``owner``; return it in the current format.

    Parameters
    ----------
    state : dict
        What the owner's ``state_dict()`` returned (or its ``"ccl"`` entry),
        of any format version, possibly after ``torch.load``.
    owner : str
        The loading object's kind.
    layout : object, optional
        This object's layout; None: not compared.
    layout_error : str
        The message when the layouts differ (``{saved}``: the saved layout).
    codecs : sequence of dict
        The codec configuration of each communicator with error feedback.

    Returns
    -------
    dict
        The state in the current format (the owner's own entries as saved).

    Raises
    ------
    ValueError
        If it is not a state of ``owner``, of a format version this ccl does
        not read, of another layout, or saved with other codecs.
    """
    what = f"not a ccl {owner} state (what {owner}.state_dict() returns)"
    if not isinstance(state, dict) or "version" not in state:
        raise ValueError(what)
    version = state["version"]
    if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise ValueError(f"ccl checkpoint format version {version!r} is not supported (this "
                         f"ccl reads versions 1 to {FORMAT_VERSION})")
    try:
        entry = _upgrade(state, owner) if version == 1 else dict(state)
        saved_owner, rank, size = entry["owner"], int(entry["rank"]), int(entry["size"])
        communicators = list(entry["communicators"])
        saved_codecs = [c["codec"] for c in communicators]
    except (KeyError, TypeError, ValueError):
        raise ValueError(what) from None
    if saved_owner != owner:
        raise ValueError(f"this is a checkpoint of a ccl {saved_owner}, not of a {owner}")
    if rank < 0 or size <= rank:
        raise ValueError(f"{what}: rank {rank} of {size}")
    if layout is not None and entry["layout"] != layout:
        raise ValueError(layout_error.format(saved=entry["layout"]))
    if len(saved_codecs) != len(codecs):
        raise ValueError(f"the state holds {len(saved_codecs)} communicators' error feedback, "
                         f"this {owner} has {len(codecs)}")
    for saved_codec, codec in zip(saved_codecs, codecs, strict=True):
        if saved_codec != codec:
            raise ValueError(f"the state was saved with codec {saved_codec!r}, this {owner} "
                             f"uses {codec!r}")
    return entry


def owns(entry: dict, rank: int, size: int, stacklevel: int = 3) -> bool:
    """Whether ``entry``'s residuals are this rank's; else warn once that they start from zero.

    Parameters
    ----------
    entry : dict
        What :func:`checked` returned.
    rank, size : int
        The loading rank and the world size (of its process set).
    stacklevel : int
        Of the warning (1: this function): the user's call to ``load_state_dict``.

    Returns
    -------
    bool
    """
    saved = (entry["rank"], entry["size"])
    if saved == (rank, size):
        return True
    warnings.warn(f"error-feedback residuals saved by rank {saved[0]} of {saved[1]} are not "
                  f"loaded on rank {rank} of {size} (they are per rank): residuals start from "
                  "zero, the steps are kept and everything else is loaded. To keep them, "
                  "load each rank's own state at the same world size",
                  ResidualsNotLoadedWarning, stacklevel=stacklevel)
    return False


def to_torch_tree(obj):
    """numpy arrays -> tensors in a nested structure (checkpoints load with weights_only)."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.array(obj, copy=True))
    if isinstance(obj, dict):
        return {k: to_torch_tree(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(to_torch_tree(v) for v in obj)
    return obj


def to_numpy_tree(obj):
    """Tensors -> numpy arrays in a nested structure (the inverse of :func:`to_torch_tree`)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().numpy().copy()
    if isinstance(obj, dict):
        return {k: to_numpy_tree(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(to_numpy_tree(v) for v in obj)
    return obj


def load_steps(communicator, state):
    """Load another rank's :meth:`ccl.Communicator.state_dict`: every key's step, no residual.

    Every rank's keys are at the same step (the ranks agree on it at every
    call), so a checkpoint saved on one rank gives every rank the steps it
    needs; residuals are per rank and start from zero.

    Parameters
    ----------
    communicator : ccl.Communicator
    state : dict
        Its ``state_dict()`` saved on another rank (arrays as tensors or numpy).
    """
    feedback = {key: {**entry, "residuals": {}} for key, entry in state["feedback"].items()}
    communicator.feedback.load_state_dict(feedback)


def restore(communicator: Any, saved: dict, own: bool) -> None:
    """Load a communicator's saved state: all of it if ``own``, else every key's step.

    Parameters
    ----------
    communicator : ccl.Communicator
    saved : dict
        Its ``state_dict()`` (arrays as tensors or numpy).
    own : bool
        What :func:`owns` returned.
    """
    if own:
        communicator.load_state_dict(to_numpy_tree(saved))
    else:
        load_steps(communicator, saved)

