"""Momentum correction for a ``DistributedOptimizer`` over ``torch.optim.SGD``.

With an error-feedback codec, averaging the gradients and then letting SGD
apply its momentum delays what the codec held back: a value kept in the
residual for a few steps misses the momentum those steps would have given
it, and a sparse codec holds most values back most of the time. Deep
Gradient Compression's remedy (Lin et al. 2018, "momentum correction") is
used instead: every rank keeps the momentum of its own gradients,

    u_r = momentum * u_r + (g_r + weight_decay * w),

and the codec compresses ``u_r`` with its error feedback. By linearity the
average of the ``u_r`` is the momentum exact SGD would hold, so nothing
else changes: the wrapped ``SGD`` still takes the step, given the gradient
that turns its momentum buffer into the averaged one. Its state (the one
momentum buffer, the same on every rank), its update (Nesterov too) and its
checkpoints stay PyTorch's; the ranks' own momenta go into the ``"ccl"``
entry of the state dict with the residuals.

It applies to parameters of groups with ``momentum > 0``, ``dampening = 0``
and ``maximize = False`` in compressed buckets of a codec with error
feedback, when the gradients are averaged (``op="mean"``). Elsewhere the
gradient is sent as it is.
"""

import torch

__all__ = ["LocalMomentum", "applies"]


def applies(optimizer, plan):
    """Whether the optimizer's momentum can be corrected: plain SGD, error feedback, mean."""
    return (type(optimizer) is torch.optim.SGD and plan.powersgd is None
            and plan.codec.error_feedback and plan.op == "mean")


class LocalMomentum:
    """This rank's momentum of its own gradients, per corrected parameter.

    Keeps two tensors per corrected parameter (the momentum, and the next
    one while a step is under way), allocated once.

    Parameters
    ----------
    optimizer : callable
        Returns the wrapped optimizer (a weak reference).
    """

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.momenta = {}  # parameter position -> this rank's momentum (work dtype)
        self.pending = {}  # this step's: position -> (new momentum, momentum, weight decay)
        self.spare = {}  # position -> a tensor for the next step's new momentum
        self._groups, self._seen = {}, 0

    def _group(self, p):
        optimizer = self.optimizer()
        if optimizer is None:
            return None
        if len(optimizer.param_groups) != self._seen:  # add_param_group() added one
            self._groups = {id(q): g for g in optimizer.param_groups for q in g["params"]}
            self._seen = len(optimizer.param_groups)
        group = self._groups.get(id(p))
        if group is None or not group["momentum"] or group["dampening"] or \
                group.get("maximize", False):
            return None
        return group

    def fold(self, i, p, view, grad):
        """Write parameter ``i``'s new local momentum into ``view`` (its place in the bucket).

        ``grad`` is its dense gradient on this rank, or None (zeros). The
        momentum itself is kept only once the step succeeds (:meth:`commit`).

        Returns
        -------
        bool
            False where the correction does not apply: nothing was written.
        """
        group = self._group(p)
        if group is None or (p.grad is not None and p.grad.is_sparse):
            return False
        momentum, decay = float(group["momentum"]), float(group["weight_decay"])
        previous = self.momenta.get(i)
        if previous is None:  # the first step, or a state without ranks' momenta
            previous = self._buffer(p)
        # one pass where the gradient would have been copied: view = g + momentum * u
        if previous is None and grad is None:
            view.zero_()
        elif previous is None:
            view.copy_(grad)
        elif grad is None:
            torch.mul(previous.to(view), momentum, out=view)
        else:
            # dtypes promote into the bucket's (no copy of a half-precision gradient)
            torch.add(grad, previous.to(view), alpha=momentum, out=view)
        if decay:
            view.add_(p.detach(), alpha=decay)
        new = self.spare.pop(i, None)
        if new is None:
            new = torch.empty_like(view)
        new.copy_(view)
        self.pending[i] = (new, momentum, decay)
        return True

    def gradient(self, i, p, grad):
        """Turn ``grad`` (the averaged momentum) into what the wrapped SGD must be given.

        SGD then computes ``buffer = momentum * buffer + (grad + weight_decay * w)``,
        which is the averaged momentum (on the first step, ``buffer = grad +
        weight_decay * w``).
        """
        entry = self.pending.get(i)
        if entry is None:
            return
        _, momentum, decay = entry
        with torch.no_grad():
            if decay:
                grad.sub_(p.detach(), alpha=decay)
            buffer = self._buffer(p)
            if buffer is not None:
                grad.sub_(buffer.to(grad), alpha=momentum)

    def _buffer(self, p):
        optimizer = self.optimizer()
        return None if optimizer is None else optimizer.state.get(p, {}).get("momentum_buffer")

    def commit(self, averaged):
        """The step succeeded: keep the new momenta of the parameters ``averaged[i]`` says."""
        for i in [i for i in self.pending if averaged[i]]:
            new = self.pending.pop(i)[0]
            old = self.momenta.get(i)
            self.momenta[i] = new
            if old is not None:
                self.spare[i] = old
        self.drop()

    def drop(self):
        """Forget this step's new momenta (a failed step keeps the momenta it had)."""
        for i, (new, _, _) in self.pending.items():
            self.spare[i] = new
        self.pending.clear()

    def state_dict(self, names):
        """``{parameter name: this rank's momentum}``."""
        return {names[i]: u for i, u in sorted(self.momenta.items())}

    @staticmethod
    def check(saved, names, params):
        """Raise ValueError unless ``saved`` (:meth:`state_dict`) fits these parameters."""
        if not isinstance(saved, dict):
            raise ValueError("the state's momenta are not a dict of tensors")
        shapes = dict(zip(names, (p.shape for p in params), strict=True))
        for name, u in saved.items():
            if name not in shapes:
                raise ValueError(f"the state holds a momentum of {name!r}, a parameter this "
                                 "DistributedOptimizer does not reduce")
            if not isinstance(u, torch.Tensor) or u.shape != shapes[name]:
                raise ValueError(f"the state's momentum of {name!r} is not a tensor of "
                                 f"shape {tuple(shapes[name])}")

    def load_state_dict(self, saved, names, params, own):
        """Restore this rank's momenta if ``own``; else they start from SGD's buffer.

        ``saved`` has passed :meth:`check`.
        """
        self.momenta.clear()
        self.pending.clear()
        self.spare.clear()
        if not own or not saved:
            return
        position = {name: i for i, name in enumerate(names)}
        for name, u in saved.items():
            i = position[name]
            self.momenta[i] = u.detach().to(device=params[i].device).clone()
