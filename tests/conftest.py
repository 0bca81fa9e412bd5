"""Shared fixtures: tiny params, a params.yaml writer, and a tiny cache built by the real data stages."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import mlflow
import pytest
import yaml
from filelock import FileLock

os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
os.environ["DVC_NO_ANALYTICS"] = "1"
# The tests' child processes track in their working folder's own store, never in a team server that the shell
# running the tests points at.
os.environ.pop("MLFLOW_TRACKING_URI", None)
# Test trainings run one thread each (TINY below), so two test processes' trainings fit two cores side by side: each
# pytest-xdist worker takes turns for the cores (training.shared_cores) only among its own trainings.
# pytest-xdist names each worker in its environment (gw0, gw1, ...): set from a worker's start, before any hook runs.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER:
    _turns = Path(tempfile.gettempdir()) / f"thermal2visible-tests-{os.getuid()}-{XDIST_WORKER}"
    _turns.mkdir(mode=0o700, exist_ok=True)
    os.environ["XDG_RUNTIME_DIR"] = str(_turns)

import thermal2visible.training.openmp_spin  # noqa: E402, F401 (before torch: OpenMP's short idle spin, as train.py has it)
from tests.support.shipped import SHIPPED_TEXT  # noqa: E402 (env set)
from thermal2visible.config.load import apply_override, load_params, preset_overrides  # noqa: E402
from thermal2visible.config.schema import Params  # noqa: E402
from tests.support.built_once import built_once  # noqa: E402
from tests.support.projects import copy_project  # noqa: E402
from tests.support.servers import quiet_env  # noqa: E402

pytest_plugins = ["tests.support.longest_first"]  # the order of the modules: longest first

REPO = Path(__file__).resolve().parents[1]
# and one thread: tests compare weights bit for bit, on machines of any core count
# The tiny pipeline's 32-px model of two epochs is far below the mean-image baseline: with no margin it would
# never be served, and the tests that serve, gate or replace a champion need one
TINY = (*preset_overrides(REPO / "params" / "tiny.yaml"), "train.threads=1", "register.baseline_margin=-100.0")


def _write_params(directory: Path, *overrides: str) -> Path:
    """The shipped params.yaml with the tiny settings and then `overrides` (section.key=value) applied."""
    raw = yaml.safe_load(SHIPPED_TEXT)
    for override in (*TINY, *overrides):
        apply_override(raw, override)
    path = Path(directory) / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    load_params(path)  # fail here, naming the key, rather than in the test that uses it
    return path


@pytest.fixture
def write_params():
    """`write_params(directory, "section.key=value", ...) -> path` of a tiny params.yaml written there."""
    return _write_params


@pytest.fixture
def tiny_params(tmp_path) -> Params:
    return load_params(_write_params(tmp_path))


def run_script(script: str, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run pipelines/<script> from `cwd` as DVC would; output captured as text."""
    command = [sys.executable, str(REPO / "pipelines" / script), *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def run_stage_script():
    """`run_stage_script("ingest.py", cwd, "--set", "ingest.on_error=skip") -> CompletedProcess`."""
    return run_script


def run_benchmark_module(name: str, cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `python -m benchmarks.<name>` from `cwd` (the repo on the module path); output captured as text."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        cwd=cwd,
        env=os.environ | {"PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def run_benchmark():
    """`run_benchmark("load", cwd, "--clients", "4", timeout=300) -> CompletedProcess`."""
    return run_benchmark_module


@pytest.fixture(scope="session")
def tracking_uri(tmp_path_factory):
    """A real `mlflow server` on 127.0.0.1 for the whole session, its store in a temporary folder; tests that share
    it keep apart by their own model and experiment names."""
    from tests.support.servers import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


def shared_folder(tmp_path_factory) -> Path:
    """The run's folder that every test process sees: pytest-xdist's workers share their base temporary folder's
    parent."""
    return tmp_path_factory.getbasetemp().parent if XDIST_WORKER else tmp_path_factory.getbasetemp()


def _build_tiny_cache(work: Path) -> None:
    from thermal2visible.data.cache import build_cache
    from thermal2visible.data.ingest import ingest
    from thermal2visible.data.synthetic import synthesize

    params = load_params(_write_params(work))
    synthesize(params.synthesize, work / "raw")
    index, _ = ingest(work / "raw", "pairs", params.ingest)
    build_cache(index, params.preprocess, params.ingest.max_pixels, work / "cache", on_error="fail")


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory) -> Path:
    """A cache dir (manifest.json + arrays) made by synthesize -> ingest -> preprocess on tiny data."""
    return built_once(shared_folder(tmp_path_factory), "tiny_data", _build_tiny_cache) / "cache"


def make_project(repo: Path) -> Path:
    """A fresh git + DVC repo at `repo` holding the project's pipeline files and tiny params, as a user's clone
    would."""
    copy_project(repo, "examples", "docs")
    _write_params(repo)
    dvc = str(Path(sys.executable).with_name("dvc"))
    commit = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"]
    for command in (
        ["git", "init", "-q"],
        [dvc, "init", "-q"],
        [dvc, "config", "core.analytics", "false"],
        ["git", "add", "-A"],
        commit,
    ):
        subprocess.run(command, cwd=repo, check=True, capture_output=True)
    return repo


@pytest.fixture
def project_copy(tmp_path) -> Path:
    return make_project(tmp_path / "project")


def _run_the_pipeline(folder: Path, *overrides: str) -> None:
    repo = make_project(folder / "project")
    if overrides:
        _write_params(repo, *overrides)
        commit = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "params"]
        subprocess.run(commit, cwd=repo, check=True, capture_output=True)
    done = subprocess.run(  # quiet_env: the stages run this interpreter's `python`
        [str(Path(sys.executable).with_name("dvc")), "repro"], cwd=repo, capture_output=True, text=True, env=quiet_env()
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="session")
def pipeline_project(tmp_path_factory) -> Path:
    """A project in which the whole tiny pipeline has run (`dvc repro`): its outputs, dvc.lock and MLflow store
    (mlflow.db), shared by the tests that only read it or copy it."""
    return built_once(shared_folder(tmp_path_factory), "pipeline", _run_the_pipeline) / "project"


# The guides' sweeps try batches of up to 64: four times the tests' faces fill one
GUIDE_DATA = "synthesize.images_per_identity=24"


@pytest.fixture(scope="session")
def guides_project(tmp_path_factory) -> Path:
    """A project in which the tiny pipeline ran on the guides' data (tests/system/test_guides.py): what each guide's
    session starts from."""
    build = lambda folder: _run_the_pipeline(folder, GUIDE_DATA)  # noqa: E731
    return built_once(shared_folder(tmp_path_factory), "guides", build) / "project"


@pytest.fixture(scope="session")
def docker_tags(tmp_path_factory) -> FileLock:
    """Held by a test while it builds and runs serving images: their tags are the registered model's name, the same
    in every test project, so one test process at a time may set and use them."""
    return FileLock(shared_folder(tmp_path_factory) / "docker-tags.lock")


def copy_without_store(project: Path, folder: Path) -> Path:
    """A copy of a project that ran the pipeline, less its MLflow store (its runs name the original's artifact folder)
    and DVC's locks and state: the shared project stays as it was built, whatever a test does to its copy."""

    def left_out(parent: str, names: list[str]) -> set[str]:
        if Path(parent).name == ".dvc":
            return {"tmp"} & set(names)
        return {"mlflow.db", "mlruns", "mlartifacts"} & set(names)

    shutil.copytree(project, folder, symlinks=True, ignore=left_out)
    return folder


@pytest.fixture(autouse=True)
def no_inherited_mlflow_context():
    """Every test starts from the environment the session began with and leaves it so: `mlflow.set_tracking_uri`
    and `mlflow.set_experiment` (in fixtures too) export MLFLOW_TRACKING_URI / MLFLOW_EXPERIMENT_ID, which every
    later test's subprocess would otherwise inherit and log into another test's store."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
        os.environ.pop(name, None)
    mlflow.set_tracking_uri(None)
    before = dict(os.environ)
    yield
    mlflow.set_tracking_uri(None)
    os.environ.clear()
    os.environ.update(before)


# Programs that run the command they are given: a shell its `-c` script, the others the rest of their arguments.
SHELLS = {"sh", "bash", "dash", "zsh"}
LAUNCHERS = {"env", "nice", "timeout", "setsid", "xargs"}


def python_program(args) -> bool:
    """Whether a Popen argument list starts Python: this interpreter, another one, or a command of its venv (dvc,
    mlflow, uvicorn: Python too, by path or found on PATH), directly or through a launcher."""
    words = [str(word) for word in args] if isinstance(args, (list, tuple)) else shlex.split(str(args))
    program = Path(shutil.which(words[0]) or words[0]) if words else Path()
    if program.name.startswith("python") or program.parent == Path(sys.executable).parent:
        return True
    if program.name in SHELLS and "-c" in words[:-1]:
        return any(python_program([word]) for word in shlex.split(words[words.index("-c") + 1]))
    if program.name in LAUNCHERS:
        return any(python_program([word]) for word in words[1:])
    return False


def pytest_collection_modifyitems(config, items):
    """A test marked `alone` changes what every other test reads (the package tree): beside pytest-xdist's other
    workers it is skipped, saying how to run it (make test runs it by itself after the rest)."""
    if XDIST_WORKER:
        beside_others = pytest.mark.skip(
            reason="writes into the package tree: run alone (`pytest -m alone`, as make test does)"
        )
        for item in items:
            if item.get_closest_marker("alone"):
                item.add_marker(beside_others)


@pytest.fixture(autouse=True)
def fast_tests_start_no_python(request, monkeypatch):
    """`make test-fast` is the inner loop. A test that starts a Python process (a stage script, a benchmark, dvc,
    a server: seconds of imports each) belongs under the slow marker, and fails here until it has it, so the inner
    loop stays fast as tests are added."""
    if request.node.get_closest_marker("slow"):
        return
    start = subprocess.Popen.__init__

    def refuse_python(self, args, *more, **options):
        if python_program(args):
            pytest.fail(f"{request.node.nodeid} starts {args[:3]}: mark it @pytest.mark.slow (a Python process)")
        start(self, args, *more, **options)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse_python)
