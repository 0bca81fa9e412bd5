"""The project's own tooling, not part of the installed package: what is written from the code rather than by hand
(dvc.yaml's code deps, the docs' generated parts, docs/params.md) behind `make regen`, and the MLflow UI's
screenshots (`make screenshots`). Run from the project folder: `python -m tools.<name>`."""
