"""Reliability tools, run as modules: ``python -m ccl.tools.fuzz`` (payload decoders) and
``mpiexec -n 4 python -m mpi4py -m ccl.tools.soak`` (long mixed runs).

They need the test extra (``pip install 'ccl[test]'``, for hypothesis); see
``docs/reliability.md`` for what they check and the figures they gave.
"""

#: Configurations exercised besides each registered codec's defaults: other body layouts
#: and parameters (fuzzed by ``ccl.tools.fuzz``, mixed into ``ccl.tools.soak``).
VARIANTS = (
    {"id": "3lc", "s": 1.5},
    {"id": "thc", "bits": 2, "block": 8},
    {"id": "thc", "bits": 3, "g": 7, "table": "uniform", "block": 64},
    {"id": "dithering", "levels": 7, "partition": "natural"},
    {"id": "dithering", "levels": 2000, "norm": "l2"},
    {"id": "randomk", "k": 5, "scale": True},
    {"id": "sidco", "density": 0.1, "dist": "gpareto", "stages": 3},
    {"id": "topk", "k": 1},
    {"id": "topk", "density": 1.0},
    {"id": "dgc", "density": 0.2, "seed": 7},
)
