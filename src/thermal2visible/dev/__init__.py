"""Tooling around the project that no pipeline stage and no served model runs: real MLflow server processes for
tests and benchmarks (servers.py), the MLflow UI in headless Chromium (ui.py)."""
