"""tools/horovod_examples.py's own parts, and the alias that resolves ``horovod.torch``.

The tool runs Horovod's example programs (not in this repository) on
``ccl.torch``; these serial tests check what it writes without them: the idx
files (MNIST's format) parsed back here without torchvision, the digits
scaled to MNIST's shape, and the ``horovod`` alias package of
:mod:`ccl.torch.horovod_alias`, imported in a process of its own and run
under ``mpiexec`` by a program written in Horovod's import only.
"""

import os
import re
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from mpi_tests.helpers.launch import ROOT, launch, load_tool

pytest.importorskip("torch")

from ccl.torch import horovod_alias  # noqa: E402

tool = load_tool("horovod_examples")


def read_idx(path):
    """Parse an idx file by its specification: (type code, shape, values)."""
    with open(path, "rb") as f:
        data = f.read()
    zero, kind, ndim = struct.unpack(">HBB", data[:4])
    assert zero == 0
    shape = struct.unpack(">%dI" % ndim, data[4:4 + 4 * ndim])
    values = np.frombuffer(data[4 + 4 * ndim:], dtype=np.uint8)
    assert values.size == int(np.prod(shape)), "values do not fill the header's shape"
    return kind, shape, values.reshape(shape)


@pytest.mark.serial
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4)])
def test_idx_writer_writes_the_header_and_values_of_mnists_format(tmp_path, shape):
    array = np.random.default_rng(1).integers(0, 256, size=shape, dtype=np.uint8)
    path = str(tmp_path / "a-idx")
    tool.write_idx(path, array)
    kind, got_shape, values = read_idx(path)
    assert kind == 0x08  # unsigned byte
    assert got_shape == shape
    np.testing.assert_array_equal(values, array)
    # two zero bytes, type, rank, then big-endian sizes: MNIST's train images start so
    with open(path, "rb") as f:
        assert f.read(4) == bytes([0, 0, 8, len(shape)])


@pytest.mark.serial
def test_idx_writer_refuses_what_the_format_here_does_not_hold(tmp_path):
    with pytest.raises(ValueError):
        tool.write_idx(str(tmp_path / "f"), np.zeros((2, 2), dtype=np.float32))
    with pytest.raises(ValueError):
        tool.write_idx(str(tmp_path / "f"), np.zeros((1, 1, 1, 1), dtype=np.uint8))


@pytest.mark.serial
def test_digits_are_written_in_mnists_shape_split_and_file_names(tmp_path):
    from sklearn.datasets import load_digits

    digits = load_digits()
    splits = tool.digits_as_mnist(digits.images, digits.target)
    raw = tool.write_mnist_folder(str(tmp_path), splits)
    assert sorted(os.listdir(raw)) == ["t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
                                       "train-images-idx3-ubyte", "train-labels-idx1-ubyte"]
    _, train_shape, train = read_idx(os.path.join(raw, "train-images-idx3-ubyte"))
    _, test_shape, test = read_idx(os.path.join(raw, "t10k-images-idx3-ubyte"))
    _, _, train_labels = read_idx(os.path.join(raw, "train-labels-idx1-ubyte"))
    _, _, test_labels = read_idx(os.path.join(raw, "t10k-labels-idx1-ubyte"))
    assert train_shape == (1438, 28, 28) and test_shape == (359, 28, 28)
    assert sorted(np.concatenate([train_labels, test_labels])) == sorted(digits.target)
    # a 20x20 digit centred in 28x28, ink up to full white, as in MNIST
    both = np.concatenate([train, test])
    assert both[:, :4].max() == 0 and both[:, 24:].max() == 0
    assert both[:, :, :4].max() == 0 and both[:, :, 24:].max() == 0
    assert both.max() == 255
    # the scaled image is the 8x8 digit: its corners are the digit's corner pixels
    order = np.random.default_rng(0).permutation(len(digits.target))
    first = digits.images[order[359]]
    assert train[0, 4, 4] == round(first[0, 0] / 16 * 255)
    assert train[0, 23, 23] == round(first[7, 7] / 16 * 255)
    assert train_labels[0] == digits.target[order[359]]


@pytest.mark.serial
def test_torchvisions_mnist_reads_the_digits_without_downloading(tmp_path):
    datasets = pytest.importorskip("torchvision.datasets")
    from sklearn.datasets import load_digits

    digits = load_digits()
    tool.write_mnist_folder(str(tmp_path), tool.digits_as_mnist(digits.images, digits.target))
    train = datasets.MNIST(str(tmp_path), train=True, download=True)
    test = datasets.MNIST(str(tmp_path), train=False)
    assert (len(train), len(test)) == (1438, 359)
    image, label = train[0]
    assert image.size == (28, 28) and 0 <= label <= 9


def run_python(code, alias):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([alias, ROOT]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120, check=False)


@pytest.mark.serial
def test_the_alias_makes_horovod_torch_ccl_torch(tmp_path):
    alias = horovod_alias.write(str(tmp_path / "alias"))
    result = run_python(textwrap.dedent("""
        import horovod
        import horovod.torch as hvd
        import ccl.torch
        assert hvd is ccl.torch and horovod.torch is ccl.torch
        assert hvd.Compression.fp16 is ccl.torch.Compression.fp16
        from horovod.torch import DistributedOptimizer
        assert DistributedOptimizer is ccl.torch.DistributedOptimizer
        try:
            horovod.run(print, np=2)
        except NotImplementedError as exc:
            assert "python -m ccl.run" in str(exc)
        else:
            raise AssertionError("horovod.run ran")
        print("ok")
    """), alias)
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr[-3000:]


@pytest.mark.serial
def test_the_alias_command_writes_the_folder(tmp_path):
    folder = str(tmp_path / "cmd")
    result = subprocess.run([sys.executable, "-m", "ccl.torch.horovod_alias", folder],
                            capture_output=True, text=True, timeout=120, check=False,
                            env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == os.path.abspath(folder)
    assert run_python("import horovod.torch, ccl.torch; "
                      "assert horovod.torch is ccl.torch", folder).returncode == 0


@pytest.mark.serial
def test_a_program_in_horovods_import_runs_unmodified_under_mpiexec(tmp_path, monkeypatch):
    alias = horovod_alias.write(str(tmp_path / "alias"))
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent("""
        import torch
        import horovod.torch as hvd

        hvd.init()
        total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), name="t", op=hvd.Sum)
        half = hvd.allreduce(torch.tensor([1.0 + hvd.rank()]), name="h",
                             compression=hvd.Compression.fp16)
        print("rank %d of %d: %g %g" % (hvd.rank(), hvd.size(), total.item(), half.item()))
    """))
    monkeypatch.setenv("PYTHONPATH", alias)
    result = launch(["-m", "mpi4py", str(program)], 2, 120)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    # the ranks share mpiexec's stdout: one rank's line may run into the other's
    found = re.findall(r"rank (\d) of (\d): ([\d.]+) ([\d.]+)", result.stdout)
    assert sorted(found) == [("0", "2", "3", "1.5"), ("1", "2", "3", "1.5")], result.stdout
