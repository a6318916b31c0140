"""Scripts of this repository, not part of the installed package (run from the repository root).

``tools/gpu_check.py`` (with ``gpu_probe.py``) runs every GPU check on a machine without a
package index; ``python -m tools.report`` regenerates ``docs/benchmarks.md``;
``tools/horovod_suite.py`` runs Horovod's own tests against ``ccl.torch``.
"""
