"""``SyncBatchNorm``: batch normalization over the batches of every rank, as Horovod's.

In training, each rank sums its batch's values and squares per channel;
one differentiable :func:`~ccl.torch.allreduce` (``op=Sum``) of those sums
and the sample count gives every rank the statistics of the whole global
batch, so the output is what ``torch.nn.BatchNorm`` gives on the
concatenation of all ranks' batches. Gradients flow back through that
allreduce (its gradient is the allreduce of the gradients). In evaluation,
or without ``track_running_stats`` buffers in eval, it is the local
``batch_norm`` on the running statistics.

>>> import torch, ccl.torch as hvd
>>> hvd.init()
>>> bn = hvd.SyncBatchNorm(3)
>>> bn(torch.randn(4, 3, 2)).shape
torch.Size([4, 3, 2])
"""

import torch
import torch.nn.functional as F

from .autograd import allreduce
from .process_sets import global_process_set
from .tensor_ops import Sum

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Batch normalization with statistics over every rank's batch (Horovod's signature).

    Parameters
    ----------
    num_features : int
        Channels (dimension 1 of the input).
    eps : float
        Added to the variance.
    momentum : float or None
        Running statistics' update factor (None: cumulative average).
    affine : bool
        Learnable scale and shift.
    track_running_stats : bool
        Keep running mean and variance.
    process_set : ProcessSet
        The ranks whose batches are normalized together (default: every rank).

    Examples
    --------
    >>> import torch, ccl.torch as hvd
    >>> hvd.init()
    >>> bn = hvd.SyncBatchNorm(2)
    >>> out = bn(torch.ones(3, 2))
    >>> bool((out == 0).all())
    True
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects at least 2-D input, got {input.dim()}-D")

    def forward(self, input):
        """Normalize ``input`` with the global batch's statistics (collective in training).

        Parameters
        ----------
        input : torch.Tensor
            ``(N, C, ...)``; every rank of the set calls ``forward`` together in training.

        Returns
        -------
        torch.Tensor
            The normalized input, of its shape.
        """
        self._check_input_dim(input)
        if not self.training and self.track_running_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, False, 0.0, self.eps)
        channels = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        count = torch.tensor([input.numel() // max(channels, 1)], dtype=input.dtype,
                             device=input.device)
        local = torch.cat([input.sum(dims), (input * input).sum(dims), count])
        total = allreduce(local, op=Sum, process_set=self.process_set)
        n = total[-1]
        mean = total[:channels] / n
        var = total[channels:2 * channels] / n - mean * mean
        if self.training and self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), n.item())
        shape = [1, channels] + [1] * (input.dim() - 2)
        out = (input - mean.reshape(shape)) * torch.rsqrt(var.reshape(shape) + self.eps)
        if self.affine:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        return out

    def _update_running_stats(self, mean, var, n):
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            factor = 1.0 / float(self.num_batches_tracked)
        else:
            factor = self.momentum
        unbiased = var * (n / (n - 1)) if n > 1 else var
        with torch.no_grad():
            self.running_mean.mul_(1 - factor).add_(factor * mean)
            self.running_var.mul_(1 - factor).add_(factor * unbiased)
