"""Named collectives submitted in different orders on different ranks, at every rank count.

Horovod's coordinator matches tensors by name, so a program may start its
asynchronous collectives in any order on each rank. ccl.torch's collectives'
thread agrees with the other ranks on which queued name runs first; names
that are never submitted on every rank fail on every rank instead of hanging.
Every rank can rebuild every other rank's inputs, so results are compared
with the exact reference.
"""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.mpi

torch.set_num_threads(1)

NAMES = [f"grad.{i}" for i in range(6)]


def values(rank, i, n=5):
    """Rank ``rank``'s input of name ``i``: small integers, exact in float32 sums."""
    g = torch.Generator().manual_seed(100 * rank + i)
    return torch.randint(-8, 9, (n + i,), generator=g).to(torch.float32)


def order_of(rank):
    """Rank ``rank``'s submission order: rotated, and reversed on odd ranks."""
    k = rank % len(NAMES)
    order = NAMES[k:] + NAMES[:k]
    return order[::-1] if rank % 2 else order


def test_async_allreduces_in_different_orders(hvd):
    size, rank = hvd.size(), hvd.rank()
    handles = {name: hvd.allreduce_async(values(rank, NAMES.index(name)), name=name,
                                         op=hvd.Sum) for name in order_of(rank)}
    for name in order_of(rank + 1):  # synchronized in yet another order
        i = NAMES.index(name)
        want = sum(values(r, i) for r in range(size))
        assert torch.equal(hvd.synchronize(handles[name]), want), name


def test_mixed_collectives_in_different_orders(hvd):
    size, rank = hvd.size(), hvd.rank()
    calls = {
        "sum": lambda: hvd.allreduce_async(values(rank, 0), name="sum", op=hvd.Sum),
        "rows": lambda: hvd.allgather_async(torch.full((rank + 1, 2), float(rank)),
                                            name="rows"),
        "root": lambda: hvd.broadcast_async(values(rank, 2), root_rank=size - 1, name="root"),
        "max": lambda: hvd.allreduce_async(values(rank, 3), name="max", op=hvd.Max),
    }
    order = list(calls)[rank % 4:] + list(calls)[:rank % 4]
    handles = {name: calls[name]() for name in order}
    got = {name: hvd.synchronize(handles[name]) for name in sorted(handles)}
    assert torch.equal(got["sum"], sum(values(r, 0) for r in range(size)))
    rows = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(size)])
    assert torch.equal(got["rows"], rows)
    assert torch.equal(got["root"], values(size - 1, 2))
    assert torch.equal(got["max"], torch.stack([values(r, 3) for r in range(size)]).max(0)[0])


def test_synchronous_call_overtakes_queued_ones(hvd):
    # rank 0 waits in a synchronous "b" while "a" is queued before it; the others queue
    # "b" first and wait in a synchronous "a": Horovod completes both
    size, rank = hvd.size(), hvd.rank()
    first, second = ("a", "b") if rank == 0 else ("b", "a")
    handle = hvd.allreduce_async(values(rank, ord(first)), name=first, op=hvd.Sum)
    now = hvd.allreduce(values(rank, ord(second)), name=second, op=hvd.Sum)
    later = hvd.synchronize(handle)
    assert torch.equal(now, sum(values(r, ord(second)) for r in range(size)))
    assert torch.equal(later, sum(values(r, ord(first)) for r in range(size)))


def test_generated_and_given_names_interleave(hvd):
    # unnamed calls keep their order; a named one queued ahead of them on some ranks
    # only is matched by name
    size, rank = hvd.size(), hvd.rank()
    early = rank % 2 == 0
    named = hvd.allreduce_async(values(rank, 1), name="late", op=hvd.Sum) if early else None
    plain = [hvd.allreduce_async(values(rank, 2 + k), op=hvd.Sum) for k in range(2)]
    if not early:
        named = hvd.allreduce_async(values(rank, 1), name="late", op=hvd.Sum)
    for k, handle in enumerate(plain):
        assert torch.equal(hvd.synchronize(handle), sum(values(r, 2 + k) for r in range(size)))
    assert torch.equal(hvd.synchronize(named), sum(values(r, 1) for r in range(size)))


@pytest.mark.mpi(min_size=2)
def test_names_missing_on_some_ranks_raise_on_every_rank(hvd):
    size, rank = hvd.size(), hvd.rank()
    # every rank queues its own name, then one all ranks share: the shared one runs,
    # the others fail everywhere once every rank waits
    own = hvd.allreduce_async(torch.ones(3), name=f"only.{rank}", op=hvd.Sum)
    shared = hvd.allreduce_async(torch.ones(2), name="shared", op=hvd.Sum)
    assert hvd.synchronize(shared).tolist() == [float(size)] * 2
    with pytest.raises(RuntimeError, match="different names"):
        hvd.synchronize(own)
    # the names are free again and collectives work afterwards
    assert hvd.allreduce(torch.ones(1), name=f"only.{rank % 1}", op=hvd.Sum).item() == size


@pytest.mark.mpi(min_size=2)
def test_process_set_matches_its_own_names(hvd):
    size, rank = hvd.size(), hvd.rank()
    pair = hvd.add_process_set([0, 1])
    try:
        if rank < 2:
            order = ["x", "y"] if rank == 0 else ["y", "x"]
            handles = {n: hvd.allreduce_async(values(rank, ord(n)), name=n, op=hvd.Sum,
                                              process_set=pair) for n in order}
            for n in "xy":
                want = values(0, ord(n)) + values(1, ord(n))
                assert torch.equal(hvd.synchronize(handles[n]), want)
        everyone = hvd.allreduce(torch.ones(1), name="everyone", op=hvd.Sum)
        assert everyone.item() == size
    finally:
        hvd.remove_process_set(pair)
