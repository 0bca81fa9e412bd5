"""A copy of this project as a user's clone holds it, for the tests and benchmarks that run its pipeline in a scratch
folder: the pipeline files, what they need beside them, the code and the presets; no outputs and no record."""

import shutil
from pathlib import Path

from tests.support.servers import PROJECT
from thermal2visible.paths import PIPELINE_FILES

# beside the pipeline files: the entry points (make's too), the environment, what git and DVC leave out, the
# package's metadata
FILES = (
    "MLproject", "Makefile", "conda.yaml", ".gitignore", ".dvcignore", "data/.gitignore", "pyproject.toml", "torch.txt",
    "README.md",
)  # fmt: skip
FOLDERS = ("pipelines", "src", "params", "docker", "tools")


def copy_project(folder: Path, *folders: str) -> Path:
    """The project's pipeline and code copied into `folder` (made if missing), with `folders` of it too."""
    for name in (*map(str, PIPELINE_FILES), *FILES):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(PROJECT / name, folder / name)
    for name in (*FOLDERS, *folders):
        shutil.copytree(PROJECT / name, folder / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return folder
