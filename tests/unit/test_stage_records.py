"""A stage's record: numbers to its metrics file, everything else to its report, read back as the record it was."""

import json

import pytest

from thermal2visible.errors import PipelineError
from thermal2visible.stage_records import read_record, write_record


def test_numbers_go_to_metrics_the_rest_to_the_report_and_both_read_back_as_one(tmp_path):
    record = {
        "test_images": 29,
        "generator": {"psnr": 21.6, "ssim": 0.7},
        "identity": {"score": "rank1_accuracy", "why": "29 of 29 ...", "faces": 29, "thermal_input": None},
        "parity_passed": True,
        "generator_sha256": "ab" * 32,
        "notes": {"source": "data/raw"},
    }
    metrics, report = tmp_path / "metrics" / "eval.json", tmp_path / "reports" / "evaluated.json"
    write_record(record, metrics, report)
    assert json.loads(metrics.read_text()) == {
        "test_images": 29,
        "generator": {"psnr": 21.6, "ssim": 0.7},
        "identity": {"faces": 29},
    }
    assert json.loads(report.read_text()) == {
        "identity": {"score": "rank1_accuracy", "why": "29 of 29 ...", "thermal_input": None},
        "parity_passed": True,
        "generator_sha256": "ab" * 32,
        "notes": {"source": "data/raw"},
    }
    assert read_record(metrics, report) == record


def test_a_record_without_a_report_is_numbers_only_or_refused(tmp_path):
    write_record({"best_epoch": 3, "best_psnr": 20.5}, tmp_path / "train.json")
    assert read_record(tmp_path / "train.json") == {"best_epoch": 3, "best_psnr": 20.5}
    with pytest.raises(ValueError, match="numbers only, not \\['fingerprint'\\]"):
        write_record({"best_epoch": 3, "fingerprint": "0123456789abcdef"}, tmp_path / "other.json")
    assert not (tmp_path / "other.json").exists()


def test_a_missing_or_broken_record_names_its_file(tmp_path):
    with pytest.raises(PipelineError, match="eval.json: missing"):
        read_record(tmp_path / "eval.json")
    (tmp_path / "eval.json").write_text("{")
    with pytest.raises(PipelineError, match="eval.json: not valid JSON"):
        read_record(tmp_path / "eval.json")
