"""Run Horovod's own PyTorch test suite against ``ccl.torch`` and count the results.

Horovod's ``test/parallel/test_torch.py`` (and the ``common.py`` helpers it
imports, next to it) is not part of this repository and is not on PyPI: fetch
it from the Horovod sources yourself. This script writes, into a scratch folder,
a shim package ``horovod.torch`` that is ``ccl.torch`` (so the suite's
``import horovod.torch as hvd`` resolves to ccl) and a ``conftest.py`` with the
compatibility fixes the suite needs on current Python and torch (``inspect.getargspec``
is gone since Python 3.11; torch >= 2.9's ``Muon`` optimizer, which the suite's
"every optimizer" loops would try on 1-D biases, is left out like the suite leaves
out ``LBFGS``) and per-rank JUnit reports; then it runs the suite
under ``mpiexec`` at each requested number of ranks and prints, per rank count,
how many tests passed on every rank, failed on some rank, were skipped for
GPU/NCCL/Gloo-only reasons, or were skipped for other reasons.

    python tools/horovod_suite.py /path/to/test_torch.py --np 2 3 --isolate

Horovod's CI runs the suite at 2 ranks; at other counts a test that fails on
some ranks only (the suite's ``test_horovod_allgather_grad`` reuses ``size``
as a loop variable) leaves the ranks at different calls of every later test.
``--isolate`` runs each failed test again alone, in a job of its own, and
prints both counts.

CI does not run this (the suite is not ours); ``docs/horovod.md`` quotes its
figures with this command.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFTEST = '''"""Per-rank JUnit reports and the suite's compatibility fixes for this Python."""
import inspect
import os

if not hasattr(inspect, "getargspec"):  # removed in Python 3.11; the suite still calls it
    inspect.getargspec = inspect.getfullargspec


try:  # torch >= 2.9's Muon takes only 2-D parameters; the suite predates it and would
    import torch.optim  # try it on every model, so it is left out like LBFGS and SparseAdam
    torch.optim.Muon.__module__ = "torch_optim_left_out"
except AttributeError:
    pass


def pytest_configure(config):
    rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    config.option.xmlpath = os.path.join(os.environ["HVD_SUITE_REPORTS"], "rank%s.xml" % rank)
'''

NOT_CPU = ("gpu", "cuda", "nccl", "gloo")


def write_shim(folder):
    """Write the ``horovod`` alias package (``horovod.torch`` is ``ccl.torch``) into ``folder``."""
    sys.path.insert(0, REPO)  # ccl from this checkout, as the suite's ranks get it
    from ccl.torch import horovod_alias

    horovod_alias.write(folder)


def outcomes(report):
    """Map test name to (outcome, message) from one rank's JUnit XML."""
    result = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", child.get("message", "")
            elif child.tag == "skipped":
                outcome, message = "skipped", child.get("message", "")
        result[case.get("name")] = (outcome, message)
    return result


def tally(reports):
    """Combine per-rank outcomes: passed on every rank, failed on any rank, else skipped."""
    per_rank = [outcomes(r) for r in reports]
    names = sorted(set().union(*per_rank))
    counts = dict(passed=0, failed=0, skipped_not_cpu=0, skipped_other=0)
    failed = []
    for name in names:
        results = [r.get(name, ("failed", "missing on a rank")) for r in per_rank]
        kinds = {o for o, _ in results}
        if "failed" in kinds:
            counts["failed"] += 1
            failed.append((name, next(m for o, m in results if o == "failed")))
        elif kinds == {"passed"}:
            counts["passed"] += 1
        else:
            message = next(m for o, m in results if o == "skipped").lower()
            key = "skipped_not_cpu" if any(w in message for w in NOT_CPU) else "skipped_other"
            counts[key] += 1
    return counts, failed


def run(suite, nprocs, timeout, scratch, keyword=None, tests=None, label=""):
    """Run ``suite`` (or some ``tests`` of it) at ``nprocs`` ranks.

    Returns (counts, failed tests, return code).
    """
    reports = os.path.join(scratch, "np%d%s" % (nprocs, label))
    os.makedirs(reports, exist_ok=True)
    env = dict(os.environ, HVD_SUITE_REPORTS=reports,
               PYTHONPATH=os.pathsep.join([scratch, os.path.dirname(suite), REPO,
                                           os.environ.get("PYTHONPATH", "")]))
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    cmd = [mpiexec, "-n", str(nprocs), sys.executable, "-m", "mpi4py", "-m", "pytest", "-q",
           "-p", "no:cacheprovider", "--rootdir", scratch, "-c", os.devnull,
           "--confcutdir", scratch, "-p", "hvd_suite_conftest",
           "--timeout=%d" % timeout, "--timeout-method=thread"]
    cmd += ["%s::TorchTests::%s" % (suite, t) for t in tests] if tests else [suite]
    if keyword:
        cmd += ["-k", keyword]
    proc = subprocess.run(cmd, env=env, cwd=scratch, check=False, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    files = [os.path.join(reports, "rank%d.xml" % r) for r in range(nprocs)]
    if all(os.path.exists(f) for f in files):
        counts, failed = tally(files)
        return counts, failed, proc.returncode
    # a rank was killed (pytest-timeout on a hang): without its report the tests it ran
    # are unknown, so every test asked for counts as failed
    if not tests:
        raise SystemExit("no report from some rank (the run died; return code %d); "
                         "try -k to leave out the test that hung" % proc.returncode)
    counts = dict(passed=0, failed=len(tests), skipped_not_cpu=0, skipped_other=0)
    return counts, [(t, "the run died (return code %d)" % proc.returncode) for t in tests], \
        proc.returncode


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", help="path of Horovod's test_torch.py (common.py beside it)")
    parser.add_argument("--np", type=int, nargs="+", default=[2, 3], help="rank counts")
    parser.add_argument("--timeout", type=int, default=120, help="per-test limit, seconds")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (a subset of the suite)")
    parser.add_argument("--isolate", action="store_true",
                        help="run each test that failed again alone, in a job of its own")
    args = parser.parse_args(argv)
    suite = os.path.abspath(args.suite)
    with tempfile.TemporaryDirectory(prefix="hvd-suite-") as scratch:
        write_shim(scratch)
        with open(os.path.join(scratch, "hvd_suite_conftest.py"), "w", encoding="utf-8") as f:
            f.write(CONFTEST)
        for nprocs in args.np:
            counts, failed, code = run(suite, nprocs, args.timeout, scratch, args.keyword)
            ran = counts["passed"] + counts["failed"]
            print("ranks=%d passed=%d failed=%d skipped_other=%d skipped_gpu=%d "
                  "(passed %d of %d run on CPU) rc=%d"
                  % (nprocs, counts["passed"], counts["failed"], counts["skipped_other"],
                     counts["skipped_not_cpu"], counts["passed"], ran, code), flush=True)
            for name, message in failed:
                print("  FAILED %s: %s" % (name, message.splitlines()[0][:150] if message
                                           else ""))
            if not args.isolate:
                continue
            # a test that failed on some ranks only leaves the ranks at different calls
            # of the next tests (Horovod's suite runs at 2 ranks in its CI): each failed
            # test runs again alone, in a job of its own
            alone = 0
            for i, (name, _) in enumerate(failed):
                got, again, _ = run(suite, nprocs, args.timeout, scratch, tests=[name],
                                    label="-alone%d" % i)
                alone += got["passed"]
                status = "passed" if got["passed"] else "FAILED"
                print("  alone: %s %s%s" % (status, name, "" if got["passed"] else
                                             ": " + again[0][1].splitlines()[0][:150]
                                             if again and again[0][1] else ""))
            print("ranks=%d isolated: passed %d of %d run on CPU (%d failed in the whole-file "
                  "run passed alone)" % (nprocs, counts["passed"] + alone, ran, alone),
                  flush=True)


if __name__ == "__main__":
    main()
