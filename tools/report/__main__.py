"""``python -m tools.report`` (from the repository root): regenerate docs/benchmarks.md."""

import sys

from . import main

sys.exit(main())
