"""docs/studies.md's sweep on a cluster, as pasted: a SLURM job array (pipelines/launch/sweep.sbatch) whose tasks
each run one experiment in a clone of their own and push it, with the nodes' remotes and scheduler stood in for
on this machine (tests/system/test_guides.py's stand-ins: a bare git remote, a folder DVC remote, the team server with
logins, an `sbatch` that runs the array's tasks here). The admin first makes the `ci` user as docs/team.md does."""

import json
import re
import subprocess
from contextlib import ExitStack

import pytest
from mlflow import MlflowClient

from test_guides import REPO, Block, blocks, start_session

pytestmark = pytest.mark.slow  # trainings in clones, a tracking server


def block(guide: str, holding: str) -> Block:
    """The one bash block of `guide` whose marker or text holds `holding`."""
    [found] = [block for block in blocks(REPO / guide) if holding in block.marker or holding in block.text]
    return found


@pytest.mark.timeout(1800)
def test_a_sweep_as_a_job_array_ends_in_every_clone_s_dvc_exp_show_and_the_team_store(
    guides_project, docker_tags, tmp_path, monkeypatch
):
    sweep = block("docs/studies.md", "tests/system/test_cluster_sweep.py")
    with ExitStack() as servers:
        session = start_session(guides_project, tmp_path / "project", servers, docker_tags)
        session.run(block("docs/team.md", "team_users.py --manage ci"), tmp_path / "users")  # the admin makes `ci`
        session.run(sweep, tmp_path / "sweep")
        names = re.findall(r"^(\S+) ", (session.project / "sweep.txt").read_text(), re.M)
        assert len(names) == 2

        # both experiments, pulled back into the submitting clone, with their scores
        shown = json.loads(session.bash("dvc exp show --json"))
        experiments = {
            exp["name"]: exp for commit in shown for branch in commit.get("experiments") or [] for exp in branch["revs"]
        }
        assert set(names) <= experiments.keys(), experiments.keys()
        for name in names:
            metrics = experiments[name]["data"]["metrics"]["metrics/train.json"]["data"]
            assert metrics["best_psnr_smoothed"] > 0

        # their runs on the team server, each tagged with its experiment, and no champion taken by the sweep
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", session.passwords["admin"])
        client = MlflowClient(session.team_server)
        runs = client.search_runs(
            [client.get_experiment_by_name("thermal2visible").experiment_id],
            filter_string="tags.dvc_experiment != 'none'",
        )
        assert {run.data.tags["dvc_experiment"] for run in runs} >= set(names)
        versions = client.search_model_versions()
        assert versions and all("champion" not in version.aliases for version in versions)
        # the workspace is as it was: the tasks ran in clones of their own
        assert subprocess.run(["git", "diff", "--quiet", "params.yaml"], cwd=session.project).returncode == 0
