"""Run an MPI program on an emulated cluster from Python: 4 hosts behind 1 Gbit/s links.

Run as root (network namespaces), without mpiexec: the cluster launches the ranks::

    sudo python examples/emulated_cluster.py

Elsewhere it says why it cannot build the cluster and exits.
"""

import os
import subprocess
import sys

from ccl.bench.cluster import EmulatedCluster, unavailable_reason

QUICKSTART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.py")

if unavailable_reason() is None:                    # root, iproute2, kernel support
    with EmulatedCluster(hosts=4, rate="1gbit") as cluster:   # built here ...
        before = cluster.tx_bytes(0)
        result = cluster.run([sys.executable, "-m", "mpi4py", QUICKSTART], timeout=600,
                             stdout=subprocess.PIPE, text=True)
        print(result.stdout, end="")
        print(result.returncode, cluster.tx_bytes(0) - before, "bytes sent by host 0")
    # ... and removed here, whatever happened
    sys.exit(result.returncode)
print("no emulated cluster here:", unavailable_reason())
