"""The data movement of ``ccl.torch``'s tensor collectives (run by the collectives' thread).

Each function here takes a registered :class:`~ccl.torch.process_sets.ProcessSet`
and what one call of ``hvd.allreduce`` (or allgather, broadcast, ...)
needs, first agrees with the set's other ranks on the call (name, op,
shapes, dtypes, root: a rank that disagrees or rejected its arguments makes
every rank raise instead of hang), then moves the data with the MPI
library's own collectives: reductions in the tensor's dtype (float16 and
bfloat16 in float32, then rounded once), everything else as raw bytes, so
results are exact. A ccl codec given as ``compression=`` goes through the
set's :class:`ccl.Communicator` instead, always compressed (on the algorithm
that fits the codec, ``ccl.collectives.auto.fitting``), with error
feedback kept per name.
"""

import numpy as np
import torch
from mpi4py import MPI

from ..collectives.auto import fitting
from . import timeline
from .adasum import adasum_allreduce
from ..errors import MismatchError
from .joins import JoinedError, negotiate

__all__ = ["Average", "Sum", "Adasum", "Min", "Max", "Product", "OP_NAMES",
           "HorovodInternalError", "allreduce", "allgather", "broadcast", "alltoall",
           "allreduce_data", "AutoName", "name_field", "reducescatter", "barrier", "DTYPES"]

# Horovod's reduction op values
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
            Product: "Product"}
_MPI_OPS = {Sum: MPI.SUM, Average: MPI.SUM, Min: MPI.MIN, Max: MPI.MAX, Product: MPI.PROD}

#: dtypes of Horovod's CPU path (``bool`` only where no arithmetic is done).
DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64)
_MOVABLE = DTYPES + (torch.bool,)


class HorovodInternalError(RuntimeError):
    """A collective failed on every rank of its set: ranks disagreed on it, or one rejected it.

    Horovod raises a ``RuntimeError`` in that case; so does ``ccl.torch``
    (the cause, a :class:`ccl.MismatchError` or the rank's own error, is
    chained).

    Examples
    --------
    >>> from ccl.torch import HorovodInternalError
    >>> issubclass(HorovodInternalError, RuntimeError)
    True
    """


class AutoName(str):
    """A generated name (``allreduce.noname.7``): the ranks' agreement leaves it out.

    Generated names count this rank's calls; after a call that failed on some
    ranks only (a test that stopped early), the counts differ between ranks
    while the calls still pair up in order, so only names the caller gave
    are compared.
    """

    __slots__ = ()


def name_field(name):
    """What the agreement compares of ``name`` (None for a generated one)."""
    return None if isinstance(name, AutoName) else name


def check_tensor(tensor, what, dtypes=_MOVABLE):
    """Raise TypeError/ValueError for what Horovod's CPU path does not take."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} takes a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in dtypes:
        raise TypeError(f"{what} does not support {tensor.dtype} tensors")
    if tensor.is_sparse:
        raise ValueError(f"{what} takes dense tensors (call tensor.to_dense())")


def _agree(process_set, what, fields, error, describe=None):
    """Agree on the call with the set's ranks; return the ranks that called ``join()``.

    The global set negotiates with joined ranks too (:mod:`ccl.torch.joins`);
    ``describe`` tells them what an allreduce needs from them. Ranks whose
    calls have different names raise :class:`~ccl.torch.joins.NamesDiffer`
    alike, and the collectives' thread matches the names
    (:mod:`ccl.torch.matching`).
    """
    try:
        with timeline.phase("NEGOTIATE", what):
            return negotiate(process_set._comm, what, fields, error, describe)
    except (MismatchError, JoinedError) as exc:
        raise HorovodInternalError(f"{what}: {exc}") from exc


def _signature(tensors, first_dim=True):
    return [(str(t.dtype), tuple(t.shape) if first_dim else tuple(t.shape[1:]), t.dim())
            for t in tensors]


def _work(tensor):
    """A private contiguous CPU copy in the dtype MPI reduces (float32 for half types)."""
    t = tensor.detach()
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.to("cpu", torch.float32).contiguous()
    return t.to("cpu").clone().contiguous()


def _scale(buf, factor):
    """``buf * factor`` in place for floats; integers scale in float64 and truncate."""
    if factor == 1:
        return buf
    if buf.dtype.is_floating_point:
        return buf.mul_(factor)
    return buf.copy_((buf.to(torch.float64) * factor).to(buf.dtype))


def _postscaled(buf, op, size, postscale):
    """The reduced ``buf`` after the sum: an average divides by ``size``, then ``postscale``.

    An integer average is the exact sum floor-divided by ``size`` (rounded
    toward minus infinity), the reference Horovod's own test suite takes
    (``torch.floor_divide``); a float average is the sum divided by ``size``
    (correctly rounded: the suite compares with ``sum / size``), then
    multiplied by ``postscale``.
    """
    if op == Average and not buf.dtype.is_floating_point:
        return _scale(buf.copy_(torch.floor_divide(buf, size)), postscale)
    if op == Average and size != 1:
        buf.div_(size)
    return _scale(buf, postscale)


def _prescaled(tensor, factor):
    """The working copy times ``factor``, rounded to the tensor's dtype as Horovod's is."""
    buf = _scale(_work(tensor), factor)
    if factor != 1 and buf.dtype != tensor.dtype and tensor.dtype.is_floating_point:
        buf = buf.to(tensor.dtype).to(buf.dtype)  # half types: prescaled in their own dtype
    return buf


def _bytes(tensor):
    return tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()


def allreduce(process_set, tensors, op, name, prescale, postscale, codec, error):
    """Reduce ``tensors`` over the set; return the results (new tensors)."""
    fields = [("name", name_field(name)), ("op", OP_NAMES.get(op, op)),
              ("tensors", _signature(tensors)),
              ("scale factors", (float(prescale), float(postscale))),
              ("compression", codec.get_config() if codec is not None else None)]

    def describe():  # for ranks that called join(): they contribute zeros
        reason = "a compressed allreduce" if codec is not None else \
            f"op={OP_NAMES.get(op, op)} cannot take zeros" if op not in (Sum, Average) else ""
        return dict(ok=not reason, reason=reason, op=op, prescale=float(prescale),
                    postscale=float(postscale),
                    tensors=[[str(t.dtype), list(t.shape)] for t in tensors])

    _agree(process_set, "allreduce", fields, error, describe)
    return allreduce_data(process_set, tensors, op, prescale, postscale, codec, name)


def allreduce_data(process_set, tensors, op, prescale, postscale, codec=None, name=None):
    """The data movement of :func:`allreduce`, after the agreement."""
    size = process_set._comm.Get_size()
    post = postscale / size if op == Average else postscale
    if codec is not None:
        results = []
        for i, tensor in enumerate(tensors):
            x = _scale(_work(tensor), prescale).numpy()
            y = process_set._communicator.allreduce(x, key=f"{name}.{i}", codec=codec,
                                                    op="sum", algorithm=fitting(codec))
            out = _scale(torch.from_numpy(np.array(y)).reshape(tensor.shape), post)
            results.append(out.to(tensor.device, tensor.dtype))
        return results
    if op == Adasum:  # per tensor, as Horovod: each gets its own dot products
        results = []
        for tensor in tensors:
            x = _scale(tensor.detach().to("cpu", torch.float64).clone(), prescale)
            y = adasum_allreduce(process_set._comm, x.reshape(-1).numpy())
            out = _scale(torch.from_numpy(y).reshape(tensor.shape), postscale)
            results.append(out.to(tensor.device, tensor.dtype))
        return results
    # one MPI_Allreduce per compute dtype: the tensors of a group travel fused
    results = [None] * len(tensors)
    groups = {}
    for i, tensor in enumerate(tensors):
        half = tensor.dtype in (torch.float16, torch.bfloat16)
        groups.setdefault(torch.float32 if half else tensor.dtype, []).append(i)
    for indices in groups.values():
        flat = torch.cat([_prescaled(tensors[i], prescale).reshape(-1) for i in indices])
        if flat.numel():
            with timeline.phase("WIRE", "MPI_Allreduce", bytes=flat.numel() * flat.element_size()):
                process_set._comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=_MPI_OPS[op])
        _postscaled(flat, op, size, postscale)
        offset = 0
        for i in indices:
            t = tensors[i]
            piece = flat[offset:offset + t.numel()].reshape(t.shape)
            offset += t.numel()
            results[i] = piece.to(t.device, t.dtype)
    return results


def allgather(process_set, tensors, name, error):
    """Concatenate every rank's tensors along the first dimension (sizes may differ)."""
    shaped = [t.reshape(1) if t.dim() == 0 else t for t in tensors]
    _agree(process_set, "allgather", [("name", name_field(name)),
                                      ("tensors", _signature(shaped, first_dim=False))], error)
    comm = process_set._comm
    size = comm.Get_size()
    mine = np.array([t.shape[0] for t in shaped], dtype=np.int64)
    dims = np.empty((size, len(shaped)), dtype=np.int64)
    comm.Allgather([mine, MPI.INT64_T], [dims, MPI.INT64_T])
    results = []
    for i, t in enumerate(shaped):
        row = int(np.prod(t.shape[1:], dtype=np.int64)) * t.element_size()
        counts = [int(d) * row for d in dims[:, i]]
        out = torch.empty((int(dims[:, i].sum()),) + tuple(t.shape[1:]), dtype=t.dtype)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64).tolist()
        with timeline.phase("WIRE", "MPI_Allgatherv", bytes=sum(counts)):
            comm.Allgatherv([_bytes(t), MPI.BYTE],
                            [out.reshape(-1).view(torch.uint8).numpy(), (counts, displs),
                             MPI.BYTE])
        results.append((out.to(t.device), dims[:, i].tolist()))
    return results


def broadcast(process_set, tensors, root_rank, name, error):
    """Root's ``tensors`` on every rank of the set (``root_rank`` is a global rank)."""
    _agree(process_set, "broadcast", [("name", name_field(name)), ("root_rank", root_rank),
                                      ("tensors", _signature(tensors))], error)
    comm = process_set._comm
    root = process_set.ranks.index(root_rank) if process_set.process_set_id else root_rank
    results = []
    for t in tensors:
        buf = _bytes(t).copy() if comm.Get_rank() == root else \
            np.empty(t.numel() * t.element_size(), dtype=np.uint8)
        with timeline.phase("WIRE", "MPI_Bcast", bytes=int(buf.size)):
            comm.Bcast([buf, MPI.BYTE], root=root)
        out = torch.from_numpy(buf).view(t.dtype).reshape(t.shape)
        results.append(out.to(t.device))
    return results


def alltoall(process_set, tensor, splits, name, error):
    """Send ``splits[r]`` first-dimension rows to rank ``r`` of the set; return what came."""
    _agree(process_set, "alltoall", [("name", name_field(name)),
                                     ("tensors", _signature([tensor], first_dim=False))],
           error)
    comm = process_set._comm
    size = comm.Get_size()
    send = np.asarray(splits, dtype=np.int64)
    received = np.empty(size, dtype=np.int64)
    comm.Alltoall([send, MPI.INT64_T], [received, MPI.INT64_T])
    row = int(np.prod(tensor.shape[1:], dtype=np.int64)) * tensor.element_size()
    scounts = (send * row).tolist()
    rcounts = (received * row).tolist()
    sdispls = np.concatenate([[0], np.cumsum(scounts)[:-1]]).astype(np.int64).tolist()
    rdispls = np.concatenate([[0], np.cumsum(rcounts)[:-1]]).astype(np.int64).tolist()
    out = torch.empty((int(received.sum()),) + tuple(tensor.shape[1:]), dtype=tensor.dtype)
    comm.Alltoallv([_bytes(tensor), (scounts, sdispls), MPI.BYTE],
                   [out.reshape(-1).view(torch.uint8).numpy(), (rcounts, rdispls), MPI.BYTE])
    return out.to(tensor.device), torch.from_numpy(received.astype(np.int32))


def rows_of(first_dim, size):
    """Rows of each rank in a reducescatter: equal shares, the first ranks one more."""
    base, extra = divmod(first_dim, size)
    return [base + (1 if r < extra else 0) for r in range(size)]


def reducescatter(process_set, tensors, op, name, prescale, postscale, codec, error):
    """Reduce over the set; each rank keeps its rows of the first dimension."""
    fields = [("name", name_field(name)), ("op", OP_NAMES.get(op, op)),
              ("tensors", _signature(tensors)),
              ("scale factors", (float(prescale), float(postscale))),
              ("compression", codec.get_config() if codec is not None else None)]
    _agree(process_set, "reducescatter", fields, error)
    comm = process_set._comm
    size, me = comm.Get_size(), comm.Get_rank()
    results = []
    for i, t in enumerate(tensors):
        rows = rows_of(t.shape[0], size)
        start = sum(rows[:me])
        buf = _scale(_work(t), prescale)
        if codec is not None:
            full = process_set._communicator.allreduce(buf.numpy(), key=f"{name}.{i}",
                                                       codec=codec, op="sum",
                                                       algorithm=fitting(codec))
            out = torch.from_numpy(np.array(full)).reshape(t.shape)[start:start + rows[me]]
            out = out.clone()
        else:
            row = int(np.prod(t.shape[1:], dtype=np.int64))
            out = torch.empty((rows[me],) + tuple(t.shape[1:]), dtype=buf.dtype)
            comm.Reduce_scatter(buf.reshape(-1).numpy(), out.reshape(-1).numpy(),
                                [n * row for n in rows], op=_MPI_OPS[op])
        results.append(_postscaled(out, op, size, postscale).to(t.device, t.dtype))
    return results


def barrier(process_set, error):
    """Wait until every rank of the set gets here."""
    _agree(process_set, "barrier", [], error)
    process_set._comm.Barrier()
