"""Reliability tools, run as modules: ``python -m ccl.tools.fuzz`` (payload decoders) and
``mpiexec -n 4 python -m mpi4py -m ccl.tools.soak`` (long mixed runs).

They need the test extra (``pip install 'ccl[test]'``, for hypothesis); see
``docs/reliability.md`` for what they check and the figures they gave.
"""
