"""Benchmarks, run from the project root as `python -m benchmarks.<name>`: each measures in interleaved rounds
(rounds.py) and writes reports/<name>.json (+ .png); common.py holds what they share."""
