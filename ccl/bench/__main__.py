"""``python -m ccl.bench [COMMAND] ...``: one of ``COMMANDS`` (default: allreduce)."""

import sys

COMMANDS = {
    "allreduce": "ccl.bench.allreduce",  # under mpiexec: codecs x algorithms vs MPI_Allreduce
    "codecs": "ccl.bench.codecs",        # no MPI needed: single-core encode/decode GB/s
    "accuracy": "ccl.bench.accuracy",    # under mpiexec: error of one call and of 100 steps
    "gradients": "ccl.bench.gradients",  # no MPI: codecs on real torch gradients (digits MLP)
    "selection": "ccl.bench.selection",  # no MPI: top-k selection time vs np.argpartition
    "steady": "ccl.bench.steady",        # no MPI: error feedback on real gradients, then zeros
    "train": "ccl.bench.train",          # under mpiexec: DDP hooks vs ccl codecs, time to accuracy
    "report": "ccl.bench.report",        # regenerate docs/benchmarks.md (all of the above)
    "cluster": "ccl.bench.cluster",      # root: run a command on an emulated rate-limited cluster
    "gpu": "ccl.bench.gpu",              # GPU + cupy: device encode/decode GB/s vs a device copy
    "gpu-allreduce": "ccl.bench.gpu_allreduce",  # under mpiexec: cupy arrays vs MPI_Allreduce
    "gpu-train": "ccl.bench.gpu_train",  # under mpiexec: optimizer steps on CUDA tensors
}
MPI_COMMANDS = ("allreduce", "accuracy", "train", "gpu-allreduce", "gpu-train")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    name = "allreduce"
    if argv and argv[0] in COMMANDS:
        name, argv = argv[0], argv[1:]
    if name in MPI_COMMANDS:
        from ccl.errors import LaunchError
        from ccl.launch import check_launch
        try:
            check_launch()  # before any timing: N singletons would each "benchmark" alone
        except LaunchError as exc:
            sys.stderr.write(f"python -m ccl.bench: {exc}\n")
            return 2
    module = __import__(COMMANDS[name], fromlist=["main"])
    return module.main(argv)


if __name__ == "__main__":
    sys.exit(main())
