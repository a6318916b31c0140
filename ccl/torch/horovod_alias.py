"""Make ``import horovod.torch`` resolve to ``ccl.torch``, for Horovod programs run unmodified.

A Horovod program needs one changed line (``import ccl.torch as hvd``).
Where the file is not to be edited, for example Horovod's own examples,
write a ``horovod`` package into a folder and put the folder first on
``PYTHONPATH``::

    python -m ccl.torch.horovod_alias /tmp/hvd-alias
    PYTHONPATH=/tmp/hvd-alias mpiexec -n 4 python -m mpi4py pytorch_mnist.py

Its ``horovod.torch`` *is* ``ccl.torch`` (the module object itself, so
``hvd.Compression.fp16`` and every other name are ccl's); ``horovod.run``
(Horovod's Python launcher) raises :class:`NotImplementedError` that points
to ``python -m ccl.run``. Nothing else of Horovod is there: a program that
imports ``horovod.tensorflow`` or ``horovod.spark`` fails at that import.
The folder holds only these two small files; it is written by this module
and never installed, so a real Horovod installation is not shadowed
unless the folder is put on the path.
"""

import os
import sys

PACKAGE = '''"""Horovod's package name over ccl (written by ccl.torch.horovod_alias)."""

RUN_ADVICE = ("horovod.run is Horovod's launcher, not part of ccl: launch the program with "
              "python -m ccl.run -np N python -m mpi4py program.py (horovodrun's flags) "
              "or with mpiexec -n N python -m mpi4py program.py")


def run(*args, **kwargs):
    """Horovod's Python launcher: not available over ccl."""
    raise NotImplementedError(RUN_ADVICE)
'''

TORCH = '''"""``horovod.torch``: this module is ``ccl.torch`` (see ccl.torch.horovod_alias)."""
import sys

import ccl.torch

sys.modules[__name__] = ccl.torch
'''


def write(folder):
    """Write the ``horovod`` package (``horovod.torch`` is ``ccl.torch``) into ``folder``.

    Parameters
    ----------
    folder : str
        A folder to put first on ``PYTHONPATH``; made if missing. An older
        alias there is overwritten.

    Returns
    -------
    str
        ``folder``, for the caller's ``PYTHONPATH``.
    """
    package = os.path.join(folder, "horovod")
    os.makedirs(os.path.join(package, "torch"), exist_ok=True)
    for name, text in (("__init__.py", PACKAGE), (os.path.join("torch", "__init__.py"), TORCH)):
        with open(os.path.join(package, name), "w", encoding="utf-8") as f:
            f.write(text)
    return folder


def main(argv=None):
    """``python -m ccl.torch.horovod_alias FOLDER``: write the alias, print the folder."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m ccl.torch.horovod_alias FOLDER "
                         "(then put FOLDER first on PYTHONPATH)")
    print(os.path.abspath(write(argv[0])))


if __name__ == "__main__":
    main()
