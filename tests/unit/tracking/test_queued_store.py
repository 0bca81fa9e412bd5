"""A stage of a queued DVC experiment runs in DVC's temporary copy of the project: its runs, and their artifacts,
must land in the project's own MLflow store, which outlives the copy."""

from thermal2visible.tracking.store import ensure_experiment, open_store, tracking_uri


def test_a_stage_in_a_temporary_copy_logs_runs_and_artifacts_to_the_projects_store(tmp_path, monkeypatch):
    project, copy = tmp_path / "project", tmp_path / "copy"
    project.mkdir()
    copy.mkdir()
    monkeypatch.chdir(copy)
    monkeypatch.setenv("DVC_ROOT", str(project))  # what `dvc exp run --queue` exports to its stages
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri() == f"sqlite:///{project}/mlflow.db"

    client = open_store(tracking_uri())
    ensure_experiment(client, "thermal2visible")
    run = client.create_run(client.get_experiment_by_name("thermal2visible").experiment_id)
    client.log_text(run.info.run_id, "logged from the copy", "note.txt")
    client.set_terminated(run.info.run_id)

    logged = project / "mlruns" / "thermal2visible" / run.info.run_id / "artifacts" / "note.txt"
    assert logged.read_text() == "logged from the copy"
    assert list(copy.iterdir()) == []
