"""Benchmarks, run from the project root as `python -m benchmarks.<name>`: each measures in interleaved rounds
(rounds.py) and writes a new dated result, benchmarks/results/<date>-<name>.json (+ .md, .png); common.py holds what
they share. README.md says how figures are measured and indexes the results."""
