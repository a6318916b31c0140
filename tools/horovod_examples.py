"""Run Horovod's own PyTorch examples, unmodified, on ``ccl.torch``.

Horovod's ``examples/pytorch/pytorch_mnist.py`` and
``examples/pytorch/pytorch_synthetic_benchmark.py`` are not part of this
repository: fetch them from the Horovod sources yourself and give their
paths. Each runs under ``mpiexec`` with ``import horovod.torch as hvd``
resolved to ``ccl.torch`` by the alias package of
:mod:`ccl.torch.horovod_alias`, written into a scratch folder put first on
``PYTHONPATH``; the files themselves are run as they are.

    python tools/horovod_examples.py --mnist pytorch_mnist.py \\
        --synthetic pytorch_synthetic_benchmark.py --np 2 4 --epochs 3

MNIST itself cannot be downloaded everywhere. The MNIST example gets
``--data-dir`` pointing at a scratch folder where scikit-learn's bundled
handwritten digits (1797 images, 8x8, 17 grey levels) are written in
MNIST's file format: each digit scaled to 20x20 and centred in 28x28, as
MNIST's digits are, and split into 1438 training and 359 test images
(a fifth), as the four uncompressed idx files torchvision's ``datasets.MNIST`` reads
from ``MNIST/raw/`` (it downloads nothing when they exist). The accuracies
printed are on these digits, not on MNIST.

For each rank count the MNIST example runs plain (exact averaging) and
with ``--fp16-allreduce``, and the final test accuracy it prints is
reported; the synthetic benchmark runs at the first rank count, plain and
with ``--fp16-allreduce``, on a small model, and its ``Total img/sec`` line
is reported. Both need torchvision (``pip install torchvision`` matching
your torch), which ccl itself does not need. CI does not run this (the
examples are not ours); ``docs/horovod.md`` quotes its results with the
command.
"""

import argparse
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# idx type codes (the third byte of the magic number) of the dtypes written here
IDX_TYPES = {np.dtype(np.uint8): 0x08}

SYNTHETIC_ARGS = ["--model", "resnet18", "--batch-size", "8", "--num-iters", "2",
                  "--num-batches-per-iter", "2", "--num-warmup-batches", "1"]


def write_idx(path, array):
    """Write ``array`` (uint8, 1 to 3 dimensions) as an idx file, MNIST's format.

    The header is two zero bytes, the type code, the number of dimensions,
    then each dimension as a big-endian 32-bit integer; the values follow
    in C order.
    """
    array = np.ascontiguousarray(array)
    if array.dtype not in IDX_TYPES or not 1 <= array.ndim <= 3:
        raise ValueError("idx files here hold uint8 arrays of 1 to 3 dimensions, not %s %dD"
                         % (array.dtype, array.ndim))
    with open(path, "wb") as f:
        f.write(struct.pack(">BBBB", 0, 0, IDX_TYPES[array.dtype], array.ndim))
        f.write(struct.pack(">%dI" % array.ndim, *array.shape))
        f.write(array.tobytes())


def resize(images, size):
    """Bilinear resize of ``(n, h, w)`` images to ``(n, size, size)`` (pixel centres aligned)."""
    n, h, w = images.shape
    rows = np.linspace(0, h - 1, size)
    cols = np.linspace(0, w - 1, size)
    r0 = np.floor(rows).astype(int)
    c0 = np.floor(cols).astype(int)
    r1 = np.minimum(r0 + 1, h - 1)
    c1 = np.minimum(c0 + 1, w - 1)
    fr = (rows - r0)[None, :, None]
    fc = (cols - c0)[None, None, :]
    top = images[:, r0][:, :, c0] * (1 - fc) + images[:, r0][:, :, c1] * fc
    bottom = images[:, r1][:, :, c0] * (1 - fc) + images[:, r1][:, :, c1] * fc
    return top * (1 - fr) + bottom * fr


def digits_as_mnist(images, labels, test_fraction=0.2, seed=0):
    """Scale 8x8 digits (values 0 to 16) to MNIST's 28x28 uint8 and split train/test.

    Returns ``{"train": (images, labels), "t10k": (images, labels)}``, named
    after MNIST's files.
    """
    scaled = resize(np.asarray(images, dtype=np.float64) / 16.0, 20)
    framed = np.zeros((len(scaled), 28, 28))
    framed[:, 4:24, 4:24] = scaled  # MNIST centres a 20x20 digit in 28x28
    pixels = np.clip(np.rint(framed * 255), 0, 255).astype(np.uint8)
    labels = np.asarray(labels, dtype=np.uint8)
    order = np.random.default_rng(seed).permutation(len(labels))
    test = int(round(len(labels) * test_fraction))
    return {"train": (pixels[order[test:]], labels[order[test:]]),
            "t10k": (pixels[order[:test]], labels[order[:test]])}


def write_mnist_folder(data_dir, splits):
    """Write ``splits`` as the four idx files of ``<data_dir>/MNIST/raw/``."""
    raw = os.path.join(data_dir, "MNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    for prefix, (images, labels) in splits.items():
        write_idx(os.path.join(raw, "%s-images-idx3-ubyte" % prefix), images)
        write_idx(os.path.join(raw, "%s-labels-idx1-ubyte" % prefix), labels)
    return raw


def job(script, args, nprocs, alias, timeout):
    """Run ``script`` unmodified at ``nprocs`` ranks with the alias first on the path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [alias, REPO, os.environ.get("PYTHONPATH", "")]))
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        mpiexec = "mpiexec"
    cmd = [mpiexec, "-n", str(nprocs), sys.executable, "-m", "mpi4py", script, *args]
    proc = subprocess.run(cmd, env=env, cwd=alias, check=False, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit("%s failed (return code %d):\n%s" % (
            " ".join(cmd), proc.returncode, (proc.stdout + proc.stderr)[-4000:]))
    return proc.stdout


def accuracies(output):
    """The test accuracies (percent) the MNIST example prints, one per epoch."""
    return [float(a) for a in re.findall(r"^Test set: Average loss: \S+, Accuracy: (\S+)%$",
                                         output, re.MULTILINE)]


def total_line(output):
    """The synthetic benchmark's last line, ``Total img/sec on N CPU(s): x +-y``."""
    found = re.findall(r"^Total img/sec on .*$", output, re.MULTILINE)
    if not found:
        raise SystemExit("no 'Total img/sec' line in:\n" + output[-2000:])
    return found[-1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist", help="path of Horovod's examples/pytorch/pytorch_mnist.py")
    parser.add_argument("--synthetic",
                        help="path of Horovod's examples/pytorch/pytorch_synthetic_benchmark.py")
    parser.add_argument("--np", type=int, nargs="+", default=[2, 4], help="rank counts")
    parser.add_argument("--epochs", type=int, default=3, help="the MNIST example's --epochs")
    parser.add_argument("--timeout", type=int, default=600, help="per job, seconds")
    args = parser.parse_args(argv)
    if not (args.mnist or args.synthetic):
        parser.error("give --mnist, --synthetic or both")
    try:
        import torchvision  # noqa: F401  (both examples import it; ccl does not)
    except ImportError as exc:
        raise SystemExit("Horovod's examples need torchvision: pip install torchvision "
                         "(the release that matches your torch)") from exc
    from ccl.torch import horovod_alias

    with tempfile.TemporaryDirectory(prefix="hvd-examples-") as scratch:
        alias = horovod_alias.write(os.path.join(scratch, "alias"))
        if args.mnist:
            from sklearn.datasets import load_digits

            digits = load_digits()
            data = os.path.join(scratch, "data")
            write_mnist_folder(data, digits_as_mnist(digits.images, digits.target))
            for nprocs in args.np:
                for extra in ([], ["--fp16-allreduce"]):
                    out = job(os.path.abspath(args.mnist),
                              ["--data-dir", data, "--epochs", str(args.epochs), *extra],
                              nprocs, alias, args.timeout)
                    found = accuracies(out)
                    print("pytorch_mnist.py ranks=%d %s: test accuracy per epoch %s, final %s%%"
                          % (nprocs, " ".join(extra) or "plain",
                             " ".join("%.2f" % a for a in found),
                             "%.2f" % found[-1] if found else "none"), flush=True)
        if args.synthetic:
            for extra in ([], ["--fp16-allreduce"]):
                out = job(os.path.abspath(args.synthetic), [*SYNTHETIC_ARGS, *extra],
                          args.np[0], alias, args.timeout)
                print("pytorch_synthetic_benchmark.py ranks=%d %s: %s"
                      % (args.np[0], " ".join(extra) or "plain", total_line(out)), flush=True)


if __name__ == "__main__":
    main()
