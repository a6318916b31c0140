"""ccl codecs inside ``DistributedDataParallel``: a communication hook.

DDP cuts the gradients into buckets and hands each one, once it is ready in
backward, to its communication hook, which returns a future of the averaged
bucket. :func:`ccl_comm_hook`, with its :class:`DDPHookState`, averages the
bucket with ccl's compressed allreduce, in ccl's background thread and on a private
duplicate of ``ccl.torch``'s communicator: DDP's process group (gloo, NCCL,
MPI) carries nothing of it, so any ccl codec runs whatever its backend.

Error feedback is kept per bucket, keyed by the parameters the bucket holds,
not by its index: DDP rebuilds its buckets after the first iteration (in the
order gradients became ready), so an index can name other parameters from
one iteration to the next. Parameters are numbered in the order the hook
first sees them, which is the same on every rank and in every run (DDP's
first buckets follow the model's registration order), and a bucket is
reduced with its parameters in the order of their numbers: the same
parameters give the same key and the same flat layout whatever order DDP
puts them in. Residuals of buckets that DDP no longer builds are dropped.
"""

import warnings
import weakref
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..agreement import agree
from ..api import Communicator
from ..collectives import Options
from .buckets import work_dtype
from .engine import STEP, Engine, Job, StepCheck
from . import checkpoint
from .functions import from_array, to_array
from .powersgd import PowerSGDJob, bucket_of, powersgd_method
from .runtime import current

__all__ = ["ddp_comm_hook", "DDPHookState", "ccl_comm_hook"]

_OWNER = "DDPHookState"  # of its checkpoint entry

# The Communicator arguments the hook passes on (op is always "mean": DDP averages).
_OPTIONS = ("partition_bytes", "min_compress_bytes", "segment_bytes", "link_gbps",
            "cross_algorithm", "check_finite", "timeout")


def _key(numbers):
    """``"params 0-3,7"`` for the sorted integers ``[0, 1, 2, 3, 7]``: a short, readable key."""
    parts, start = [], None
    for i, n in enumerate(numbers):
        if start is None:
            start = n
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            parts.append(str(n) if start == n else f"{start}-{n}")
            start = None
    return "params " + ",".join(parts)


class DDPHookState:
    """The state of :func:`ccl_comm_hook`: communicator, error feedback, parameter numbers.

    As torch pairs ``PowerSGDState`` with ``powerSGD_hook``:
    ``model.register_comm_hook(DDPHookState("thc"), ccl_comm_hook)`` makes
    ``DistributedDataParallel`` average each gradient bucket with ccl's
    compressed allreduce (op mean), with error feedback per bucket, on
    ``ccl.torch``'s own communicator, in ccl's background thread, whatever
    backend DDP's process group uses. Every rank makes it, in the same
    order as the other collectives of ``ccl.torch``
    (:func:`~ccl.torch.ddp_comm_hook` returns it with the hook).
    Checkpoint it with :meth:`state_dict` on every rank (residuals are per
    rank) and restore it with :meth:`load_state_dict` before training goes on.

    Parameters
    ----------
    codec : Codec, str, dict, PowerSGD or None
        How gradients are compressed (see :func:`ccl.codecs.get_codec`);
        ``"none"`` or ``None`` sends them uncompressed. ``"powersgd"``,
        ``{"id": "powersgd", ...}`` or a :class:`~ccl.torch.PowerSGD` reduce
        each bucket with PowerSGD (its ``P`` and ``Q`` with its inner codec).
    algorithm : {"auto", "ring", "tree", "direct", "allgather", "hierarchical"}
        Allreduce algorithm (see :func:`ccl.compressed_allreduce`).
    **options
        ``partition_bytes``, ``min_compress_bytes``, ``segment_bytes``,
        ``link_gbps``, ``cross_algorithm``, ``check_finite`` or ``timeout``,
        as for :class:`ccl.Communicator` (buckets below
        ``min_compress_bytes``, 65536 by default, go uncompressed).
    *legacy
        Deprecated: the constructor's former signature, ``DDPHookState(runtime,
        codec, algorithm, options)``, warns and still works.

    Raises
    ------
    RuntimeError
        If :func:`ccl.torch.init` was not called.
    TypeError, ValueError
        Bad arguments (on the rank that passed them).
    ccl.MismatchError
        On the other ranks, or if ranks passed different arguments.

    Examples
    --------
    >>> import torch, ccl.torch as ct
    >>> ct.init()
    >>> state = ct.DDPHookState("thc", "ring", min_compress_bytes=0)
    >>> state.communicator.codec.codec_id
    'thc'
    >>> ddp.register_comm_hook(state, ct.ccl_comm_hook)  # doctest: +SKIP
    """

    def __init__(self, codec: Any, algorithm: str = "auto", *legacy: Any,
                 **options: Any) -> None:
        if hasattr(codec, "comm") and legacy:  # DDPHookState(runtime, codec, algorithm, options)
            warnings.warn("DDPHookState(runtime, codec, algorithm, options) is deprecated: "
                          "call DDPHookState(codec, algorithm, **options)", DeprecationWarning,
                          stacklevel=2)
            powersgd = legacy[2] if len(legacy) > 2 else options.get("powersgd")
            runtime, codec, algorithm, options = codec, algorithm, legacy[0], legacy[1]
        elif legacy:
            raise TypeError("DDPHookState() takes the codec and the algorithm positionally, "
                            "the Communicator options by keyword")
        else:
            runtime, (codec, options, powersgd) = current(), _validate(codec, algorithm, options)
        self.rank, self.size = runtime.rank, runtime.size
        self.powersgd = powersgd
        self.engine = Engine(runtime, codec, algorithm, "mean", **options)
        self.engine.what = "the DDP hook"  # its steps: backward passes
        # gone on every rank: the communicator is freed at the next collective point
        weakref.finalize(self, self.engine.retire)
        self._numbers = {}  # id(parameter) -> its number, in the order the hook saw them
        self._seen = []  # the parameters themselves, so that their ids stay theirs
        self._pass_keys = {}  # key -> parameter numbers, of the backward pass in progress
        self._live = None  # the same for the last complete backward pass
        self._restored = None  # the groups of parameters of a loaded state
        self._held = set()  # keys that may hold residuals
        self._pass_over = True
        self._last = None  # the last job submitted
        self._check = None  # the step check of the backward pass in progress
        self._error = None  # the first error of the pass in progress, raised at its end

    @property
    def communicator(self) -> Communicator:
        """The :class:`ccl.Communicator` the buckets are averaged with (its ``stats()``)."""
        return self.engine.communicator

    def _number(self, param):
        number = self._numbers.get(id(param))
        if number is None:
            number = self._numbers[id(param)] = len(self._seen)
            self._seen.append(param)
        return number

    def key(self, bucket: dist.GradBucket) -> str:
        """The error-feedback key of a bucket: the numbers of its parameters.

        Parameters
        ----------
        bucket : torch.distributed.GradBucket
            What DDP hands the hook.

        Returns
        -------
        str
            ``"params 0-3,7"``: the same for the same parameters, whatever
            the bucket's index or the order of its parameters.
        """
        return _key(sorted(self._number(p) for p in bucket.parameters()))

    def _start_pass(self):
        """A new backward pass: check the ranks' passes; forget residuals of unbuilt buckets."""
        self._wait()
        self._check = StepCheck(self.engine.what, STEP, self.engine.steps)
        self.engine.submit(self._check)
        self._error = None
        if self._live is not None and self._held - set(self._live):
            # once, after DDP rebuilt its buckets (the snapshot copies every residual)
            feedback = self.engine.communicator.feedback
            held = feedback.state_dict()
            feedback.load_state_dict({k: v for k, v in held.items()
                                      if bucket_of(k) in self._live})
            if self.powersgd is not None:
                self.powersgd.keep(self._live)
            self._held = set(self._live)
        self._pass_keys = {}
        self._pass_over = False

    def _wait(self):
        if self._last is not None:
            self.engine.wait(self._last)

    def _groups(self, numbers):
        """The parameter numbers reduced together: the bucket, or the restored buckets in it.

        After :meth:`load_state_dict`, DDP starts again from its first
        buckets, which may hold other parameters than the buckets whose
        residuals were saved (it rebuilds them after the first iteration). A
        bucket made of saved buckets is reduced as those buckets, so the run
        goes on as if it had not stopped; what is left over is one more group.
        """
        whole = tuple(sorted(numbers))
        if self._restored is None or whole in self._restored:
            return [whole]
        members, groups = set(whole), []
        for group in self._restored:
            if members.issuperset(group):
                groups.append(group)
                members.difference_update(group)
        if members:
            groups.append(tuple(sorted(members)))
        return groups

    def reduce(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Start averaging ``bucket`` over all ranks; return the future of the average.

        Parameters
        ----------
        bucket : torch.distributed.GradBucket
            What DDP hands the hook.

        Returns
        -------
        torch.futures.Future
            Resolves to the bucket's buffer, overwritten with the average.

        Raises
        ------
        Exception
            For the pass's last bucket, once every bucket is reduced: what a
            collective of the pass raised (on every rank alike; a
            :class:`ccl.CCLError` for ccl's own errors). A future's error
            would reach the user as an uncatchable ``RuntimeError: Unable to
            cast ... to Tensor``; raised here, it leaves ``backward()`` as it
            is. DDP cannot go on after an error in a hook: rebuild it.
        RuntimeError
            If this state already serves another DDP model.
        """
        if self._live is not None and any(id(p) not in self._numbers
                                          for p in bucket.parameters()):
            raise RuntimeError("this ccl DDP hook state is registered on another "
                               "DistributedDataParallel model already (its error feedback "
                               "would be dropped at every pass of the other): call "
                               "ccl.torch.ddp_comm_hook() once per model")
        if self._pass_over:
            self._start_pass()
        buffer = bucket.buffer()
        # each parameter's slice of the flat buffer, by the parameter's number
        where, offset, shapes = {}, 0, {}
        for p in bucket.parameters():
            where[self._number(p)] = (offset, p.numel())
            shapes[self._number(p)] = p.shape
            offset += p.numel()
        groups = self._groups(where)
        for group in groups:
            self._pass_keys[_key(group)] = group
            self._held.add(_key(group))
        last = bucket.is_last()
        if last:
            self._live, self._pass_over = dict(self._pass_keys), True
        dtype = work_dtype(buffer.dtype)
        future = torch.futures.Future()
        pending = [len(groups), None]  # jobs not done yet, the first error

        def reduce_group(group):
            offsets = [where[n][0] for n in group]
            in_place = len(groups) == 1 and dtype == buffer.dtype and offsets == sorted(offsets)
            x = buffer if in_place else torch.cat(
                [buffer[where[n][0]:where[n][0] + where[n][1]] for n in group]).to(dtype)

            def done(job):
                # runs in the communication thread: errors are kept for the pass's last
                # bucket to raise, the future always gets the buffer
                try:
                    if job.error is not None:
                        raise job.error
                    result = from_array(job.result, like=x)
                    if in_place:
                        buffer.copy_(result)
                    else:
                        at = 0
                        for n in group:
                            start, size = where[n]
                            buffer[start:start + size].copy_(result[at:at + size])
                            at += size
                except BaseException as exc:
                    self._error = self._error or exc
                pending[0] -= 1  # jobs finish one at a time, in one thread
                if pending[0] == 0:
                    future.set_result(buffer)

            if self.powersgd is not None:
                job = PowerSGDJob(self.powersgd, x, _key(group), [shapes[n] for n in group],
                                  self.engine.steps, on_done=done)
            else:
                job = Job(to_array(x), _key(group), on_done=done)
            job.gate = self._check  # ranks at other passes: no collective, the check's error
            self.engine.submit(job)
            self._last = job

        for group in groups:
            reduce_group(group)
        if not self.engine.threaded or last:
            # no background thread: reduce now, in this thread; the last bucket: raise
            # the pass's error here, with its own type
            self.engine.wait(self._last)
        if last:
            future.wait()  # its job's callback, which keeps the error, has run too
            self.engine.steps += self._error is None
            error, self._error = self._error, None
            if error is not None:
                raise error
        return future

    def state_dict(self) -> dict:
        """This rank's error-feedback state, for a checkpoint (:mod:`ccl.torch.checkpoint`).

        Returns
        -------
        dict
            The entries of :mod:`ccl.torch.checkpoint` (the communicator's
            residuals of the last backward pass's buckets as tensors, so that
            ``torch.load(..., weights_only=True)`` reads it) and ``buckets``
            (the parameter numbers of each of those buckets).
        """
        self._wait()
        state = self.engine.communicator.state_dict()
        if self._live is not None:
            state["feedback"] = {k: v for k, v in state["feedback"].items()
                                 if bucket_of(k) in self._live}
        layout = self._live.values() if self._live is not None else self._restored or ()
        extra = {} if self.powersgd is None else {"powersgd": self.powersgd.state_dict(self._live)}
        return checkpoint.save(_OWNER, rank=self.rank, size=self.size, layout=None,
                               steps=self.engine.steps, communicators=[state],
                               buckets=[list(group) for group in layout], **extra)

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output, before training goes on.

        Saved by this rank at this world size, training continues bit for
        bit; otherwise the residuals start from zero, with one warning, and
        the rest loads (every rank may load rank 0's state).

        Parameters
        ----------
        state : dict
            What :meth:`state_dict` returned.

        Raises
        ------
        ValueError
            If ``state`` is not a hook state, is of a format version this ccl
            does not read, or was saved with another codec.
        """
        entry = checkpoint.checked(state, _OWNER,
                                   codecs=[self.engine.communicator.codec.get_config()])
        try:
            groups = [tuple(int(n) for n in group) for group in entry["buckets"]]
        except (KeyError, TypeError, ValueError):
            raise ValueError("not a ccl DDPHookState state (what DDPHookState.state_dict() "
                             "returns)") from None
        if (self.powersgd is None) != ("powersgd" not in entry):
            raise ValueError("the state was saved by a hook "
                             f"{'with' if 'powersgd' in entry else 'without'} PowerSGD, this "
                             f"one {'uses' if self.powersgd is not None else 'does not use'} it")
        if self.powersgd is not None:
            self.powersgd.check_state(entry["powersgd"])
        own = checkpoint.owns(entry, self.rank, self.size)
        self._wait()
        # every rank loads the same buckets, also where its residuals do not apply
        self._restored = groups or None
        if entry["steps"] is not None:
            self.engine.steps = int(entry["steps"])
        communicator = entry["communicators"][0]
        checkpoint.restore(self.engine.communicator, communicator, own)
        if self.powersgd is not None:
            self.powersgd.load_state_dict(entry["powersgd"], own)
            self._held |= set(entry["powersgd"]["residuals"])
        self._held |= set(communicator["feedback"])


def _validate(codec, algorithm, options):
    """Check the arguments on every rank (collective); return the codec, options, PowerSGD."""
    runtime = current()
    signature, error = None, None
    try:
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise TypeError(f"DDPHookState() got unknown options {unknown}; it takes "
                            f"{', '.join(_OPTIONS)} (the op is always the mean)")
        powersgd = powersgd_method(codec)
        valid = Options.make(codec if powersgd is None else powersgd.inner, "mean", algorithm,
                             **options)
        signature = ((powersgd or valid.codec).get_config(), algorithm,
                     sorted(options.items()))
    except (TypeError, ValueError) as exc:
        error = exc
    agree(runtime.comm, "ddp_comm_hook", [("arguments", signature)], error)
    return valid.codec, options, powersgd


def ccl_comm_hook(state: DDPHookState,
                  bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP communication hook: average ``bucket`` with ccl (see :class:`DDPHookState`).

    Parameters
    ----------
    state : DDPHookState
        What :func:`~ccl.torch.ddp_comm_hook` returned with it.
    bucket : torch.distributed.GradBucket
        DDP's bucket of gradients.

    Returns
    -------
    torch.futures.Future
        Resolves to the averaged flat bucket.

    Examples
    --------
    >>> import torch, ccl.torch as ct
    >>> ct.init()
    >>> state = ct.DDPHookState("fp16")
    >>> ddp = torch.nn.parallel.DistributedDataParallel(model)  # doctest: +SKIP
    >>> ddp.register_comm_hook(state, ct.ccl_comm_hook)         # doctest: +SKIP
    """
    return state.reduce(bucket)


def ddp_comm_hook(codec: Any, algorithm: str = "auto",
                  **options: Any) -> tuple[DDPHookState, Callable[..., torch.futures.Future]]:
    """A DDP communication hook that averages gradients with a ccl codec (collective).

    ``ddp.register_comm_hook(*ccl.torch.ddp_comm_hook("thc"))`` is
    ``ddp.register_comm_hook(DDPHookState("thc"), ccl_comm_hook)``: see
    :class:`~ccl.torch.DDPHookState` for what it does and the arguments.

    Parameters
    ----------
    codec, algorithm, **options
        As for :class:`~ccl.torch.DDPHookState`.

    Returns
    -------
    state : DDPHookState
        The hook's state: checkpoint it with ``state.state_dict()``.
    hook : callable
        :func:`~ccl.torch.ccl_comm_hook`, for ``register_comm_hook(state, hook)``.

    Raises
    ------
    RuntimeError, TypeError, ValueError, ccl.MismatchError
        As :class:`~ccl.torch.DDPHookState`.

    Examples
    --------
    >>> import torch, ccl.torch as ct
    >>> ct.init()
    >>> state, hook = ct.ddp_comm_hook("fp16", min_compress_bytes=0)
    >>> hook is ct.ccl_comm_hook, isinstance(state, ct.DDPHookState)
    (True, True)

    With a process group (e.g. ``dist.init_process_group("gloo")``):

    >>> ddp = torch.nn.parallel.DistributedDataParallel(model)  # doctest: +SKIP
    >>> ddp.register_comm_hook(state, hook)                     # doctest: +SKIP
    """
    state = DDPHookState(codec, algorithm, **options)
    return state, ccl_comm_hook
