"""The MLflow UI as a person sees it: the pages that show this project's runs in MLflow's model-training view, and
their rendering by headless Chromium (Debian's `chromium`) for tests and for the screenshots under reports/ui/.

MLflow 3 opens an experiment on its GenAI dashboard (traces, tokens) whatever the experiment's kind; the query
parameter `workflowType=machine_learning` opens the model-training view instead, and the UI's
"GenAI | Model training" switch remembers the choice in the browser.

`python -m tools.screenshots` serves this project's store (MLFLOW_TRACKING_URI, else ./mlflow.db) on 127.0.0.1
and writes screenshots of the latest training run, its metrics and its registered version to reports/ui/.
"""

from __future__ import annotations

import contextlib
import html
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from mlflow import MlflowClient

from thermal2visible.errors import PipelineError
from thermal2visible.paths import UI_SCREENSHOTS
from tests.support.servers import mlflow_app
from thermal2visible.registry.gate import registered_model_name
from thermal2visible.tracking.store import tracking_uri

MODEL_TRAINING = "workflowType=machine_learning"
# The metric charts draw last, after their plotting library loads, and a long run's charts take a large share of
# headless Chromium's virtual time; the val_* charts sit low on the page.
CHARTS = dict(wait_ms=120000, height=2600)


def experiment_page(base: str, experiment_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}?{MODEL_TRAINING}"


def run_page(base: str, experiment_id: str, run_id: str, tab: str = "") -> str:
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}{'/' + tab if tab else ''}?{MODEL_TRAINING}"


def version_page(base: str, name: str, version: int | str) -> str:
    return f"{base}/#/models/{name}/versions/{version}?{MODEL_TRAINING}"


def chromium() -> str:
    found = shutil.which("chromium")
    if not found:
        raise PipelineError("chromium: not found (Debian: apt-get install chromium)")
    return found


def render(url: str, screenshot: Path | None = None, wait_ms: int = 15000, height: int = 1000) -> str:
    """The page's visible text once its scripts have run `wait_ms` (virtual time); a PNG of it to `screenshot`."""
    options = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--virtual-time-budget={wait_ms}",
        f"--window-size=1440,{height}",
    ]
    with tempfile.TemporaryDirectory() as profile:  # a fresh profile: nothing remembered from an earlier visit
        options.append(f"--user-data-dir={profile}")
        if screenshot:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [chromium(), *options, f"--screenshot={screenshot}", url], capture_output=True, timeout=120, check=True
            )
        dom = subprocess.run(
            [chromium(), *options, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=True
        ).stdout
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body)))


@contextlib.contextmanager
def mlflow_ui(store_uri: str, log_dir: Path) -> Iterator[str]:
    """`mlflow ui` on `store_uri` at a free 127.0.0.1 port; yields its base URL, always stops it."""
    with mlflow_app("ui", store_uri, log_dir / "mlflow-ui.log") as base:
        yield base


def screenshot_latest_training(store_uri: str, out_dir: Path, model_name: str, base: str) -> list[Path]:
    """Screenshots of the experiment, its latest `train` run (overview and metrics) and the model's latest version."""
    client = MlflowClient(store_uri)
    runs = client.search_runs(
        [experiment.experiment_id for experiment in client.search_experiments()],
        "attributes.run_name = 'train'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not runs:
        raise PipelineError(f"{store_uri}: no training run yet (run `dvc repro` first)")
    run = runs[0]
    experiment = run.info.experiment_id
    pages = {
        "experiment.png": experiment_page(base, experiment),
        "train_run.png": run_page(base, experiment, run.info.run_id),
        "train_run_metrics.png": run_page(base, experiment, run.info.run_id, "model-metrics"),
    }
    versions = client.search_model_versions(f"name = '{model_name}'", order_by=["version_number DESC"], max_results=1)
    if versions:
        pages["registered_version.png"] = version_page(base, model_name, versions[0].version)
    for name, url in pages.items():
        render(url, out_dir / name, **(CHARTS if name == "train_run_metrics.png" else {}))
    return [out_dir / name for name in pages]


def main() -> None:
    from thermal2visible.config.load import load_params

    uri = tracking_uri()
    with tempfile.TemporaryDirectory() as logs, mlflow_ui(uri, Path(logs)) as base:
        written = screenshot_latest_training(uri, UI_SCREENSHOTS, registered_model_name(load_params()), base)
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    try:
        main()
    except PipelineError as error:
        sys.exit(f"error: {error}")
