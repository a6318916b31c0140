"""``DiLoCo``: local steps, then a compressed outer step on the averaged pseudo-gradient.

Where the link is slow, synchronising every step costs more than any codec
can save. DiLoCo (Douillard et al., 2023) lets every rank take ``H`` steps of
its own inner optimizer, then averages the **pseudo-gradient**
``delta = theta_global - theta_local`` over the ranks and takes one outer
step on the global weights::

    delta   = mean over ranks of (theta_global - theta_local)
    buf     = mu * buf + delta                       # outer momentum
    theta_global -= outer_lr * (delta + mu * buf)    # Nesterov (buf without it)
    theta_local   = theta_global                     # every rank starts again from it

The average is a keyed :meth:`ccl.Communicator.allreduce`: compressed with
any codec, error feedback kept per fragment and bucket (SparseLoCo's top-k
with 2-bit values, the ``sparseloco`` codec, with its decayed error feedback,
``error_decay``; OpenDiLoCo's int8 and Streaming DiLoCo's 4-bit outer
gradients are all one codec away). ccl's results are bitwise identical on
every rank, and so are the global weights and the outer momentum after each
outer step: every rank applies the same operations to the same numbers.

**Fragments** (Streaming DiLoCo). With ``fragments=F`` the parameters are cut
into F consecutive groups of about equal size; fragment ``f`` synchronises
after the inner steps ``t`` with ``t % H == (f * H) // F`` (``t`` counted
from 1), so each parameter is synchronised exactly once per ``H`` steps and a
sync sends 1/F of the model.

**Overlap.** With a delay ``d > 0`` a fragment's allreduce runs in the
background thread of ``ccl.torch``'s engine while the next ``d``
inner steps go on; its outer step is applied after inner step ``t0 + d``
(waiting there if the allreduce is not done yet: the delay is fixed, so every
rank applies it at the same step). The ``d`` local steps taken meanwhile are
kept: ``theta_local += theta_global_new - theta_local(t0)``. Without
``MPI_THREAD_MULTIPLE`` the allreduce runs when it is applied (same results,
no overlap).
"""

import weakref
import zlib

import torch

from ..agreement import agree
from ..codecs import get_codec
from ..collectives import ALGORITHM_NAMES
from .buckets import plan_buckets
from .diloco_plan import check_integer, check_number, check_replica, split_fragments, trainable
from .engine import Engine, Job, release
from . import checkpoint
from .functions import broadcast_parameters, from_array, to_array
from .runtime import current

__all__ = ["DiLoCo", "split_fragments"]

_OWNER = "DiLoCo"  # of its checkpoint entry


class _Sync:
    """One fragment's outer synchronisation in flight: started at ``start``, due at ``due``."""

    __slots__ = ("fragment", "start", "due", "buckets")

    def __init__(self, fragment, start, due, buckets):
        # buckets: [(members, sent flat tensor, Job)]
        self.fragment, self.start, self.due, self.buckets = fragment, start, due, buckets


class DiLoCo:
    """Inner steps on every rank, an outer Nesterov step on the compressed average every H.

    A wrapper around any ``torch.optim`` optimizer (collective to make and
    to step). :meth:`step` takes one inner step; after the inner steps
    listed in the module docstring (:mod:`ccl.torch.diloco`) a fragment's
    pseudo-gradient is averaged over the ranks, compressed, and the outer
    step is applied to its global weights, which the local weights then
    restart from.

    Parameters
    ----------
    model : torch.nn.Module
        The replica of this rank. Its trainable parameters are broadcast from
        rank 0 here, so every rank starts from the same global weights. Not
        wrapped in DDP or FSDP (refused: :func:`ccl.torch.diloco_plan.check_replica`).
    inner_optimizer : torch.optim.Optimizer
        Any optimizer over (some of) the model's parameters, e.g. AdamW;
        learning-rate schedulers act on it as usual.
    sync_every : int
        H, the inner steps between two syncs of a fragment, >= 1.
    outer_lr : float
        Learning rate of the outer SGD step, >= 0 (DiLoCo: 0.7).
    outer_momentum : float
        Momentum of the outer step, in [0, 1).
    nesterov : bool
        Nesterov momentum (DiLoCo's outer optimizer) or heavy ball.
    codec : Codec, str, dict or None
        How pseudo-gradients are compressed (default ``"thc"``); None:
        uncompressed (exact DiLoCo).
    fragments : int
        F, 1 <= F <= min(H, number of parameters): Streaming DiLoCo's
        fragments, synchronised at staggered steps.
    overlap : bool or int
        The delay ``d`` in inner steps between a fragment's sync and its
        outer step, during which the allreduce runs in the background.
        ``True``: ``max(1, H // (2 F))``; ``False`` or 0: applied at once;
        an int: that many steps, ``0 <= d < H``.
    named_parameters : iterable of (str, torch.nn.Parameter), optional
        Default ``model.named_parameters()``: the parameters synchronised
        (trainable ones), their order and names.
    algorithm : str
        Algorithm of the allreduces (see :func:`ccl.compressed_allreduce`).
        ``"auto"`` on one node of several ranks runs ``hierarchical``, exact
        inside the node: name one (e.g. ``ccl.collectives.auto.fitting``) to
        compress on one machine.
    min_compress_bytes : int
        Buckets smaller than this go uncompressed (default 0: all compressed).
    fusion_threshold_bytes : int
        Each fragment's pseudo-gradient is reduced in buckets of one dtype of
        at most this many bytes (default 64 MiB), one keyed allreduce each.
    error_decay : float
        beta in [0, 1]: before each sync the error-feedback residuals of the
        fragment are multiplied by it (SparseLoCo's ``e = beta e + delta``);
        1 (the default) keeps them whole, so nothing is lost.

    Raises
    ------
    RuntimeError
        If :func:`ccl.torch.init` was not called.
    TypeError, ValueError
        Bad arguments (on the rank that passed them).
    ccl.MismatchError
        On the other ranks, or if ranks' parameters or options differ.

    Examples
    --------
    >>> import torch, ccl.torch as ct
    >>> ct.init()
    >>> model = torch.nn.Linear(4, 2)
    >>> opt = ct.DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
    ...                 sync_every=2, codec=None, overlap=False)
    >>> for _ in range(2):
    ...     model(torch.ones(3, 4)).sum().backward()
    ...     opt.step()
    ...     opt.zero_grad()
    >>> opt.communication_stats()["outer_steps"]
    1
    """

    def __init__(self, model, inner_optimizer, *, sync_every, outer_lr=0.7, outer_momentum=0.9,
                 nesterov=True, codec="thc", fragments=1, overlap=True, named_parameters=None,
                 algorithm="auto", min_compress_bytes=0,
                 fusion_threshold_bytes=64 * 1024 * 1024, error_decay=1.0):
        runtime = current()
        error, signature = None, None
        try:
            check_number("error_decay", error_decay, 0.0, 1.0)
            self.error_decay = error_decay
            signature = self._plan(model, inner_optimizer, sync_every, outer_lr,
                                   outer_momentum, nesterov, codec, fragments, overlap,
                                   named_parameters, algorithm, min_compress_bytes,
                                   fusion_threshold_bytes) + (repr(error_decay),)
        except (TypeError, ValueError) as exc:
            error = exc
        agree(runtime.comm, "DiLoCo", [("arguments", signature)], error)
        self.rank, self.size = runtime.rank, runtime.size
        broadcast_parameters(list(zip(self.names, self.params)), root_rank=0)
        with torch.no_grad():
            self.globals = [p.detach().clone() for p in self.params]
        self.momenta = [torch.zeros_like(p) for p in self.params]
        self.steps, self.outer_steps, self.pending = 0, 0, []
        self.engine = Engine(runtime, self.codec, algorithm, "mean",
                             min_compress_bytes=min_compress_bytes)
        self.communicator = self.engine.communicator
        weakref.finalize(self, release, [], self.engine)

    def _plan(self, model, inner, sync_every, outer_lr, outer_momentum, nesterov, codec,
              fragments, overlap, named_parameters, algorithm, min_compress, threshold):
        """Validate the arguments, fix parameters, fragments and buckets; return the signature."""
        check_replica(model)
        if not isinstance(inner, torch.optim.Optimizer):
            raise TypeError(f"inner_optimizer must be a torch.optim.Optimizer, got "
                            f"{type(inner).__name__}")
        check_integer("sync_every", sync_every, 1)
        check_number("outer_lr", outer_lr, 0.0)
        check_number("outer_momentum", outer_momentum, 0.0, 1.0)
        if outer_momentum == 1:
            raise ValueError("outer_momentum must be < 1, got 1")
        if not isinstance(nesterov, bool):
            raise TypeError(f"nesterov must be True or False, got {nesterov!r}")
        if algorithm not in ALGORITHM_NAMES:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHM_NAMES)}; "
                             f"got {algorithm!r}")
        check_integer("min_compress_bytes", min_compress, 0)
        check_integer("fusion_threshold_bytes", threshold, 0)
        self.codec = get_codec(codec)
        named = trainable(model, named_parameters)
        check_integer("fragments", fragments, 1)
        if fragments > min(sync_every, len(named)):
            raise ValueError(f"fragments must be at most sync_every ({sync_every}) and the "
                             f"number of parameters ({len(named)}); got {fragments}")
        if isinstance(overlap, bool):
            delay = max(1, sync_every // (2 * fragments)) if overlap else 0
        else:
            check_integer("overlap", overlap, 0)
            delay = overlap
        if delay >= sync_every:
            raise ValueError(f"overlap (a delay of {delay} inner steps) must be less than "
                             f"sync_every ({sync_every}): a fragment's outer step must land "
                             "before its next sync")
        self.names, self.params = [n for n, _ in named], [p for _, p in named]
        self.inner, self.sync_every, self.delay = inner, sync_every, delay
        self.outer_lr, self.outer_momentum, self.nesterov = outer_lr, outer_momentum, nesterov
        groups = split_fragments([p.numel() for p in self.params], fragments)
        self.offsets = [f * sync_every // fragments for f in range(fragments)]
        # each fragment's buckets: one dtype each, at most `threshold` bytes
        self.fragments = []
        for members in groups:
            entries = [(self.params[i].numel() * self.params[i].element_size(),
                        self.params[i].dtype) for i in members]
            self.fragments.append([[members[j] for j in bucket]
                                   for bucket in plan_buckets(entries, max(threshold, 1))])
        layout = [(n, tuple(p.shape), str(p.dtype)) for n, p in named]
        self.layout_hash = zlib.crc32(repr((layout, self.fragments, sync_every,
                                            delay)).encode("utf-8"))
        return (layout, self.fragments, sync_every, repr(outer_lr), repr(outer_momentum),
                nesterov, self.codec.get_config(), delay, algorithm, min_compress, threshold)

    # ------------------------------------------------------------------ training
    @property
    def param_groups(self):
        """The inner optimizer's parameter groups (what schedules and clipping see)."""
        return self.inner.param_groups

    def zero_grad(self, set_to_none=True):
        """The inner optimizer's ``zero_grad``.

        Parameters
        ----------
        set_to_none : bool
            As ``torch.optim.Optimizer.zero_grad``.
        """
        self.inner.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        """One inner step; then start the fragments due to sync, apply those due (collective).

        Parameters
        ----------
        closure : callable, optional
            Passed to the inner optimizer's ``step``.

        Returns
        -------
        object
            What the inner optimizer's ``step`` returned.
        """
        loss = self.inner.step() if closure is None else self.inner.step(closure)
        self.steps += 1
        phase = self.steps % self.sync_every
        with torch.no_grad():
            for f, offset in enumerate(self.offsets):
                if offset == phase:
                    self._start(f)
            self._apply_due(self.steps)
        return loss

    def flush(self):
        """Apply every outer step still in flight now, waiting for its allreduce (collective).

        For the end of training: afterwards every synchronised fragment's local
        weights include their last outer step.
        """
        with torch.no_grad():
            self._apply_due(None)

    def synchronize(self):
        """Wait until the allreduces in flight have finished, without applying them.

        Their outer steps are still applied when due (Horovod's
        ``optimizer.synchronize()`` waits alike). For measurements that must
        not let a sync's transfer run on into untimed work, such as an
        evaluation; training needs no call of it.
        """
        for sync in self.pending:
            for _, _, job in sync.buckets:
                self.engine.wait(job)

    def _start(self, f):
        """Start fragment ``f``'s allreduces of the pseudo-gradient, one per bucket."""
        buckets = []
        for b, members in enumerate(self.fragments[f]):
            sent = torch.cat([(self.globals[i] - self.params[i]).reshape(-1)
                              for i in members])
            key = f"diloco.fragment{f}.bucket{b}"
            state = self.communicator.feedback.get(key)
            if state is not None and self.error_decay != 1:
                state.scale(self.error_decay)  # its last allreduce was applied: nothing in flight
            job = Job(to_array(sent), key)
            self.engine.submit(job)
            buckets.append((members, sent, job))
        self.pending.append(_Sync(f, self.steps, self.steps + self.delay, buckets))

    def _apply_due(self, step):
        """Apply, in start order, the syncs due by ``step`` (None: all of them)."""
        while self.pending and (step is None or self.pending[0].due <= step):
            sync = self.pending[0]
            for _, _, job in sync.buckets:
                self.engine.wait(job)
            error = next((job.error for _, _, job in sync.buckets if job.error), None)
            self.pending.pop(0)
            if error is not None:  # every rank's allreduce raised: nothing applied
                raise error
            for members, sent, job in sync.buckets:
                self._outer_step(members, sent, from_array(job.result, like=sent))
            self.outer_steps += 1

    def _outer_step(self, members, sent, mean):
        """The outer SGD step of one bucket (torch.optim.SGD's arithmetic, dampening 0)."""
        start = 0
        for i in members:
            p, g, buf = self.params[i], self.globals[i], self.momenta[i]
            n = p.numel()
            delta = mean[start:start + n].view(p.shape)
            if self.delay:  # keep the local steps taken since the sync
                local_then = g - sent[start:start + n].view(p.shape)
            start += n
            if self.outer_momentum:
                buf.mul_(self.outer_momentum).add_(delta)
                step = delta.add(buf, alpha=self.outer_momentum) if self.nesterov else buf
            else:
                step = delta
            g.add_(step, alpha=-self.outer_lr)
            if self.delay:
                p.add_(g - local_then)
            else:
                p.copy_(g)

    # ---------------------------------------------------------------- inspection
    def global_parameters(self):
        """The global weights, as of the last outer step of each fragment.

        Returns
        -------
        list of (str, torch.Tensor)
            Name and global tensor (not a copy: do not modify it), in the order
            of the synchronised parameters. Bitwise identical on every rank.
        """
        return list(zip(self.names, self.globals))

    def communication_stats(self):
        """Counters of this rank.

        Returns
        -------
        dict
            ``step`` (inner steps), ``outer_steps`` (fragment syncs applied),
            ``pending`` (syncs in flight), ``params``, ``fragments``,
            ``buckets`` (allreduces of one sync of every fragment), ``delay``
            (overlap, in inner steps), ``reductions`` (allreduces started) and
            ``bytes_sent`` (payload bytes this rank put on the wire, ccl's own
            count).
        """
        return {"step": self.steps, "outer_steps": self.outer_steps,
                "pending": len(self.pending), "params": len(self.params),
                "fragments": len(self.fragments),
                "buckets": sum(len(b) for b in self.fragments), "delay": self.delay,
                "reductions": self.engine.reductions,
                "bytes_sent": self.communicator.stats()["bytes_sent"]}

    # --------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """The outer state: global weights, momenta, step, syncs in flight, residuals.

        Collective while a sync is in flight (its allreduce is completed here,
        not applied). The local weights are the model's: save
        ``model.state_dict()`` too.

        Returns
        -------
        dict
            The entries of :mod:`ccl.torch.checkpoint` (``steps``: inner
            steps; ``communicators``: this rank's residuals as tensors,
            readable by ``torch.load(..., weights_only=True)``) and
            ``inner`` (the inner optimizer's state dict), ``globals``,
            ``momenta``, ``outer_steps`` and ``pending`` (per sync in
            flight: fragment, start and due steps, what was sent and the
            average). Save it on every rank.
        """
        pending = []
        self.synchronize()
        for sync in self.pending:
            error = next((job.error for _, _, job in sync.buckets if job.error), None)
            if error is not None:
                raise error
            pending.append({"fragment": sync.fragment, "start": sync.start, "due": sync.due,
                            "sent": [sent.clone() for _, sent, _ in sync.buckets],
                            "mean": [from_array(job.result, like=sent).clone()
                                     for _, sent, job in sync.buckets]})
        return checkpoint.save(_OWNER, rank=self.rank, size=self.size, layout=self.layout_hash,
                               steps=self.steps,
                               communicators=[self.communicator.state_dict()],
                               outer_steps=self.outer_steps, inner=self.inner.state_dict(),
                               globals=[g.clone() for g in self.globals],
                               momenta=[m.clone() for m in self.momenta], pending=pending)

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a :meth:`state_dict`: training continues bit-identically on the saving rank.

        Syncs in flight here are completed first (collective then). The
        global weights, momenta and steps (the same on every rank) load at
        any rank and world size; residuals saved by another rank or at
        another size start from zero, with one warning
        (:mod:`ccl.torch.checkpoint`).

        Parameters
        ----------
        state_dict : dict
            What :meth:`state_dict` returned.

        Raises
        ------
        ValueError
            If it is not a DiLoCo state, was saved over other parameters,
            fragments or delay, or with another codec.
        """
        entry = checkpoint.checked(
            state_dict, _OWNER, layout=self.layout_hash,
            layout_error="the state was saved by a DiLoCo over other parameters, fragments, "
                         "sync_every or overlap",
            codecs=[self.codec.get_config()])
        own = checkpoint.owns(entry, self.rank, self.size)
        self.flush()  # nothing of this run may land after the load
        self.inner.load_state_dict(entry["inner"])
        with torch.no_grad():
            for ours, theirs in zip(self.globals + self.momenta,
                                    list(entry["globals"]) + list(entry["momenta"]), strict=True):
                ours.copy_(theirs)
        self.steps, self.outer_steps = int(entry["steps"]), int(entry["outer_steps"])
        self.pending = []
        for saved in entry["pending"]:
            buckets = []
            for members, sent, mean in zip(self.fragments[saved["fragment"]], saved["sent"],
                                           saved["mean"], strict=True):
                job = Job(None, None)  # already done: its result is the saved average
                job.result = to_array(mean.clone())
                job.done.set()
                buckets.append((members, sent.clone(), job))
            self.pending.append(_Sync(int(saved["fragment"]), int(saved["start"]),
                                      int(saved["due"]), buckets))
        checkpoint.restore(self.communicator, entry["communicators"][0], own)
