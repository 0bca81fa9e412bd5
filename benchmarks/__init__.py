"""Benchmarks, run from the project root as `python -m benchmarks.<name>`: each measures in interleaved rounds
(rounds.py) and writes a new dated result, benchmarks/results/<date>-<name>.json (+ .md, .png); common.py holds what
they share. README.md says how figures are measured and indexes the results."""

# before any benchmark loads torch: OpenMP's short idle spin, as the stage scripts have it (training/openmp_spin.py)
import thermal2visible.training.openmp_spin  # noqa: E402, F401
