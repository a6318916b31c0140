"""Command line of the benchmark: ``python -m ccl.bench`` under mpiexec."""

import sys

from .allreduce import main

if __name__ == "__main__":
    sys.exit(main())
