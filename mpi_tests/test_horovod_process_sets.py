"""Horovod's process sets in ccl.torch: MPI sub-communicators, static and dynamic."""

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")

import ccl  # noqa: E402
import ccl.torch as ct  # noqa: E402

pytestmark = pytest.mark.mpi

torch.set_num_threads(1)


def evens_odds(size):
    return list(range(0, size, 2)), list(range(1, size, 2))


def test_collectives_on_even_and_odd_ranks(hvd):
    size, rank = hvd.size(), hvd.rank()
    evens, odds = evens_odds(size)
    even_set = hvd.add_process_set(evens)
    odd_set = hvd.add_process_set(hvd.ProcessSet(odds)) if odds else None
    mine = even_set if rank % 2 == 0 else odd_set
    members = evens if rank % 2 == 0 else odds
    assert mine.included() and mine.size() == len(members)
    assert mine.rank() == members.index(rank)
    assert even_set.included() == (rank % 2 == 0)
    x = torch.full((3,), float(rank))
    assert hvd.allreduce(x, op=hvd.Sum, process_set=mine).tolist() == [float(sum(members))] * 3
    assert hvd.allgather(torch.tensor([rank]), process_set=mine).tolist() == members
    root = members[-1]
    assert hvd.broadcast(torch.tensor([rank]), root, process_set=mine).item() == root
    rows = hvd.reducescatter(torch.ones(len(members), 2), op=hvd.Sum, process_set=mine)
    assert rows.tolist() == [[float(len(members))] * 2]
    out = hvd.alltoall(torch.full((len(members),), rank), process_set=mine)
    assert out.tolist() == members
    assert hvd.broadcast_object({"from": rank}, root_rank=root, process_set=mine) == \
        {"from": root}
    assert hvd.allgather_object(rank, process_set=mine) == members
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.fill_(rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=root, process_set=mine)
    assert model.weight.eq(root).all()
    hvd.barrier(process_set=mine)
    # the global set still works, interleaved with the sets' collectives
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size
    assert hvd.remove_process_set(even_set) is True
    if odd_set is not None:
        assert hvd.remove_process_set(odd_set) is True
    assert hvd.remove_process_set(even_set) is False
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(torch.ones(1), process_set=even_set)


def test_non_member_and_bad_sets_raise(hvd):
    size, rank = hvd.size(), hvd.rank()
    first = hvd.add_process_set([0])
    if rank != 0:
        with pytest.raises(ValueError, match="is not in"):
            hvd.allreduce(torch.ones(1), process_set=first)
    else:
        assert hvd.allreduce(torch.ones(1), process_set=first).item() == 1
    with pytest.raises(ValueError, match="exists already"):
        hvd.add_process_set([0])
    with pytest.raises(ValueError, match="distinct ranks"):
        hvd.add_process_set([size])
    with pytest.raises(ValueError, match="registered already"):
        hvd.add_process_set(first)
    if size > 1:  # ranks asking for different sets: every rank raises
        with pytest.raises(ccl.MismatchError, match="ranks"):
            hvd.add_process_set(list(range(rank, size)))
    assert hvd.remove_process_set(first)
    assert not hvd.remove_process_set(hvd.global_process_set)


def test_process_set_from_a_communicator(hvd, comm):
    size, rank = hvd.size(), hvd.rank()
    reversed_world = comm.Split(0, key=size - rank)  # every rank, in another order
    every = hvd.add_process_set(hvd.ProcessSet(reversed_world))
    assert every.ranks == list(range(size))
    assert hvd.allgather(torch.tensor([rank]), process_set=every).tolist() == every.ranks
    assert hvd.remove_process_set(every)
    reversed_world.Free()
    with pytest.raises(ValueError, match="COMM_NULL"):
        hvd.add_process_set(hvd.ProcessSet(MPI.COMM_NULL))


def test_static_process_sets_at_init(comm):
    size = comm.Get_size()
    evens, _ = evens_odds(size)
    even_set = ct.ProcessSet(evens)
    ct.init(comm, process_sets=[even_set])
    try:
        assert even_set.process_set_id is not None
        if even_set.included():
            total = ct.allreduce(torch.ones(1), op=ct.Sum, process_set=even_set).item()
            assert total == len(evens)
        assert ct.global_process_set.ranks == list(range(size))
    finally:
        ct.shutdown()
    assert even_set.process_set_id is not None  # registered with the old runtime only
