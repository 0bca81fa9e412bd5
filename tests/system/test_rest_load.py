"""A short bounded run of benchmarks/rest_load.py: concurrent clients against a real `mlflow models serve`, no
errors."""

import json

import pytest
from tests.support.figures import assert_drawn

pytestmark = pytest.mark.slow


def test_concurrent_clients_get_every_answer(tmp_path, run_benchmark):
    done = run_benchmark(
        "rest_load",
        tmp_path,
        # the README's 8 clients: as many as serve.max_bodies_in_flight, each sending its next request on its answer
        *("--clients", "8", "--requests", "10", "--workers", "1", "--rounds", "1", "--size", "32", "--ngf", "8"),
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (result,) = (tmp_path / "benchmarks" / "results").glob("*-load.json")  # a new dated result
    report = json.loads(result.read_text())
    figures = report["configs"]["1 worker"]  # its one timed round, after the warm-up round
    assert figures["requests"] == 80 and figures["errors"] == 0 and len(figures["latencies_ms"]) == 80, figures
    assert report["errors"] == 0 and report["summary"]["rounds"] == 1
    assert_drawn(result.with_suffix(".png"))
