"""Step control of ``CompressedAdam``: dropped steps, mixed precision, edited gradients.

``CompressedAdam`` takes each gradient during backward (``ccl.torch.momentum``)
and reduces it at once, so what happens to ``.grad`` between ``backward()``
and ``step()`` cannot reach the reduction. :class:`StepControl` keeps the
ranks in step around that: after the reductions of a step the ranks exchange
one small row (each rank's flags, which parameters have a gradient) and
reach the same verdict, so a step is applied, dropped or refused on every
rank alike:

* :meth:`StepControl.skip_step` drops a step on purpose (every rank calls it);
* with a ``grad_scaler``, gradients are unscaled as they are taken and a step
  whose gradients hold NaN or Inf on any rank is dropped on every rank, the
  way ``torch.amp.GradScaler`` skips an inf step;
* gradients changed after they were taken (clipping, ``unscale_``) raise on
  every rank instead of being silently ignored;
* parameters without a gradient on any rank (frozen) are not updated.
"""

import torch

from ..errors import MismatchError
from .engine import decision_stats

__all__ = ["StepControl"]

# A rank's flags in a step's census: it called skip_step(), its (unscaled) gradients hold
# NaN or Inf (with a grad_scaler), its gradients changed after backward handed them over.
_SKIP, _NONFINITE, _EDITED = 1, 2, 4


class StepControl:
    """The step bookkeeping ``CompressedAdam`` inherits (see the module docstring).

    The optimizer sets ``grad_scaler``, ``skipped_steps``, ``steps``,
    ``size``, ``names``, ``params`` and ``reducer``, and calls
    :meth:`reset_taken` once at construction.
    """

    def check_scaler(self, grad_scaler):
        """Validate the ``grad_scaler`` argument.

        Parameters
        ----------
        grad_scaler : torch.amp.GradScaler or None
            What the optimizer was given.

        Returns
        -------
        bool
            Whether there is a scaler (the ranks agree on it).
        """
        if grad_scaler is not None and not callable(getattr(grad_scaler, "get_scale", None)):
            raise TypeError(f"grad_scaler must be a torch.amp.GradScaler, got "
                            f"{type(grad_scaler).__name__}")
        return grad_scaler is not None

    def check_between_steps(self, what):
        """Raise ``RuntimeError`` if called between ``backward()`` and ``step()``.

        Parameters
        ----------
        what : str
            The method called, for the message.
        """
        if self.reducer.pending:
            raise RuntimeError(f"{what}() between backward() and step(): the step is half "
                               "done (its momenta are being reduced). Call it before "
                               "backward() or after step()")

    def reset_taken(self):
        """Forget the gradients taken this step."""
        self._taken, self._scale, self._nonfinite = {}, None, False

    def take_gradient(self, p, grad):
        """Record ``p``'s gradient as taken now; return it unscaled (``grad_scaler``).

        Parameters
        ----------
        p : torch.Tensor
            The parameter.
        grad : torch.Tensor
            Its dense gradient (zeros if it has none).

        Returns
        -------
        torch.Tensor
            ``grad``, divided by the scaler's scale when there is a scaler.
        """
        if p.grad is not None:  # what the step compares, to see edits made after backward
            self._taken[p] = (p.grad, p.grad._version,
                              p.grad.sum() if self.grad_scaler is not None else None)
        if self.grad_scaler is None:
            return grad
        if self._scale is None:  # the scale scaler.scale(loss) multiplied the loss by
            self._scale = float(self.grad_scaler.get_scale())
        grad = grad / self._scale
        self._nonfinite = self._nonfinite or not bool(torch.isfinite(grad).all())
        return grad

    @property
    def _step_supports_amp_scaling(self):
        # GradScaler.step() then calls step() on every rank, inf or not: the ranks agree
        # there whether to drop the step
        return getattr(self, "grad_scaler", None) is not None

    def skip_step(self):
        """Drop this step: finish its reductions, change nothing (collective).

        Call it instead of :meth:`~ccl.torch.CompressedAdam.step` after
        ``backward()`` to discard the step (e.g. a loss that came out NaN);
        every rank must call it. The parameters, moments and step count stay
        as they were; the codec's error-feedback residuals of the reductions
        already made move on.
        """
        self._finish(skip=True)
        self._means = None

    def _finish(self, skip):
        """Finish the step's reductions; return whether to apply them (collective)."""
        flag = _SKIP if skip else 0
        edited = [self.names[i] for i, p in enumerate(self.params) if self._edited(p)]
        flag |= (_NONFINITE if self._nonfinite else 0) | (_EDITED if edited and not skip else 0)
        try:
            self._means, flags, self._anywhere = self.reducer.finish(flag)
        finally:
            self.reset_taken()
        ranks = {bit: [r for r, f in enumerate(flags.tolist()) if f & bit]
                 for bit in (_SKIP, _NONFINITE, _EDITED)}
        if ranks[_NONFINITE]:  # GradScaler's inf step: dropped on every rank alike
            self._scaler_found_inf()
        elif ranks[_EDITED]:
            raise RuntimeError(
                f"the gradients of rank(s) {ranks[_EDITED]} changed between backward() and "
                f"step(){' (' + ', '.join(edited[:5]) + ')' if edited else ''}: "
                "CompressedAdam takes each gradient during backward, so clipping or "
                "unscaling it afterwards would be silently ignored. The step was dropped on "
                "every rank. For mixed precision pass grad_scaler=scaler (and do not call "
                "scaler.unscale_()); gradient clipping is not supported")
        elif ranks[_SKIP] and len(ranks[_SKIP]) < self.size:
            raise MismatchError(
                f"rank(s) {ranks[_SKIP]} called skip_step() while the others called step(): "
                "the step was dropped on every rank", field="step",
                ranks=[ranks[_SKIP], [r for r in range(self.size) if r not in ranks[_SKIP]]])
        if ranks[_NONFINITE] or ranks[_SKIP]:
            self.skipped_steps += 1
            return False
        self.steps += 1
        self.reducer.engine.steps = self.steps
        return True

    def _edited(self, p):
        """Whether ``p``'s gradient changed since backward handed it to :meth:`fold`."""
        taken = self._taken.get(p)
        if taken is None:
            return False
        grad, version, total = taken
        if p.grad is not grad:
            return True
        if grad._version == version:
            return False
        # GradScaler.step() checks for inf by unscaling in place with the factor 1: same values
        return total is None or not torch.equal(grad.sum(), total)

    def _scaler_found_inf(self):
        """Mark the step as an inf step in this rank's scaler, so ``update()`` lowers the scale."""
        scaler = self.grad_scaler
        states = getattr(scaler, "_per_optimizer_states", {})
        for found in states.get(id(self), {}).get("found_inf_per_device", {}).values():
            found.fill_(1.0)

    def zero_grad(self, set_to_none=True):
        """Clear gradients; raises between ``backward()`` and ``step()``.

        Parameters
        ----------
        set_to_none : bool
            As in ``torch.optim.Optimizer.zero_grad``.

        Raises
        ------
        RuntimeError
            If backward ran since the last :meth:`~ccl.torch.CompressedAdam.step`: this step's
            reductions started then. Call :meth:`skip_step` to drop it.
        """
        if hasattr(self, "reducer") and self.reducer.pending:
            raise RuntimeError("optimizer.zero_grad() after loss.backward() but before "
                               "optimizer.step(): CompressedAdam started reducing this step "
                               "during backward. Call optimizer.skip_step() on every rank to "
                               "drop the step, or optimizer.step()")
        super().zero_grad(set_to_none=set_to_none)

    def communication_stats(self):
        """Counters of this rank: reductions, payload bytes sent, the step.

        Returns
        -------
        dict
            ``step``, ``warmup`` (whether the next step is a warm-up step),
            ``params`` and ``compressed_params`` (parameters whose momentum is
            compressed), ``buckets`` (their allreduces per step), ``reductions``
            (allreduces started), ``skipped_steps`` (steps dropped by
            :meth:`skip_step` or an inf step of ``grad_scaler``) and
            ``bytes_sent`` (payload bytes this rank put on the wire, ccl's
            own count), and what was sent compressed and plain, what ran and
            why: ``bytes_compressed``, ``bytes_plain``, ``algorithms``,
            ``decisions`` and ``auto`` (``ccl.torch.engine.decision_stats``).
        """
        return {"step": self.steps, "warmup": self.steps < self.warmup_steps,
                "skipped_steps": self.skipped_steps,
                "params": len(self.params), "compressed_params": sum(self.compressed),
                "buckets": len(self.buckets),
                "reductions": self.reducer.engine.reductions,
                "bytes_sent": self.communicator.stats()["bytes_sent"],
                **decision_stats(self.communicator)}
