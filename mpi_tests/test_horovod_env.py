"""Horovod's variables that ccl.torch reads: the stall check; the others warn with a reason."""

import math
import time
import warnings

import pytest

torch = pytest.importorskip("torch")

import ccl.torch as ct  # noqa: E402
from ccl.transport import waits  # noqa: E402

# the torch layer above the collectives: 1-3 ranks (conftest.py says why)
pytestmark = [pytest.mark.mpi, pytest.mark.max_ranks(3)]


@pytest.fixture(autouse=True)
def _default_period():
    yield
    waits.set_default_stall_period(None)


@pytest.mark.mpi(min_size=2)
def test_horovod_stall_check_time_sets_the_stall_inspectors_period(comm, monkeypatch):
    monkeypatch.delenv("CCL_STALL_CHECK_SECONDS", raising=False)
    monkeypatch.setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "1")
    ct.init(comm)
    try:
        assert waits.stall_period() == 1.0
        model = torch.nn.Linear(4, 2)
        optimizer = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                            named_parameters=model.named_parameters(),
                                            compression=ct.Compression.fp16)
        late = ct.size() - 1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(2):  # the first step builds the channel
                if step == 1 and ct.rank() == late:
                    time.sleep(3.5)
                optimizer.zero_grad()
                model(torch.ones(3, 4)).sum().backward()
                optimizer.step()
        stalls = [str(w.message) for w in caught if "ccl: stall" in str(w.message)]
        if ct.rank() != late:
            assert any(f"no word from rank {late}:" in s for s in stalls), stalls
    finally:
        ct.shutdown()


def test_ccl_variable_wins_and_disable_turns_the_check_off(comm, monkeypatch):
    monkeypatch.setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "7")
    monkeypatch.setenv("CCL_STALL_CHECK_SECONDS", "3")
    ct.init(comm)
    ct.shutdown()
    assert waits.stall_period() == 3.0
    monkeypatch.delenv("CCL_STALL_CHECK_SECONDS")
    monkeypatch.setenv("HOROVOD_STALL_CHECK_DISABLE", "1")
    ct.init(comm)
    ct.shutdown()
    assert waits.stall_period() == math.inf
    monkeypatch.delenv("HOROVOD_STALL_CHECK_DISABLE")
    monkeypatch.delenv("HOROVOD_STALL_CHECK_TIME_SECONDS")
    ct.init(comm)
    ct.shutdown()
    assert waits.stall_period() == waits.STALL_DEFAULT_S


def test_cycle_time_warns_with_its_reason(comm, monkeypatch):
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "3.5")
    with pytest.warns(RuntimeWarning, match="HOROVOD_CYCLE_TIME: ccl starts each collective"):
        ct.init(comm)
    ct.shutdown()
