"""The prepared GPU scripts (benchmarks/gpu_check.py, benchmarks/gpu_speed.py) run their --dry-run on the CPU, so
they cannot rot between the rare GPU leases: every item is present, the ones that run on a CPU pass, and the speed
figures are positive and finite."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check, gpu_speed

REPO = Path(__file__).resolve().parents[2]
NEEDS_CUDA = {"resume gpu->gpu", "resume gpu->cpu", "resume cpu->gpu", "SyncBatchNorm, test_mode train"}


def dry_run(module: str, out: Path, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", module, "--dry-run", "--out", str(out), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    (report,) = out.glob("*.json")
    return json.loads(report.read_text()) | {
        "returncode": done.returncode,
        "log": done.stdout[-3000:] + done.stderr[-3000:],
    }


def check_items(report: dict, names: list[str]) -> None:
    items = {item["item"]: item for item in report["items"]}
    assert list(items) == ["environment", *(n for n in gpu_check.ITEMS if n in names)], report["log"]
    for name, item in items.items():
        if name in NEEDS_CUDA:
            assert item["status"] == "skip" and "needs CUDA" in item["reason"], item
        else:
            assert item["status"] == "pass", item
        assert item["seconds"] >= 0
    assert report["dry_run"] is True


@pytest.mark.slow  # the check in its own process
def test_the_whole_gpu_check_dry_runs_on_the_cpu(tmp_path):
    """Every item: the trainings, the forced overflow, the resumes, DDP over gloo, export + onnxruntime parity and the
    REST server with the client example."""
    report = dry_run("benchmarks.gpu_check", tmp_path)
    check_items(report, [name for name in gpu_check.ITEMS if name != "environment"])
    passed = len(gpu_check.ITEMS) - len(NEEDS_CUDA)
    assert (tmp_path / f"{Path(next(tmp_path.glob('*.json'))).stem}.md").read_text().count("| pass |") == passed
    overflow = next(i for i in report["items"] if i["item"].startswith("16-mixed overflow"))
    poisoned = overflow["steps"][gpu_check.Overflowing.poisoned]
    assert poisoned["scale_after"] == poisoned["scale_before"] / 2 and poisoned["weights_unchanged"]


@pytest.mark.slow  # ~1-2 min on 2 shared cores: a Lightning fit per configuration
def test_the_gpu_speed_dry_run_gives_finite_figures(tmp_path):
    report = dry_run("benchmarks.gpu_speed", tmp_path)
    assert report["returncode"] == 0, report["log"]
    (result,) = report["steps"]
    configs = result["summary"]["configs"]
    assert set(configs) == {gpu_speed.PLAIN, *(n for n, step in gpu_speed.STEPS.items() if not step.compiled)}
    for figures in configs.values():
        for key in ("images_per_s", "tflops_per_s", "median_s"):
            assert math.isfinite(figures[key]) and figures[key] > 0, figures
    assert report["peaks_note"] and all(f["share_of_dense_peak"] is None for f in configs.values())
    assert all(s["curve"] for s in report["time_to_quality"]["setups"].values())
    for engines in report["inference"]["figures"].values():
        assert all(e["ms_per_image"] > 0 for e in engines.values())
    assert (tmp_path / f"{next(tmp_path.glob('*.json')).stem}.png").stat().st_size > 0


def test_the_dense_peaks_are_found_by_device_name():
    assert gpu_speed.peaks_of("NVIDIA H100 PCIe")["bf16"] < gpu_speed.peaks_of("NVIDIA H100 80GB HBM3")["bf16"]
    assert gpu_speed.peaks_of("NVIDIA H200")["fp16"] > gpu_speed.peaks_of("NVIDIA A100-SXM4-80GB")["fp16"]
    assert gpu_speed.peaks_of("some other card") is None
