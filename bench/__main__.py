"""``python -m bench``: the benchmark harness (see :mod:`bench.harness` and docs/benchmarks.md)."""

import sys

from bench.harness import main

sys.exit(main())
