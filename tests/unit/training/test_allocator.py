"""train.keep_freed_memory: a training process reuses the memory it frees instead of faulting it in again."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

# Builds the Trainer as training does, then makes a step's worth of tensors (3 x 48 MiB alive together: a 256 px
# step's largest activations and gradients are of this size) four times and counts the page faults of the fourth.
PROBE = """
import resource, sys, torch
from tests.support.shipped import shipped
from thermal2visible.training.trainer import build_trainer
build_trainer(shipped("train", accelerator="cpu", keep_freed_memory=sys.argv[1] == "true"))
def step():
    return [torch.ones(12 * 2**20) for _ in range(3)]
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults_of_a_fourth_step(keep_freed_memory: bool) -> int:
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(keep_freed_memory).lower()], capture_output=True, text=True, env=env
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    return int(probe.stdout.split()[-1])


@pytest.mark.slow  # a measured subprocess
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the option tunes glibc's malloc")
def test_kept_memory_is_reused_without_page_faults():
    kept, default = page_faults_of_a_fourth_step(True), page_faults_of_a_fourth_step(False)
    # glibc's defaults unmap each freed block above 32 MiB and fault it in again: 36864 pages at 4 KiB
    assert default > 10 * kept, (default, kept)
