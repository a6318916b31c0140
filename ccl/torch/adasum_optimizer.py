"""``DistributedOptimizer(op=hvd.Adasum)``: Horovod's delta optimizer.

As in Horovod, Adasum does not combine the gradients: every rank first
takes the wrapped optimizer's step with its own gradients, and the step's
change of each parameter (the *delta*, ``-lr * f(g)`` where ``f`` is the
optimizer's rule) is what the ranks combine with Adasum, one collective
for all parameters with a dot product per tensor. Each parameter then
becomes its value before the step plus the combined delta, the same bits
on every rank. Deltas that point the same way are averaged and orthogonal
ones add, so the learning rate is not scaled with the number of ranks
(Horovod's examples keep the single-rank rate on CPU).
"""

import torch

from .collectives import grouped_allreduce_async_
from .compression import Compression
from .handles import synchronize
from .tensor_ops import Adasum

__all__ = ["with_adasum_step"]


class _AdasumStep:
    """The wrapped optimizer's ``step``, then Adasum of every parameter's change."""

    _ccl_compression = Compression.none

    def step(self, closure=None):
        """Step locally, combine the parameters' changes with Adasum (collective).

        Parameters
        ----------
        closure : callable, optional
            Recomputes the loss and calls ``backward()``; called once first.

        Returns
        -------
        object
            The closure's loss, else what the wrapped ``step()`` returns.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for group in self.param_groups for p in group["params"]
                  if p.requires_grad]
        with torch.no_grad():
            starts = [p.detach().clone() for p in params]
            result = super().step()
            packed = [self._ccl_compression.compress(p.detach() - start)
                      for p, start in zip(params, starts)]
            deltas = [delta for delta, _ in packed]
            if deltas:
                synchronize(grouped_allreduce_async_(deltas, name="DistributedOptimizer.adasum",
                                                     op=Adasum))
            for p, start, delta, (_, ctx) in zip(params, starts, deltas, packed):
                p.copy_(start + self._ccl_compression.decompress(delta, ctx).to(p.dtype))
        return loss if closure is not None else result

    def synchronize(self):
        """Nothing to wait for: the deltas are combined inside ``step()`` (as in Horovod)."""

    def skip_synchronize(self):
        """Raise: Adasum combines the step's deltas, so no step can skip the exchange.

        Raises
        ------
        RuntimeError
            Always, as Horovod's Adasum optimizer does.
        """
        raise RuntimeError("skip_synchronize() is not supported with op=hvd.Adasum: the "
                           "deltas of the step are combined inside step()")

    def zero_grad(self, set_to_none=False):
        """Zero the gradients, in place by default (Horovod's behaviour).

        Parameters
        ----------
        set_to_none : bool
            As in ``torch.optim.Optimizer.zero_grad`` (default False here).

        Returns
        -------
        None
            As the wrapped ``zero_grad``.
        """
        return super().zero_grad(set_to_none=set_to_none)


_CLASSES = {}


def with_adasum_step(optimizer, compression):
    """Turn ``optimizer`` into Horovod's Adasum delta optimizer, in place.

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
        The optimizer; its class gains the Adasum ``step``.
    compression : Compressor
        ``hvd.Compression.none`` or ``hvd.Compression.fp16``: applied to the
        deltas before they travel, as Horovod does.

    Returns
    -------
    torch.optim.Optimizer
        The same object.

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> model = torch.nn.Linear(2, 1)
    >>> opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
    ...                                named_parameters=model.named_parameters(),
    ...                                op=hvd.Adasum)
    >>> model(torch.ones(1, 2)).sum().backward()
    >>> _ = opt.step()
    >>> model.bias.grad.tolist()
    [1.0]
    """
    base = type(optimizer)
    cls = _CLASSES.get(base)
    if cls is None:
        cls = _CLASSES[base] = type(base.__name__, (_AdasumStep, base),
                                    {"__module__": base.__module__,
                                     "__qualname__": base.__qualname__})
    optimizer.__class__ = cls
    optimizer._ccl_compression = compression
    with torch.no_grad():  # Horovod's zero gradients for every trainable parameter
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
    return optimizer
