"""OpenMP's idle spin, shortened before torch loads OpenMP.

OpenMP's idle threads spin GOMP_SPINCOUNT rounds before they sleep; its default, 300,000, holds a core for milliseconds
after a step, into the turn of another training on the same cores (shared_cores.py). OpenMP reads it once, when torch
loads it: the stage scripts, the benchmarks and the tests import this module (which loads nothing else) before torch,
and a run of a process that imported torch first says so when it starts taking turns.
"""

import os
import sys

# whether OpenMP will read the short spin: set by the user, or set here before torch loaded it
IN_TIME = "GOMP_SPINCOUNT" in os.environ or "torch" not in sys.modules
os.environ.setdefault("GOMP_SPINCOUNT", "10000")
