"""The bad-input corpus (tests/support/corpus.py) against the real ingest stage and a real `mlflow models serve`.

Every case must be refused with a clear message naming it, no traceback, no 5xx (except MLflow's own gaps,
listed with their reason), the server alive after each, nothing written to the registry or the cache.
Each test prints a table of what happened to every case (`pytest -s` shows it).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from tests.support.corpus import bad_requests, write_bad_files, write_bad_videos
from mlflow import MlflowClient
from thermal2visible.paths import MANIFEST
from tests.support.servers import mlflow_server, model_server
from tests.support.shipped import SHIPPED, shipped
from tests.support.tiny_model import export_tiny, register_tiny

from thermal2visible.inference.request_budget import ServedLimits, max_encoded_length

pytestmark = pytest.mark.slow
MAX_PIXELS = 100_000  # served model
INGEST_MAX_PIXELS = 1_000_000


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    return "\n".join("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) for row in (header, *rows))


def test_ingest_names_every_bad_file_and_keeps_them_out_of_the_cache(tmp_path, write_params, run_stage_script):
    project = tmp_path / "project"
    project.mkdir()
    # preprocess.align off: the corpus's valid odd pair is noise, with no outlines to register
    write_params(
        project,
        f"ingest.max_pixels={INGEST_MAX_PIXELS}",
        "synthesize.identities=2",
        "synthesize.images_per_identity=3",
        "preprocess.align=false",
    )
    assert run_stage_script("synthesize.py", project).returncode == 0
    bad = write_bad_files(project / "data" / "raw", tmp_path / "outside", INGEST_MAX_PIXELS)
    good_pairs = 2 * 3 + 1  # synthesized, and the corpus's valid odd-sized 16-bit pair

    failed = run_stage_script("ingest.py", project)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert f"error: data/raw: {len(bad)} bad file(s)" in failed.stderr, failed.stderr
    assert not (project / "data" / "ingested" / "index.json").exists()
    reported = {
        entry["file"]: entry["reason"] for entry in json.loads((project / "reports" / "ingest_errors.json").read_text())
    }
    rows = []
    for case in bad:
        reason = reported.get(f"data/raw/{case.path}", "")
        rows.append((case.case, case.path, "named" if case.reason in reason else "MISSED", reason[:70]))
    print("\n" + table(rows, ("case", "file", "outcome", "reason")))
    assert all(row[2] == "named" for row in rows) and len(reported) == len(bad), reported

    skipped = run_stage_script("ingest.py", project, "--set", "ingest.on_error=skip")
    assert skipped.returncode == 0, skipped.stderr
    assert f"ingest: {good_pairs} pairs from data/raw, {len(bad)} bad file(s) skipped" in skipped.stdout
    assert run_stage_script("preprocess.py", project).returncode == 0
    manifest = json.loads((project / "data" / "cache" / MANIFEST).read_text())
    assert sum(manifest["counts"].values()) == good_pairs
    assert not [source for source in manifest["sources"] if "/bad/" in source["thermal"] + source["visible"]]
    print(f"ingest: {len(bad)} bad files named, {good_pairs} good pairs cached, 0 tracebacks")


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_cache):
    """(model server URL, tracking client): the tiny model registered on a real `mlflow server` and served."""
    with mlflow_server(tmp_path_factory.mktemp("tracking")) as tracking_uri:
        model = export_tiny(tmp_path_factory.mktemp("model"), tiny_cache)
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
            register_tiny(
                model,
                name="corpus",
                test_psnr=20.0,
                parity_passed=True,
                metrics={},
                lineage={},
                limits=ServedLimits.of(shipped("serve", max_pixels=MAX_PIXELS)),
                training_manifest=None,
            )
        with model_server("models:/corpus@champion", tmp_path_factory.mktemp("serve"), tracking_uri) as url:
            yield url, MlflowClient(tracking_uri)


def registry_state(client: MlflowClient) -> tuple:
    versions = client.search_model_versions("name='corpus'")
    runs = client.search_runs([client.get_experiment_by_name(SHIPPED.mlflow.experiment).experiment_id])
    return sorted(int(v.version) for v in versions), client.get_registered_model("corpus").aliases, len(runs)


def test_every_broken_request_is_refused_clearly_and_the_server_lives_on(served):
    url, client = served
    before = registry_state(client)
    rows, failures = [], []
    for case in bad_requests(MAX_PIXELS, max_encoded_length(MAX_PIXELS)):
        if isinstance(case.body, dict):
            response = requests.post(f"{url}/invocations", json=case.body, timeout=120)
        else:
            response = requests.post(
                f"{url}/invocations", data=case.body, timeout=120, headers={"Content-Type": case.content_type}
            )
        try:
            message = response.json().get("message", "")
        except ValueError:  # MLflow answers some refusals (415, its own 500) in plain text
            message = response.text
        alive = requests.get(f"{url}/ping", timeout=10).status_code == 200
        problems = [
            what
            for what, bad in (
                (f"status {response.status_code}", response.status_code != case.status),
                ("message", case.phrase not in message),
                ("traceback", "Traceback" in response.text or "stack_trace" in response.text),
                (f"echo {len(response.content)} B", len(response.content) > 2048),
                ("server died", not alive),
            )
            if bad
        ]
        failures += [f"{case.case}: {', '.join(problems)}: {message[:300]}"] if problems else []
        rows.append(
            (
                case.case,
                response.status_code,
                len(response.content),
                "ok" if not problems else "FAIL",
                message[:60].replace("\n", " "),
            )
        )
    print("\n" + table(rows, ("case", "status", "bytes", "outcome", "message / known MLflow gap")))
    statuses = [row[1] for row in rows]
    print(
        f"{len(rows)} requests: {statuses.count(200)} 200, {sum(400 <= s < 500 for s in statuses)} 4xx, "
        f"{sum(s >= 500 for s in statuses)} 5xx (all MLflow gaps listed above)"
    )
    assert not failures, "\n".join(failures)
    assert registry_state(client) == before  # serving writes nothing to the registry


def test_every_broken_video_is_refused_naming_it_and_nothing_is_written(tmp_path, tiny_cache):
    """`pipelines/translate.py --input VIDEO`: a clear error naming the file (and frame), exit 1, no output."""
    model = export_tiny(tmp_path / "model", tiny_cache)
    rows, failures = [], []
    for case in write_bad_videos(tmp_path / "videos"):
        out = tmp_path / "out" / case.case.replace(" ", "_") / case.output
        done = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).parents[2] / "pipelines" / "translate.py"),
                "--model",
                str(model),
                "--input",
                str(tmp_path / "videos" / case.path),
                "--output",
                str(out),
                "--max-pixels",
                str(MAX_PIXELS),
            ],
            capture_output=True,
            text=True,
        )
        written = [p.name for p in out.parent.iterdir()] if out.parent.exists() else []
        problems = [
            what
            for what, bad in (
                (f"exit {done.returncode}", done.returncode != 1),
                ("message", not re.search(case.pattern, done.stderr)),
                ("traceback", "Traceback" in done.stderr),
                (f"wrote {written}", bool(written)),
            )
            if bad
        ]
        failures += [f"{case.case}: {', '.join(problems)}: {done.stderr[-300:]}"] if problems else []
        rows.append((case.case, "ok" if not problems else "FAIL", done.stderr.strip().splitlines()[-1][:90]))
    print("\n" + table(rows, ("case", "outcome", "message")))
    assert not failures, "\n".join(failures)
