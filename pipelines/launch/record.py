"""Make DVC's record say that models/generator.pt, trained outside `dvc repro`, is the train stage's output.

    python pipelines/launch/record.py [--preset FILE] [--set section.key=value ...]   # what the training was given

torchrun.sh and train.sbatch run it on the first node once training has ended; after `pipelines/train.py` run alone,
run it by hand with the same --preset/--set. It checks that the generator was trained with params.yaml plus those
settings on data/cache as it is now (the run fingerprint), writes the settings into params.yaml as `dvc exp run -S`
would (comments kept), and runs `dvc commit --force train`. `dvc repro` then evaluates, exports and registers this
model: without the record, DVC would see a changed output and restore a cached generator or train again.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

from ruamel.yaml import YAML

from thermal2visible.cli import run_stage
from thermal2visible.config.load import load_params
from thermal2visible.config.schema import Params
from thermal2visible.errors import PipelineError
from thermal2visible.models.payloads import load_generator
from thermal2visible.paths import CACHE, GENERATOR, PARAMS, RECOGNIZER
from thermal2visible.tracking.digests import data_hash, file_digest
from thermal2visible.training.fingerprint import run_fingerprint


def fingerprint(params: Params) -> str:
    """The fingerprint a training of `params` on data/cache stamps its generator with (pipelines/train.py)."""
    recognizer = file_digest(RECOGNIZER) if params.train.lambda_id else None
    return run_fingerprint(params, data_hash(CACHE), recognizer)


def write_into_params(overrides: list[str]) -> None:
    """Each `section.key=value` into params.yaml, its comments and layout kept."""
    yaml = YAML()
    document = yaml.load(PARAMS)
    for override in overrides:
        dotted, _, value = override.partition("=")
        section, _, key = dotted.partition(".")
        document[section][key] = yaml.load(value)
    yaml.dump(document, PARAMS)


def main(params: Params, args: argparse.Namespace) -> None:
    if not GENERATOR.is_file():
        raise PipelineError(f"{GENERATOR}: no trained generator to record (the training did not finish)")
    trained = load_generator(GENERATOR)[1].get("fingerprint")
    expected = fingerprint(params)
    if trained != expected:
        raise PipelineError(
            f"{GENERATOR}: trained with other settings or data (fingerprint {trained}) than {PARAMS} with the "
            f"given --preset/--set on {CACHE} (fingerprint {expected}); give the settings the training was given"
        )
    write_into_params(args.settings)
    if load_params() != params:
        raise PipelineError(f"{PARAMS}: reads differently after the settings were written into it")
    dvc = shutil.which("dvc") or sys.exit("error: no `dvc` on PATH: activate the project's venv")
    subprocess.run([dvc, "commit", "--force", "--quiet", "train"], check=True)
    print(f"record: {GENERATOR} is the train stage's output in dvc.lock; `dvc repro` evaluates, exports, registers it")


if __name__ == "__main__":
    run_stage(main, description=__doc__.splitlines()[0], arguments=lambda parser: None)
