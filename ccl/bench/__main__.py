"""``python -m ccl.bench [COMMAND] ...``: one of ``COMMANDS`` (default: allreduce)."""

import sys

COMMANDS = {
    "allreduce": "ccl.bench.allreduce",  # under mpiexec: codecs x algorithms vs MPI_Allreduce
    "codecs": "ccl.bench.codecs",        # no MPI needed: single-core encode/decode GB/s
    "accuracy": "ccl.bench.accuracy",    # under mpiexec: error of one call and of 100 steps
    "diagnose": "ccl.bench.diagnose",    # under mpiexec: decoded vs exact average, real grads
    "gradients": "ccl.bench.gradients",  # no MPI: codecs on real torch gradients (digits MLP)
    "selection": "ccl.bench.selection",  # no MPI: top-k selection time vs np.argpartition
    "steady": "ccl.bench.steady",        # no MPI: error feedback on real gradients, then zeros
    "train": "ccl.bench.train",          # under mpiexec: DDP hooks vs ccl codecs, time to accuracy
    "lm": "ccl.bench.lm",                # under mpiexec: a small transformer, optimizers compared
    "cluster": "ccl.bench.cluster",      # root: run a command on an emulated rate-limited cluster
    "gpu": "ccl.bench.gpu",              # GPU + cupy: device encode/decode GB/s vs a device copy
    "decisions": "ccl.bench.decisions",  # launches mpiexec itself: auto's decisions, run to run
    "gpu-allreduce": "ccl.bench.gpu_allreduce",  # under mpiexec: cupy arrays vs MPI_Allreduce
    "gpu-train": "ccl.bench.gpu_train",  # under mpiexec: optimizer steps on CUDA tensors
    "calibrate": "ccl.bench.calibrate",  # no MPI: the cost model's codec inputs, one core
}
# Commands that left the installed package, and what runs them now.
MOVED = {
    "report": "regenerating docs/benchmarks.md is a script of ccl's repository now: "
              "from a source checkout's root, run python -m tools.report",
}
MPI_COMMANDS = ("allreduce", "accuracy", "diagnose", "train", "lm", "gpu-allreduce", "gpu-train")

SUMMARY = {
    "allreduce": "(default) codecs x algorithms x sizes against MPI_Allreduce; under mpiexec",
    "codecs": "encode/decode throughput of every codec on one core; no MPI",
    "accuracy": "error of one call and of 100 steps with error feedback; under mpiexec",
    "diagnose": "where accuracy goes: decoded vs exact average on real gradients; under mpiexec",
    "gradients": "codecs on real torch gradients (an MLP on digits); no MPI",
    "selection": "top-k selection time against numpy's argpartition; no MPI",
    "steady": "error feedback on real gradients, then on zeros; no MPI",
    "train": "DDP with its hooks against ccl's codecs: time to accuracy; under mpiexec",
    "lm": "a small transformer: exact AdamW, DistributedOptimizer, CompressedAdam; under mpiexec",
    "cluster": "run a command on an emulated cluster of rate-limited hosts; root",
    "gpu": "device encode/decode throughput against a device copy; GPU and cupy",
    "decisions": "launches the same job N times: does auto decide alike? (starts mpiexec)",
    "gpu-allreduce": "cupy arrays: compressed allreduce against MPI_Allreduce; under mpiexec",
    "gpu-train": "optimizer steps on CUDA tensors, lossy codecs against none; under mpiexec",
    "calibrate": "the cost model's codec inputs (speed, bits, error) on one core; no MPI",
}


def usage():
    """The list of commands, printed before the default command's options by ``--help``."""
    width = max(map(len, COMMANDS))
    lines = ["usage: python -m ccl.bench [COMMAND] [OPTIONS]", "",
             "commands (python -m ccl.bench COMMAND --help for each one's options):"]
    lines += [f"  {name:<{width}}  {SUMMARY[name]}" for name in COMMANDS]
    return "\n".join(lines) + "\n"


def _finalize_quietly():
    """End MPI cleanly where every rank stops on the same bad command line.

    ``python -m mpi4py`` turns a non-zero exit into ``MPI_Abort``, which
    prints a line per rank; every rank parsed the same arguments, so all of
    them get here and can finalize together instead.
    """
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    name = "allreduce"
    if argv and argv[0] in COMMANDS:
        name, argv = argv[0], argv[1:]
    elif argv and argv[0] in MOVED:
        sys.stderr.write(f"python -m ccl.bench {argv[0]}: {MOVED[argv[0]]}\n")
        return 2
    elif argv and not argv[0].startswith("-"):
        sys.stderr.write(f"python -m ccl.bench: unknown command {argv[0]!r}\n{usage()}")
        return 2
    elif any(a in ("-h", "--help") for a in argv):
        from .cli import world_rank

        if world_rank() == 0:
            sys.stdout.write(usage() + "\noptions of the default command, allreduce:\n")
    if name in MPI_COMMANDS:
        from ccl.errors import LaunchError
        from ccl.launch import check_launch
        try:
            check_launch()  # before any timing: N singletons would each "benchmark" alone
        except LaunchError as exc:
            sys.stderr.write(f"python -m ccl.bench: {exc}\n")
            return 2
    module = __import__(COMMANDS[name], fromlist=["main"])
    try:
        return module.main(argv)
    except SystemExit as exc:  # argparse: a bad option (2) or --help (0)
        if exc.code:
            _finalize_quietly()
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
