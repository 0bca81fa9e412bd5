"""A short bounded run of benchmarks/load.py: concurrent clients against a real `mlflow models serve`, zero errors."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def test_concurrent_clients_get_every_answer(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "load.py"), "--clients", "4", "--requests", "20",
                           "--size", "32", "--ngf", "8"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads((tmp_path / "reports" / "load.json").read_text())
    assert figures["requests"] == 80 and figures["errors"] == 0 and len(figures["latencies_ms"]) == 80
    assert (tmp_path / "reports" / "load.png").stat().st_size > 0
