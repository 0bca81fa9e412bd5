"""benchmarks.shared_machine: each configuration set against the training alone in its own round, and a smoke run of
every configuration with real processes (slow: seven trainings and a server). Speed itself is never asserted."""

import json

import pytest

from benchmarks import shared_machine
from tests.support.figures import assert_drawn


def test_each_configuration_is_set_against_the_training_alone_in_its_own_round(tmp_path):
    seconds = {  # round -> configuration -> seconds (REST alone: its p99)
        0: {"alone": 10, "beside 1 busy process": 20, "beside 2 busy processes": 40, "beside the REST load": 15,
            "two projects at once": 18, "REST load alone": 0.1},
        1: {"alone": 20, "beside 1 busy process": 30, "beside 2 busy processes": 50, "beside the REST load": 40,
            "two projects at once": 44, "REST load alone": 0.2},
    }  # fmt: skip
    records = [
        {"round": r, "config": config, "seconds": value, "flagged": r == 1}
        for r, row in seconds.items()
        for config, value in row.items()
    ]
    figures = shared_machine.figures_of(records, [0.25, 0.3], images=100)
    busy = figures["trainings"]["beside 1 busy process"]
    assert busy["time_over_alone"] == {"median": 1.75, "min": 1.5, "max": 2.0, "rounds": 2}
    assert busy["images_per_s"] == 4.17 and busy["goal"] == 2.2
    # both trainings' images: the median of 200 over 18 s and over 44 s
    assert figures["trainings"]["two projects at once"]["images_per_s"] == 7.83
    assert figures["rest_p99_ms"]["beside_over_alone"]["median"] == 2.0  # 0.25 / 0.1 and 0.3 / 0.2
    assert figures["flagged_rounds"] == 1
    shared_machine.plot(figures, tmp_path / "figure.png")
    assert_drawn(tmp_path / "figure.png")


@pytest.mark.slow
def test_a_smoke_run_measures_every_configuration(tmp_path, run_benchmark):
    done = run_benchmark("shared_machine", tmp_path, "--smoke", "--threads", "auto", "--out", str(tmp_path / "smoke"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads((tmp_path / "smoke.json").read_text())
    assert figures["threads"] == "auto"  # the trainings' setting, as asked
    assert len(figures["trainings"]) == 5 and all(f["images_per_s"] > 0 for f in figures["trainings"].values())
    assert figures["rest_p99_ms"]["alone"] > 0 and figures["rest_p99_ms"]["beside_training"] > 0
    assert_drawn(tmp_path / "smoke.png")
