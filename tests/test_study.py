"""pipelines/study.py end to end on tiny data: real child training runs, one MLflow parent, a markdown table."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
TINY_STUDY = ("preprocess.image_size=16", "model.ngf=4", "model.ndf=4", "train.max_epochs=2", "early_stop.window=1",
              "early_stop.patience=1")


@pytest.mark.timeout(180)
def test_quick_batch_study_logs_children_under_one_parent_and_writes_the_table(tmp_path, write_params,
                                                                              run_stage_script):
    write_params(tmp_path)
    for folder in ("pipelines", "params"):  # the study runs from a project folder
        (tmp_path / folder).symlink_to(REPO / folder)
    for stage in ("synthesize.py", "ingest.py"):
        assert run_stage_script(stage, tmp_path).returncode == 0
    env = {key: value for key, value in os.environ.items() if key != "MLFLOW_TRACKING_URI"}
    overrides = [arg for override in TINY_STUDY for arg in ("--set", override)]
    result = subprocess.run([sys.executable, str(REPO / "pipelines" / "study.py"), "--study", "batch", "--quick",
                             "--values", "2", "4", *overrides], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=170)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]

    rows = [line.split("|")[1:-1] for line in (tmp_path / "reports" / "study" / "batch.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| batch")]
    assert [row[0].strip() for row in rows] == ["2", "4"]
    assert all(float(row[3]) > 0 for row in rows)  # best smoothed PSNR in dB
    assert (tmp_path / "reports" / "study" / "batch.png").stat().st_size > 10_000

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("thermal2visible").experiment_id])
    parents = [run for run in runs if run.info.run_name == "study-batch"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = [run for run in runs if run.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert sorted(run.data.params["train.batch_size"] for run in children) == ["2", "4"]
    assert all(run.data.params["preprocess.image_size"] == "16" for run in children)
