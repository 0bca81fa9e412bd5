# Two commands a newcomer needs:  `make demo` (the whole pipeline on the built-in data) and `make test`.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# Stages run `python ...` and servers spawn `uvicorn`: the venv's tools come first for every child process.
export VIRTUAL_ENV := $(CURDIR)/$(VENV)
export PATH := $(VIRTUAL_ENV)/bin:$(PATH)
# The project's own processes never phone home.
export DVC_NO_ANALYTICS := 1
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := 1


.PHONY: setup demo exp test test-fast test-durations lint format serve image serve-replicas ui screenshots regen reclaim clean \
	gpu-check

# pip's own output and progress bars, each step announced: the install takes minutes
$(VENV)/.installed: pyproject.toml torch.txt
	@echo "setup: [1/4] creating $(VENV)"
	python3 -m venv $(VENV)
	@echo "setup: [2/4] upgrading pip"
	$(PY) -m pip install --progress-bar on --upgrade pip
	# torch first, pinned in torch.txt: the CPU build on disk. A GPU user installs a CUDA build here instead
	# (docs/training.md).
	@echo "setup: [3/4] installing torch (torch.txt)"
	$(PY) -m pip install --progress-bar on -r torch.txt
	@echo "setup: [4/4] installing the project and its pinned libraries"
	$(PY) -m pip install --progress-bar on -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

# A Ctrl-C stops dvc, not the recipe's shell: the closing lines still put back what a stopped stage removed
demo: setup
	@trap : INT; $(VENV)/bin/dvc repro || { status=$$?; $(PY) -m thermal2visible.demo_record; exit $$status; }
	@echo
	@echo "Serve the champion:  make serve        (REST on params.yaml serve.host:serve.port, docs/serving.md)"
	@echo "Browse the runs:     make ui           (MLflow UI on http://127.0.0.1:5000, README: Where to look)"
	@$(PY) -m thermal2visible.demo_record

exp: setup  # `make exp PRESET=params/camera.yaml SET="train.max_epochs=50"`: a DVC experiment, refused up front if unrunnable
	$(PY) -m thermal2visible.dvc_experiment all "$(SET)" $(if $(PRESET),--preset $(PRESET))

serve: setup  # `make serve PORT=5002 MODEL=models:/NAME/VERSION` overrides serve.port and the champion
	$(PY) pipelines/serve.py $(if $(MODEL),--model $(MODEL)) $(if $(PORT),--set serve.port=$(PORT))

image: setup  # `make image MODEL=models:/NAME/VERSION BASE=python:3.11-slim`: a serving image (docs/serving.md)
	$(PY) pipelines/image.py $(if $(MODEL),--model $(MODEL)) $(if $(BASE),--base $(BASE))

N := 2
serve-replicas: setup  # `make serve-replicas N=3 PORT=5002`: N containers of the image behind a load balancer
	$(PY) pipelines/image.py --replicas $(N) $(if $(MODEL),--model $(MODEL)) $(if $(BASE),--base $(BASE)) \
		$(if $(PORT),--set serve.port=$(PORT))

UI_PORT := $(or $(PORT),5000)
ui: setup  # `make ui PORT=5050` for another port
	@echo "MLflow UI, model-training view: http://127.0.0.1:$(UI_PORT)/#/experiments?workflowType=machine_learning"
	$(VENV)/bin/mlflow ui -h 127.0.0.1 -p $(UI_PORT)  # MLflow's default store: ./mlflow.db, as the stages use

screenshots: setup
	$(PY) -m tools.screenshots

# What is written from the code rather than by hand: the stages' code deps in the pipeline files, the generated parts
# of docs/pipeline.md, docs/contributing.md and MLproject, and docs/params.md. `make regen CHECK=1` changes nothing
# and fails naming what is stale (the tests check each).
regen: setup
	$(PY) -m tools.stage_deps $(if $(CHECK),--check)
	$(PY) -m tools.docs $(if $(CHECK),--check)
	$(PY) -m tools.params_page $(if $(CHECK),--check)

# One test process per core (pytest-xdist): the suite is CPU-bound (three processes on two cores did the same work no
# faster). Each test module stays on one process, so its module-wide fixtures are built once, and the modules are
# dealt longest first (tests/support/longest_first.py), not xdist's most-tests-first, so the processes end together.
PARALLEL := -n auto --dist loadscope --no-loadscope-reorder
test: setup  # then the tests that must run by themselves (marked alone: they write into the package tree)
	$(PY) -m pytest $(PARALLEL) -m "not alone"
	$(PY) -m pytest -m alone

test-fast: setup  # the inner loop: no test that starts a Python process (tests/conftest.py holds them to the slow mark)
	$(PY) -m pytest $(PARALLEL) -m "not slow"

test-durations: setup  # a whole run that stores each module's time in tests/durations.json: the next runs' order
	$(PY) -m pytest $(PARALLEL) -m "not alone" --store-durations
	$(PY) -m pytest -m alone --store-durations

lint: setup  # what CI runs: the rules, and the format (`make format` applies it)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .

gpu-check:  # issue 58's GPU check on a CUDA machine (`make gpu-check ARGS=--dry-run` on a CPU); docs/training.md
	$(if $(wildcard $(PY)),$(PY),python3) -m benchmarks.gpu_check $(ARGS)

# Everything the project can rebuild: checkpoints/ (every run's resume state), DVC's cache of files the workspace no
# longer uses, the artifacts of deleted MLflow runs; each part named with its size first (docs/training.md)
reclaim: setup
	$(PY) -m thermal2visible.reclaim

clean:
	rm -rf $(VENV) data models checkpoints mlflow.db mlflow.db.lock mlruns mlartifacts reports/ingest_errors.json
