"""pipelines/study.py end to end on tiny data: real child training runs, one MLflow parent, a markdown table."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
TINY_STUDY = (
    "preprocess.image_size=16",
    "model.ngf=4",
    "model.ndf=4",
    "train.max_epochs=2",
    "early_stop.window=1",
    "early_stop.patience=1",
)


@pytest.mark.timeout(180)
def test_quick_batch_study_logs_children_under_one_parent_and_writes_the_table(
    tmp_path, write_params, run_stage_script
):
    write_params(tmp_path)
    for folder in ("pipelines", "params"):  # the study runs from a project folder
        (tmp_path / folder).symlink_to(REPO / folder)
    for stage in ("synthesize.py", "ingest.py"):
        assert run_stage_script(stage, tmp_path).returncode == 0
    overrides = [arg for override in TINY_STUDY for arg in ("--set", override)]
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "pipelines" / "study.py"),
            "--study",
            "batch",
            "--quick",
            "--values",
            "2",
            "4",
            *overrides,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]

    (report,) = (tmp_path / "reports" / "study").glob("*-batch.md")  # a new dated report
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-batch\.md", report.name)
    rows = [
        line.split("|")[1:-1]
        for line in report.read_text().splitlines()
        if line.startswith("| ") and not line.startswith("| batch")
    ]
    assert [row[0].strip() for row in rows] == ["2", "4"]
    assert all(float(row[3]) > 0 for row in rows)  # best smoothed PSNR in dB
    assert report.with_suffix(".png").stat().st_size > 10_000

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("thermal2visible").experiment_id])
    parents = [run for run in runs if run.info.run_name == "study-batch"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = [run for run in runs if run.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert sorted(run.data.params["train.batch_size"] for run in children) == ["2", "4"]
    assert all(run.data.params["preprocess.image_size"] == "16" for run in children)


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
        "model.ngf=4",
        "model.ndf=4",
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
    assert all(float(rows[name][3]) > 0 for name in list(rows)[1:])  # mean test PSNR in dB
    for picture in (".png", "_grid.png"):
        assert report.with_name(report.stem + picture).stat().st_size > 10_000

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("thermal2visible").experiment_id])
    (parent,) = [run for run in runs if run.info.run_name == "study-quality"]
    children = {
        run.data.tags["mlflow.runName"]: run.data.params
        for run in runs
        if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    }
    assert len(children) == 5 and all(
        params["train.max_minutes"] == "0.05" and params["train.seed"] == "3" for params in children.values()
    )
    assert children["quality: ResNet generator seed 3"]["model.generator"] == "resnet"
    assert children["quality: multi-scale D seed 3"]["model.discriminator_scales"] == "2"
    assert children["quality: feature matching seed 3"]["train.lambda_feat"] == "10.0"
    assert children["quality: default seed 3"]["model.generator"] == "unet"


def test_a_study_writes_new_dated_files_and_replaces_files_only_under_out(tmp_path, monkeypatch):
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
