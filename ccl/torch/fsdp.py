"""ccl codecs inside PyTorch FSDP2 (``fully_shard``): compressed gradients and weights.

:func:`~ccl.torch.fsdp_compress` walks a model sharded with ``fully_shard``
and installs, on every FSDP module, ccl's reduce-scatter for its gradients
(``set_custom_reduce_scatter``) and, on request, ccl's all-gather for its
weights (``set_custom_all_gather``); FSDP's process group then carries none
of that traffic, which runs on a private duplicate of ``ccl.torch``'s MPI
communicator. FSDP is told to reduce with sums and a divide factor of 1
(``set_force_sum_reduction_for_comms``, ``set_gradient_divide_factor``) so
that the mean is ccl's and the gradients are divided once.

Error feedback is keyed by the module's qualified name in the model (and,
across replicas, by its shard), not by the order FSDP runs modules in: the
keys stay the same when the model is wrapped again the same way, which is
what a checkpoint needs.

Two-level sharding (HSDP, the scheme of ZeRO++ and SDP4Bit): modules
``fully_shard``-ed on the shard dimension of a 2-D mesh (each replica holds
the whole model, sharded over its own ranks) reduce-scatter exactly inside
the replica and average each shard across replicas with ``codec``, in an
all-reduce hook (``set_all_reduce_hook``).
"""

import collections
import weakref
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..agreement import agree
from ..api import Communicator
from ..codecs import get_codec
from ..collectives import REDUCE_SCATTER, Options
from ..transport import channel
from .engine import Engine
from . import checkpoint
from .runtime import current

__all__ = ["fsdp_compress", "FSDPState", "WEIGHT_ERROR_LIMIT"]

_OWNER = "FSDPState"  # of its checkpoint entry

#: A weights codec must round a Gaussian probe with at most this relative error (L2) in one
#: encode: weights are gathered without error feedback, so what a codec drops is lost for the
#: step. Casts and unbiased quantizers (fp16, bf16, dithering, thc) pass; sign, three-level
#: and sparsifying codecs (onebit, 3lc, topk, randomk, ...) are refused.
WEIGHT_ERROR_LIMIT = 0.5

# The Communicator arguments fsdp_compress passes on (the op is always the mean).
_OPTIONS = ("partition_bytes", "min_compress_bytes", "segment_bytes", "link_gbps",
            "cross_algorithm", "check_finite", "timeout")
_COLLECTIVES = ("reduce_scatter", "all_gather", "all_reduce")


def _fsdp_module_type():
    from torch.distributed.fsdp import FSDPModule

    return FSDPModule


def _weights_codec(codec):
    """The validated weights codec (None: FSDP's own exact all-gather)."""
    if codec is None:
        return None
    codec = get_codec(codec)
    probe = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    error = np.linalg.norm(codec.decode(codec.encode(probe)) - probe) / np.linalg.norm(probe)
    if not error <= WEIGHT_ERROR_LIMIT:
        raise ValueError(f"all_gather_codec {codec.get_config()!r} loses {error:.0%} of a "
                         f"weight in one encode (weights are gathered without error feedback; "
                         f"at most {WEIGHT_ERROR_LIMIT:.0%}): use a cast (\"bf16\", \"fp16\") "
                         "or an unbiased quantizer (\"thc\", \"dithering\")")
    return codec


class _Engine(Engine):
    """An engine whose communicator is the parent of others, freed with it (collective)."""

    #: FSDP's own collectives keep the ranks in step: no step check when freed
    checks_steps = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.children = []  # communicators made from self.comm

    def close(self):
        """Free the children, then the engine's communicator (collective)."""
        if not self.closed:
            for child in self.children:
                child.Free()
            self.children = []
        super().close()


def _name(qualified):
    return qualified or "(root)"


def _units(model):
    """``[(name, module, param_group)]`` of every FSDP module of ``model`` that holds parameters.

    Raises
    ------
    TypeError
        If no module of ``model`` was ``fully_shard``-ed.
    ValueError
        For a module FSDP2 cannot give a custom collective (several parameter
        groups) or one sharded on a 2-D mesh (native HSDP).
    """
    fsdp_module = _fsdp_module_type()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"fsdp_compress() takes a torch.nn.Module, got {type(model).__name__}")
    units = []
    for qualified, module in model.named_modules():
        if not isinstance(module, fsdp_module):
            continue
        groups = module._get_fsdp_state()._fsdp_param_groups
        if len(groups) > 1:
            raise ValueError(f"module {_name(qualified)!r} has {len(groups)} FSDP parameter "
                             "groups (a shard_placement_fn with several meshes): FSDP2 takes "
                             "one custom collective per module")
        if groups and groups[0]._is_hsdp:
            raise ValueError(f"module {_name(qualified)!r} is sharded on a 2-D mesh (native "
                             "HSDP, whose all-reduce FSDP runs itself, uncompressed): "
                             "fully_shard it on the shard dimension only (mesh['shard']); "
                             "fsdp_compress averages the shards across replicas with ccl")
        units.append((_name(qualified), module, groups[0] if groups else None))
    if not units:
        raise TypeError(f"no module of this {type(model).__name__} was wrapped by "
                        "torch.distributed.fsdp.fully_shard: call fully_shard(block) on its "
                        "blocks and fully_shard(model) before fsdp_compress()")
    return units


def _shape(units, rank, size):
    """Each unit's shard group as ranks, and how it repeats: what every rank must agree on.

    Returns
    -------
    ranks : list of tuple of int or None
        The ranks of each unit's reduce-scatter group (None: no parameters).
    layout : list
        Per unit: the group's size, this rank's place in it, and the first unit
        with the same group (or None); equal on every rank of a valid setup.
    """
    ranks, layout, first = [], [], {}
    for _, _, group in units:
        if group is None:
            ranks.append(None)
            layout.append(None)
            continue
        members = tuple(dist.get_process_group_ranks(group._reduce_scatter_process_group))
        if rank not in members:
            raise ValueError(f"this process (rank {rank}) is not in its FSDP group {members}")
        ranks.append(members)
        layout.append((len(members), first.setdefault(members, len(ranks) - 1)))
    return ranks, layout


class FSDPState:
    """What :func:`~ccl.torch.fsdp_compress` installed: communicators, error feedback, stats.

    Checkpoint it with :meth:`state_dict` on every rank (residuals are per
    rank) and restore it with :meth:`load_state_dict` before training goes on.
    """

    def __init__(self, runtime, units, ranks, codec, weights, algorithm, options):
        # torch's interfaces of custom collectives came with FSDP2 (not in every torch)
        from .fsdp_comms import CclAllGather, CclAllReduceHook, CclReduceScatter, Tally

        self.rank, self.size = runtime.rank, runtime.size
        self.codec, self.weights_codec = codec, weights
        # a private communicator, freed with ccl.torch (its thread, if any, stays idle:
        # FSDP calls the collectives synchronously, from its own thread)
        self.engine = _Engine(runtime, codec, "auto", "mean", **options)
        weakref.finalize(self, self.engine.retire)
        self.tally = Tally(_COLLECTIVES)
        # the collectives FSDP holds keep this state (and so its communicators) alive as
        # long as the model uses them, kept by the caller or not
        self.tally.owner = self
        self.hsdp = False
        comms, made, keyed = {}, [], []
        self._gathers = []  # the weights' communicators
        self._parameters = []  # where each module's parameters lie in its shard

        def communicator(comm, codec_, algorithm_, feedback=False):
            c = Communicator(comm, codec_, algorithm=algorithm_, op="mean", **options)
            made.append(c)
            if feedback:  # its residuals go into checkpoints
                keyed.append(c)
            return c

        world = self.engine.comm
        self.modules = []
        for (name, module, group), members in zip(units, ranks):
            if group is None:
                continue
            if members not in comms:  # the same group as an earlier unit on every rank
                comms[members] = self._comms(world, members, communicator, codec, weights,
                                             algorithm)
            grads, exact_rs, cross, exact_cross, gather = comms[members]
            self.modules.append(name)
            module.set_force_sum_reduction_for_comms(True)
            module.set_gradient_divide_factor(1.0)
            if cross is None:
                reduce = CclReduceScatter(name, grads, self.tally, name, group, exact_rs)
                self._parameters.append(reduce.parameters)
                module.set_custom_reduce_scatter(reduce)
            else:
                self.hsdp = True
                shard = members.index(self.rank)
                module.set_custom_reduce_scatter(CclReduceScatter(name, exact_rs, self.tally,
                                                                  None))
                hook = CclAllReduceHook(name, cross, self.tally,
                                        f"{name} shard {shard} of {len(members)}", group,
                                        exact_cross)
                self._parameters.append(hook.parameters)
                module.set_all_reduce_hook(hook)
            if gather is not None:
                module.set_custom_all_gather(CclAllGather(name, gather, self.tally))
        self._communicators, self._keyed = made, keyed

    def _comms(self, world, members, communicator, codec, weights, algorithm):
        """One shard group's communicators: gradients, exact, across replicas (two), weights."""
        if len(members) == self.size:
            shard, cross = world, None
        else:
            # collective on every rank: one group per replica, one across them per shard
            shard = world.Split(min(members), key=self.rank)
            cross = world.Split(members.index(self.rank), key=self.rank)
            self.engine.children += [shard, cross]
        # exact: inside a replica (HSDP), and the parameters too small to compress
        if cross is None:
            grads = communicator(shard, codec, algorithm, feedback=True)
            exact = communicator(shard, "none", "ring")
            cross_comm = exact_cross = None
        else:
            grads = None
            exact = communicator(shard, "none", "ring")
            cross_comm = communicator(cross, codec, algorithm, feedback=True)
            exact_cross = communicator(cross, "none", "auto")
        gather = None
        if weights is not None:
            # a communicator of its own: its call count seeds the codec's randomness (no
            # key), and a checkpoint restores it
            gather = communicator(shard.Dup(), weights, "auto")
            self.engine.children.append(gather.comm)
            self._gathers.append(gather)
        return grads, exact, cross_comm, exact_cross, gather

    @property
    def communicators(self) -> list[Communicator]:
        """list of ccl.Communicator: every communicator installed (their ``stats()``)."""
        return list(self._communicators)

    def stats(self) -> dict:
        """What this rank sent through ccl, in total, per collective and per FSDP module.

        Returns
        -------
        dict
            ``bytes_sent`` (payload bytes), ``bytes_gradients`` (reduce-scatter
            and cross-replica all-reduce), ``bytes_weights`` (all-gather),
            ``collectives`` (``{collective: bytes}``), ``calls``
            (``{collective: calls}``), ``modules`` (``{module name:
            {collective: bytes}}``) and ``algorithms`` (``{algorithm: calls}``,
            ``auto`` resolved, over every communicator).
        """
        totals = self.tally.totals()
        algorithms = collections.Counter()
        for c in self._communicators:
            algorithms.update(c.stats()["algorithms"])
        return {"bytes_sent": sum(totals.values()),
                "bytes_gradients": totals["reduce_scatter"] + totals["all_reduce"],
                "bytes_weights": totals["all_gather"],
                "collectives": totals, "calls": dict(self.tally.calls),
                "modules": {name: dict(counts) for name, counts in self.tally.modules.items()},
                "algorithms": dict(algorithms)}

    def state_dict(self) -> dict:
        """This rank's error-feedback state, for a checkpoint (:mod:`ccl.torch.checkpoint`).

        Returns
        -------
        dict
            The entries of :mod:`ccl.torch.checkpoint` (``layout``: the FSDP
            modules' names; ``communicators``: the residuals of each
            communicator that keeps them, as tensors, so that
            ``torch.load(..., weights_only=True)`` reads it), ``gathers``
            (the weight all-gathers run so far, per communicator: they seed
            the weights codec's randomness, so a restored run rounds the
            weights as the original run did) and ``per_parameter`` (each
            parameter reduced by a call of its own, under its own key; a
            state without it continues with one call per module).
        """
        return checkpoint.save(_OWNER, rank=self.rank, size=self.size,
                               layout=list(self.modules), steps=None,
                               communicators=[c.state_dict() for c in self._keyed],
                               gathers=[channel(c.comm).calls for c in self._gathers],
                               per_parameter=all(p.split for p in self._parameters))

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output, before training goes on.

        Saved by this rank at this world size, training continues bit for
        bit; otherwise the residuals start from zero, with one warning, and
        the rest loads.

        Parameters
        ----------
        state : dict
            What :meth:`state_dict` returned.

        Raises
        ------
        ValueError
            If ``state`` is not an FSDP state of a format version this ccl
            reads, or was saved with another codec or other modules.
        """
        entry = checkpoint.checked(
            state, _OWNER, layout=list(self.modules),
            layout_error="this state was saved for the FSDP modules {saved}; these are "
                         f"{self.modules}",
            codecs=[c.codec.get_config() for c in self._keyed])
        try:
            gathers = [int(calls) for calls in entry["gathers"]]
        except (KeyError, TypeError, ValueError):
            raise ValueError("not a ccl FSDPState state (what FSDPState.state_dict() "
                             "returns)") from None
        if len(gathers) != len(self._gathers):
            raise ValueError(f"this state was saved with {len(gathers)} weight all-gathers' "
                             f"communicators, these modules have {len(self._gathers)}")
        own = checkpoint.owns(entry, self.rank, self.size)
        # States saved before ccl reduced each parameter with a call of its own (no
        # "per_parameter") go on as they were saved: one call, one key per module.
        for parameters in self._parameters:
            parameters.split = bool(entry.get("per_parameter", False))
        for c, calls in zip(self._gathers, gathers, strict=True):  # the same on every rank
            channel(c.comm).resume_calls(calls)
        for c, saved in zip(self._keyed, entry["communicators"], strict=True):
            checkpoint.restore(c, saved, own)


def fsdp_compress(model: torch.nn.Module, codec: Any = None, all_gather_codec: Any = None,
                  algorithm: str = "auto", **options: Any) -> FSDPState:
    """Compress FSDP2's gradients (and weights) with ccl codecs (collective).

    Installs ccl's reduce-scatter on every ``fully_shard``-ed module of
    ``model`` (its gradients are averaged with ``codec``, error feedback per
    module) and, with ``all_gather_codec``, ccl's all-gather of its weights.
    Every rank calls it, after ``fully_shard`` and before training, in the
    same order as the other collectives of ``ccl.torch``. Ranks of FSDP's
    process group must be those of ``ccl.torch`` (the same world).

    Parameters
    ----------
    model : torch.nn.Module
        A model whose blocks (and usually itself) were ``fully_shard``-ed.
    codec : Codec, str, dict or None
        How gradients are compressed (see :func:`ccl.codecs.get_codec`);
        ``None`` or ``"none"``: exact (FSDP2's result to float rounding).
        Modules sharded on one dimension of a 2-D mesh (HSDP) reduce-scatter
        exactly inside their replica and average each shard across replicas
        with ``codec``.
    all_gather_codec : Codec, str, dict or None
        How weights are gathered before forward and backward; ``None``:
        FSDP's own exact all-gather. No error feedback: casts (``"bf16"``,
        ``"fp16"``) and unbiased quantizers (``"thc"``, ``"dithering"``)
        only, see :data:`~ccl.torch.fsdp.WEIGHT_ERROR_LIMIT`.
    algorithm : {"auto", "ring", "direct"}
        Reduce-scatter algorithm (see :func:`ccl.reduce_scatter`); with HSDP
        the cross-replica allreduce's (see :func:`ccl.compressed_allreduce`).
    **options
        ``partition_bytes``, ``min_compress_bytes``, ``segment_bytes``,
        ``link_gbps``, ``cross_algorithm``, ``check_finite`` or ``timeout``,
        as for :class:`ccl.Communicator`.

    Returns
    -------
    FSDPState
        ``stats()``, ``state_dict()``, ``load_state_dict()``.

    Raises
    ------
    RuntimeError
        If :func:`ccl.torch.init` was not called.
    TypeError, ValueError
        Bad arguments, a model without ``fully_shard``-ed modules, a weights
        codec that loses too much, ranks of FSDP's group that are not ccl's
        (on the rank concerned).
    ccl.MismatchError
        On the other ranks, or if ranks passed different arguments.

    Examples
    --------
    >>> import ccl.torch as ct                              # doctest: +SKIP
    >>> from torch.distributed.fsdp import fully_shard      # doctest: +SKIP
    >>> for block in model.blocks:                          # doctest: +SKIP
    ...     fully_shard(block)
    >>> fully_shard(model)                                  # doctest: +SKIP
    >>> state = ct.fsdp_compress(model, codec="thc", all_gather_codec="bf16")  # doctest: +SKIP
    """
    runtime = current()
    signature, error, units, ranks = None, None, None, None
    try:
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise TypeError(f"fsdp_compress() got unknown options {unknown}; it takes "
                            f"{', '.join(_OPTIONS)} (the op is always the mean)")
        valid = Options.make(codec, "mean", algorithm, **options)
        if algorithm != "auto" and algorithm not in REDUCE_SCATTER:
            raise ValueError(f"fsdp_compress() reduce-scatters: algorithm must be 'auto' or "
                             f"one of {', '.join(sorted(REDUCE_SCATTER))}; got {algorithm!r}")
        weights = _weights_codec(all_gather_codec)
        if not dist.is_initialized():
            raise RuntimeError("FSDP needs its own torch.distributed process group: call "
                               "dist.init_process_group(..., rank=ct.rank(), "
                               "world_size=ct.size()) before fully_shard")
        if (dist.get_rank(), dist.get_world_size()) != (runtime.rank, runtime.size):
            raise ValueError(f"torch.distributed's rank {dist.get_rank()} of "
                             f"{dist.get_world_size()} is not ccl.torch's rank {runtime.rank} "
                             f"of {runtime.size}: init the process group with rank=ct.rank(), "
                             "world_size=ct.size()")
        units = _units(model)
        ranks, layout = _shape(units, runtime.rank, runtime.size)
        signature = (valid.codec.get_config(),
                     None if weights is None else weights.get_config(), algorithm,
                     sorted(options.items()), [name for name, _, _ in units], layout)
    except (TypeError, ValueError, RuntimeError) as exc:
        error = exc
    agree(runtime.comm, "fsdp_compress", [("arguments", signature)], error)
    return FSDPState(runtime, units, ranks, valid.codec, weights, algorithm, options)
