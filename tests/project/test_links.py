"""Every relative link in the tracked Markdown (README, docs, benchmarks' results) leads to a file or folder that
exists, so moving a file cannot leave a reader at a dead end."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target), images included


def test_every_relative_markdown_link_resolves():
    tracked = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    dead = []
    for name in tracked.stdout.split():
        page = ROOT / name
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            path = target.split("#")[0]
            if not (page.parent / path).exists():
                dead.append(f"{name}: {target}")
    assert dead == []
