"""What the tests share: ``from mpi_tests.helpers.<module> import ...``.

* :mod:`.launch`: the repository root and ``mpiexec`` jobs a test starts itself;
* :mod:`.codec_checks`, :mod:`.lossy_checks`: the codec contract, written once;
* :mod:`.adasum_reference`: Horovod's Adasum tree, in numpy;
* :mod:`.stepquant`: a small lossy test codec (registered by the suite's conftest);
* :mod:`.gpu`: the array modules of the GPU tests and their skip-or-fail rule.

The oracles of collectives (exact sums, replica consistency, error bounds)
are public, in :mod:`ccl.testing`. This package's ``__init__`` imports
nothing, so that the GPU tests can turn numba's CUDA simulator on before
anything imports numba.
"""
