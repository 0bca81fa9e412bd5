"""`mlflow run . -e STAGE -P set="section.key=value ..."`: a stage, and the stages it needs, run through DVC.

`dvc exp run [STAGE] -S section.key=value ...` writes the settings into params.yaml, runs what changed and records
it in dvc.lock and a DVC experiment, so params.yaml, dvc.lock and the MLflow runs always describe the same model.
Nothing is passed that the user did not give: with no settings the stage runs with params.yaml as it is.
Usage: python -m thermal2visible.experiment STAGE|all ["section.key=value ..."]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def dvc_command(stage: str, settings: str) -> list[str]:
    command = ["dvc", "exp", "run", *([] if stage == "all" else [stage])]
    return command + [arg for setting in settings.split() for arg in ("-S", setting)]


def main(argv: list[str]) -> None:
    if len(argv) not in (2, 3):
        # `mlflow run -P name=value` with a name MLproject does not declare arrives here as `--name value`
        sys.exit(
            'error: the only MLproject parameter is set, e.g. -P set="train.batch_size=16 train.max_epochs=50"\n'
            + __doc__.rstrip().rpartition("\n")[2]
        )
    # The stages run `python` from PATH: make it this interpreter's environment even where the venv is not active.
    bin_dir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    command = dvc_command(argv[1], argv[2] if len(argv) == 3 else "")
    print("+", " ".join(command), flush=True)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv)
