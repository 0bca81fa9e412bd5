"""pipelines/study.py end to end on tiny data: real DVC experiments through DVC's queue and real training runs in
scratch projects, one MLflow parent, a markdown table. The quality study's command of docs/studies.md runs here with
a budget of seconds instead of its minutes."""

import importlib.util
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from benchmarks.queue_sweep import tiny_project
from tests.support.servers import quiet_env
from thermal2visible.paths import TRAIN_METRICS
from pipelines.studies.queue import shown_experiments
from tests.support.figures import assert_drawn

REPO = Path(__file__).resolve().parents[2]
TINY_STUDY = (
    "preprocess.image_size=16",
    "model.generator_settings.ngf=4",
    "model.discriminator_settings.ndf=4",
    "train.max_epochs=2",
    "early_stop.window=1",
    "early_stop.patience=1",
)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_batch_study_runs_its_points_through_dvcs_queue_and_tables_each_experiments_own_run(tmp_path):
    project = tiny_project(tmp_path / "project", baseline=False)
    params_before = (project / "params.yaml").read_bytes()
    overrides = [arg for override in TINY_STUDY for arg in ("--set", override)]
    study = [sys.executable, str(REPO / "pipelines" / "study.py"), "--study", "batch", "--quick", "--values", "2", "4"]
    result = subprocess.run(
        [*study, "--jobs", "2", *overrides], cwd=project, capture_output=True, text=True, timeout=400, env=quiet_env()
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]

    (report,) = (project / "reports" / "study").glob("*-batch.md")  # a new dated report
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-batch\.md", report.name)
    rows = {
        row[0].strip(): row
        for row in (line.split("|")[1:-1] for line in report.read_text().splitlines() if line.startswith("| "))
    }
    children = json.loads(report.with_suffix(".json").read_text())
    shown = shown_experiments(project, [child["dvc_experiment"] for child in children])
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    (parent,) = client.search_runs(
        [client.get_experiment_by_name("thermal2visible").experiment_id], "attributes.run_name = 'study-batch'"
    )
    for batch, child in zip(("2", "4"), children):
        committed = shown[child["dvc_experiment"]]
        assert committed["params"]["params.yaml"]["data"]["train"]["batch_size"] == int(batch)
        trained = committed["metrics"][str(TRAIN_METRICS)]["data"]
        assert rows[batch][1].strip() == str(trained["stopped_epoch"])
        assert rows[batch][3].strip() == f"{trained['best_psnr_smoothed']:.2f}"
        run = client.get_run(child["mlflow_run_id"])  # the experiment's own train run, nested under the study
        assert re.fullmatch(r"[0-9a-f]{16}", run.data.tags["fingerprint"])  # metrics/train.json holds numbers only
        assert run.data.tags["dvc_experiment"] == child["dvc_experiment"]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.params["train.batch_size"] == batch and run.data.params["preprocess.image_size"] == "16"
    assert_drawn(report.with_suffix(".png"))
    assert (project / "params.yaml").read_bytes() == params_before  # the experiments ran in DVC's copies
    assert not (project / "models" / "generator.pt").exists()


@pytest.mark.slow
def test_batch_study_outside_a_dvc_project_says_so_and_starts_nothing(tmp_path, write_params):
    write_params(tmp_path)
    result = subprocess.run(
        [sys.executable, str(REPO / "pipelines" / "study.py"), "--study", "batch"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "DVC's queue runs experiments from a git commit" in result.stderr
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_quality_study_trains_every_configuration_for_the_same_budget_and_grids_the_same_faces(
    tmp_path, write_params, run_stage_script
):
    write_params(tmp_path)
    for folder in ("pipelines", "params"):
        (tmp_path / folder).symlink_to(REPO / folder)
    for stage in ("synthesize.py", "ingest.py"):
        assert run_stage_script(stage, tmp_path).returncode == 0
    tiny = (
        "preprocess.image_size=32",
        "model.generator_settings.ngf=4",
        "model.discriminator_settings.ndf=4",
        "early_stop.window=1",
        "early_stop.patience=2",
        "train.min_epochs=2",
    )
    overrides = [arg for override in tiny for arg in ("--set", override)]
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "pipelines" / "study.py"),
            "--study",
            "quality",
            "--seeds",
            "3",
            "--minutes",
            "0.05",
            *overrides,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=390,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]

    (report,) = (tmp_path / "reports" / "study").glob("*-quality.md")  # a new dated report
    rows = {
        row[0].strip(): row
        for row in (
            [cell for cell in line.split("|")[1:-1]]
            for line in report.read_text().splitlines()
            if line.startswith("| ")
        )
    }
    assert list(rows)[1:] == ["default", "multi-scale D", "feature matching", "ResNet generator", "best combination"]
    kept, scored = {}, {}  # each configuration's validation PSNR per seed (its training's) and test PSNR (evaluate's)
    for child in json.loads(report.with_suffix(".json").read_text()):
        name = child["name"].rsplit(" seed ", 1)[0]
        kept.setdefault(name, []).append(child["best_psnr_smoothed"])
        scored.setdefault(name, []).append(child["eval"]["generator"]["psnr"])
    for name in list(rows)[1:]:
        assert rows[name][3].strip() == f"{statistics.mean(kept[name]):.2f}", name  # chosen by: validation
        assert rows[name][4].strip() == f"{statistics.mean(scored[name]):.3f}", name  # reported beside: test
    for picture in (".png", "_grid.png"):
        assert_drawn(report.with_name(report.stem + picture))

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("thermal2visible").experiment_id])
    (parent,) = [run for run in runs if run.info.run_name == "study-quality"]
    children = {
        run.data.tags["study_point"]: run.data.params
        for run in runs
        if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    }
    assert len(children) == 5 and all(
        params["train.max_minutes"] == "0.05" and params["train.seed"] == "3" for params in children.values()
    )
    assert children["quality: ResNet generator seed 3"]["model.generator"] == "resnet"
    assert json.loads(children["quality: multi-scale D seed 3"]["model.discriminator_settings"])["scales"] == 2
    assert children["quality: feature matching seed 3"]["train.lambda_feat"] == "10.0"
    assert children["quality: default seed 3"]["model.generator"] == "unet"


def test_a_study_writes_new_dated_files_and_replaces_files_only_under_out(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(REPO / "pipelines")  # as running the script puts its folder first
    spec = importlib.util.spec_from_file_location("study_script", REPO / "pipelines" / "study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    monkeypatch.chdir(tmp_path)
    first = study.report_stem("quality", None)
    assert first.parent == Path("reports/study") and re.fullmatch(r"\d{4}-\d{2}-\d{2}-quality", first.name)
    first.parent.mkdir(parents=True)
    Path(f"{first}_grid.png").write_bytes(b"png")  # any of a study's files takes the day's name
    assert study.report_stem("quality", None).name == f"{first.name}-2"
    assert study.report_stem("quality", tmp_path / "mine") == tmp_path / "mine" / "quality"  # asked for: replaced
