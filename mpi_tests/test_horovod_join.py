"""Horovod's ``join()`` and call matching in ccl.torch, at every rank count.

A rank that joined takes part in the other ranks' later allreduces with
zeros until every rank joined; other collectives raise on the ranks that
called them; ``join`` returns the rank that joined last. Each test ends
with every rank in ``join`` or past it, so no rank is left waiting.
"""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.mpi

torch.set_num_threads(1)


def values(rank, shape, dtype):
    """Rank ``rank``'s input: small integers, exact in every dtype."""
    g = torch.Generator().manual_seed(rank)
    return torch.randint(-5, 6, shape, generator=g).to(dtype)


# allreduces each rank makes before it joins (rank r: pattern[r % 5])
PATTERNS = {"rank0-last": [3, 1, 2, 1, 2], "rank0-first": [1, 3, 2, 2, 3]}


@pytest.mark.parametrize("dtype", [torch.int32, torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_joined_ranks_contribute_zeros(hvd, dtype, pattern):
    size, rank = hvd.size(), hvd.rank()
    calls = [PATTERNS[pattern][r % 5] for r in range(size)]
    shape = (4, 3)
    results = [hvd.allreduce(values(rank + 10 * step, shape, dtype), op=hvd.Sum,
                             name=f"grad.{step}") for step in range(calls[rank])]
    last = hvd.join()
    for step, got in enumerate(results):
        want = sum(values(r + 10 * step, shape, torch.float64) for r in range(size)
                   if step < calls[r])
        assert torch.equal(got, want.to(dtype)), step
    assert calls[last] == max(calls)  # the last to join made the most calls
    assert hvd.allgather_object(last) == [last] * size


def test_average_divides_by_every_rank(hvd):
    size, rank = hvd.size(), hvd.rank()
    if rank == size - 1 and size > 1:
        assert hvd.join() != rank
        return
    x = torch.full((5,), float(rank + 1), dtype=torch.float64)
    h1 = hvd.allreduce_async(x, name="a")
    h2 = hvd.allreduce_async(2 * x, name="b", prescale_factor=0.5, postscale_factor=3.0)
    got1, got2 = hvd.synchronize(h1), hvd.synchronize(h2)
    active = range(size - 1) if size > 1 else range(1)
    total = sum(r + 1.0 for r in active)
    assert got1.tolist() == [total / size] * 5
    assert got2.tolist() == [3.0 * total / size] * 5
    assert hvd.join() != size - 1 or size == 1


@pytest.mark.parametrize("call", ["allgather", "broadcast", "alltoall", "max", "compressed",
                                  "barrier"])
def test_other_collectives_raise_while_a_rank_joined(hvd, call):
    size, rank = hvd.size(), hvd.rank()
    if size == 1:
        assert hvd.join() == 0
        return
    if rank == 0:
        assert hvd.join() != 0  # the others joined after rank 0
        return
    x = torch.ones(size, 2)
    run = {"allgather": lambda: hvd.allgather(x),
           "broadcast": lambda: hvd.broadcast(x, root_rank=1),
           "alltoall": lambda: hvd.alltoall(x),
           "max": lambda: hvd.allreduce(x, op=hvd.Max),
           "compressed": lambda: hvd.allreduce(x, compression=hvd.Compression.codec("fp16")),
           "barrier": hvd.barrier}[call]
    with pytest.raises(RuntimeError, match="join"):
        run()
    # the joined rank is still there for an allreduce, and everyone then joins
    got = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after")
    assert got.tolist() == [float(size - 1)] * 3
    assert hvd.join() != 0


def test_join_twice_and_collectives_after(hvd):
    """Joins end cleanly: the next collectives and joins work as usual."""
    for _ in range(2):
        assert 0 <= hvd.join() < hvd.size()
    x = torch.full((2,), float(hvd.rank()))
    assert hvd.allreduce(x, op=hvd.Sum).tolist() == [float(sum(range(hvd.size())))] * 2


@pytest.mark.mpi(min_size=2)
def test_generated_names_resynchronise_after_a_failed_call(hvd):
    """Calls that failed as a pair do not shift the next calls' generated names."""
    size, rank = hvd.size(), hvd.rank()
    # rank 0's first allreduce meets the others' first allgather: both fail everywhere,
    # and rank 0 has generated one allreduce name more than the others
    with pytest.raises(RuntimeError, match="collective"):
        if rank == 0:
            hvd.allreduce(torch.ones(2))
        else:
            hvd.allgather(torch.ones(2))
    got = hvd.allreduce(torch.ones(2), op=hvd.Sum)
    assert got.tolist() == [float(size)] * 2


@pytest.mark.mpi(min_size=2)
def test_given_names_must_match(hvd):
    rank = hvd.rank()
    with pytest.raises(RuntimeError, match="name"):
        hvd.allreduce(torch.ones(2), name=f"grad.{rank}")


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_sparse_allreduce_async(hvd, op):
    """Every rank's entries, side by side; coalesced, duplicates add up (divided for Average)."""
    size, rank = hvd.size(), hvd.rank()
    x = torch.sparse_coo_tensor([[rank % 3, 4]], [float(rank + 1), 1.0], (5,))
    wait = hvd.sparse_allreduce_async(x, name="emb", op=getattr(hvd, op))
    got = wait().coalesce().to_dense()
    want = torch.zeros(5)
    for r in range(size):
        want[r % 3] += r + 1
        want[4] += 1.0
    if op == "Average":
        want /= size
    assert torch.allclose(got, want)
    with pytest.raises(ValueError):
        hvd.sparse_allreduce_async(x.to_dense(), name="dense", op=hvd.Sum)


def test_the_rank_that_called_join_last_is_returned_whenever_its_work_ran(comm):
    # the stamp is taken where join is called: the collectives' thread may run the work later
    # (after this rank served others' optimizer steps), and its own clock would then decide
    from ccl.torch.joins import join_work

    def no_allreduce(spec):
        raise AssertionError("nothing to reduce: every rank joins at once")

    # rank 0 called last, and ranks 1.. in turn before it
    called = [10**6] + [1000 + r for r in range(1, comm.size)]
    assert join_work(comm, no_allreduce, stamp=called[comm.rank]) == 0
