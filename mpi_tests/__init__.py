"""ccl's test suite: one tree, run with pytest (see the "Tests" section of CONTRIBUTING.md).

``mpi_tests/`` holds the serial and MPI tests, ``gpu/`` the GPU tests (run on
their own, under numba's CUDA simulator or on a GPU), ``helpers/`` what tests
share, ``harness/`` the programs tests launch as MPI jobs of their own, and
``golden/`` the stored wire-format payloads every later version must decode.
"""
