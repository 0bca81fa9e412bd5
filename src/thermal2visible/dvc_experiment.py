"""A DVC experiment of params.yaml with a preset or settings over it, refused before any stage runs when it could not
run on this machine; also what `mlflow run . -e STAGE -P set="section.key=value ..."` runs.

    python -m thermal2visible.dvc_experiment [STAGE|all] ["section.key=value ..."] [--preset FILE]
                                             [--set section.key=value] [--queue] [--name NAME]

`dvc exp run [STAGE] -S section.key=value ...` writes the settings into params.yaml, runs what changed and records
it in dvc.lock and a DVC experiment, so params.yaml, dvc.lock and the MLflow runs always describe the same model.
Nothing is passed that the user did not give: with no settings the stage runs with params.yaml as it is. Settings
that fail validation, or ask for a device this machine lacks (a GPU preset on a CPU), stop here, with params.yaml,
the outputs and the MLflow store as they were.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from thermal2visible.cli import add_overrides
from thermal2visible.cli import this_python_first
from thermal2visible.config.load import load_params, preset_overrides
from thermal2visible.errors import ConfigError
from thermal2visible.models.networks import check_networks
from thermal2visible.training.precision import resolve_accelerator

MLPROJECT_USAGE = 'the only MLproject parameter is set, e.g. -P set="train.batch_size=16 train.max_epochs=50"'


def dvc_command(stage: str, settings: list[str], queue: bool = False, name: str | None = None) -> list[str]:
    command = ["dvc", "exp", "run", *([] if stage == "all" else [stage])]
    command += (["--queue"] if queue else []) + (["--name", name] if name else [])
    return command + [arg for setting in settings for arg in ("-S", setting)]


def refuse_unrunnable(settings: list[str]) -> None:
    """ConfigError when params.yaml with `settings` is invalid, names a generator that is not there or does not take
    the image size, or needs devices this machine does not have."""
    params = load_params(overrides=settings)
    check_networks(params.model, params.preprocess.image_size)
    train = params.train
    if resolve_accelerator(train.accelerator) == "gpu" and train.devices > torch.cuda.device_count():
        raise ConfigError(
            f"train.devices: {train.devices} GPUs per node, but this machine has {torch.cuda.device_count()}"
        )


def main(argv: list[str]) -> None:
    summary = __doc__.split("\n\n")[0].replace("\n", " ")  # the docstring's first sentence, whole
    parser = argparse.ArgumentParser(prog="python -m thermal2visible.dvc_experiment", description=summary)
    parser.add_argument(
        "stage", nargs="?", default="all", help="a stage of dvc.yaml, data/dvc.yaml:synthesize, or all (default)"
    )
    parser.add_argument("settings", nargs="?", default="", help='"section.key=value ..." (MLproject\'s `set`)')
    parser.add_argument("--preset", action="append", default=[], metavar="FILE", help="a preset from params/")
    add_overrides(parser, "one setting (repeatable), as `dvc exp run -S`")
    parser.add_argument("--queue", action="store_true", help="queue the experiment (`dvc queue start -j N` runs it)")
    parser.add_argument("--name", help="the experiment's name (dvc exp run --name)")
    args, unknown = parser.parse_known_args(argv[1:])
    if unknown:  # `mlflow run -P name=value` with a name MLproject does not declare arrives as `--name value`
        sys.exit(f"error: {MLPROJECT_USAGE}")
    try:
        presets = [setting for preset in args.preset for setting in preset_overrides(preset)]
        settings = [*presets, *args.settings.split(), *args.overrides]
        refuse_unrunnable(settings)
    except ConfigError as error:
        sys.exit(f"error: {error}\nnothing was run or changed")
    os.environ["PATH"] = this_python_first(os.environ)["PATH"]
    command = dvc_command(args.stage, settings, args.queue, args.name)
    print("+", " ".join(command), flush=True)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv)
