"""Accuracy remedies on real gradients: compressed averages stay close to exact SGD's.

Every rank trains the digits MLP of ``ccl.bench.train`` (small) with the exact
average of the ranks' gradients while each codec averages the very same
gradients with error feedback (``ccl.bench.diagnose``). *drift* is the
relative error of the summed momentum SGD updates after the last step: how far
the weights would be from exact SGD's.
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

STEPS, HIDDEN = 12, 96
BOUND = 0.16  # s = 1 drifts further than this at every rank count measured


def _drifts(comm, specs, algorithm):
    from ccl.bench import diagnose

    variants, _ = diagnose.run(comm, specs, [algorithm], ["grad"], STEPS, HIDDEN, batch=32,
                               lr=0.05, seed=0)
    return [v.rows[-1]["drift"] for v in variants]


@pytest.mark.mpi
@pytest.mark.max_ranks(3)
def test_3lc_below_one_keeps_the_weights_near_exact_sgd(comm):
    # s = 1 (the paper's smallest, the default) holds back most of each gradient in the
    # residual; s = 0.5, allowed since, sends more of it now
    below, paper = _drifts(comm, [{"id": "3lc", "s": 0.5}, "3lc"], "direct")
    # measured at 1, 2 and 4 ranks: s = 0.5 0.10-0.12, s = 1 0.23-0.30
    assert below < 0.6 * paper
    assert below < BOUND
