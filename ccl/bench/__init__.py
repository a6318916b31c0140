"""Benchmarks: ``mpiexec -n 4 python -m mpi4py -m ccl.bench`` (see ``--help``).

Speed is measured here, side by side with the MPI library's own
``MPI_Allreduce`` in the same run, never in timed tests.
"""
