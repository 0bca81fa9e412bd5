"""Tooling around the project that no pipeline stage and no served model runs: real MLflow server processes for
tests and benchmarks (servers.py), the MLflow UI in headless Chromium (ui.py), and what is written from the code
rather than by hand: dvc.yaml's code deps (stage_deps.py) and docs/pipeline.md's stage table (docs.py)."""
