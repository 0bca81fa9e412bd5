"""The one entry shape of every pipeline stage: `--params`, repeated `--preset params/NAME.yaml` and
`--set section.key=value`, clean errors."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Callable, Mapping

from thermal2visible import paths
from thermal2visible.paths import PARAMS
from thermal2visible.config.load import load_params, preset_overrides
from thermal2visible.config.schema import Params
from thermal2visible.errors import ConfigError, PipelineError

TEAM_USERS = "pipelines/launch/team_users.py"  # the admin's script that grants a team server's users (docs/team.md)


def this_python_first(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with this interpreter's folder first on PATH: the stages DVC runs call `python` by name (and `mlflow models
    serve`, `uvicorn`), and it must be this environment's even where the venv is not active."""
    return {**env, "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")}


def quiet_lightning() -> None:
    """Keep a stage's output to what it says: Lightning's advertising tips and a deprecation inside Lightning
    itself (its own pytree helper, on every fit) tell a user nothing they can act on."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: not record.getMessage().startswith("💡 Tip:")
    )
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")


def server_refusal(error: Exception, params: Params, grant: str) -> str | None:
    """One line for a team server's 403: who was refused what, and the team_users.py command that grants `grant`
    (READ or MANAGE) on the experiment and registered model these params use; None for any other error. MLflow is
    looked up, not imported: a stage that never imported it raised no MLflow error, and importing it costs seconds."""
    exceptions = sys.modules.get("mlflow.exceptions")
    if not (exceptions and isinstance(error, exceptions.MlflowException) and error.get_http_status_code() == 403):
        return None
    user = os.environ.get("MLFLOW_TRACKING_USERNAME", "USER")
    endpoint = re.search(r"endpoint (\S+)", error.message)
    refused = f" {endpoint[1]}" if endpoint else ""
    # the settings team_users.py names the experiment and registered model by (registry.gate's rule)
    settings = [f"data.source={params.data.source}"]
    settings += [f"synthesize.scene={params.synthesize.scene}"] if Path(params.data.source) == paths.RAW else []
    pinned = params.register.model_name != "auto"  # auto: named after the data (registry.gate)
    settings += [f"register.model_name={params.register.model_name}"] if pinned else []
    command = " ".join([f"python {TEAM_USERS} --{grant.lower()} {user}"] + [f"--set {setting}" for setting in settings])
    return (
        f"the MLflow server {sys.modules['mlflow'].get_tracking_uri()} refused {user}{refused} (403): ask its admin "
        f"for {grant} on experiment {params.mlflow.experiment} and this data's registered model: {command} "
        "(docs/team.md)"
    )


def add_overrides(parser: argparse.ArgumentParser, meaning: str) -> None:
    """`--set SECTION.KEY=VALUE` (repeatable) into `args.overrides`."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE", help=meaning
    )


def run_stage(
    main: Callable[..., object],
    description: str | None = None,
    arguments: Callable[[argparse.ArgumentParser], object] | None = None,
    own_sections: dict[str, type] | None = None,
    grant: str = "MANAGE",
) -> None:
    """Parse `--params`, `--preset`, `--set` (and what `arguments` adds to the parser), load the params and call
    `main(params)`; with `arguments`, `main(params, args)`, where `args.settings` lists the presets' and --set's
    `section.key=value` in the order applied. `own_sections`: params.yaml sections only this stage reads, each with
    its schema (a dataclass as in config/schema.py), checked with the rest and read as `params.<section>`. A
    ConfigError or PipelineError ends the process with its message, and so does a team server's refusal, naming
    `grant` (what the stage needs of the server: MANAGE to log and register, READ to load) as the fix."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--params", default=PARAMS, help=f"params file (default: {PARAMS})")
    parser.add_argument(
        "--preset",
        dest="presets",
        action="append",
        default=[],
        metavar="FILE",
        help="apply a preset from params/ (repeatable), before any --set",
    )
    add_overrides(parser, "override one parameter (repeatable), as `dvc exp run -S` does")
    if arguments:
        arguments(parser)
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    # MLflow draws a progress bar for every artifact download, a 22-line block for a model it reads back
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    quiet_lightning()
    try:
        args.settings = [*(setting for preset in args.presets for setting in preset_overrides(preset)), *args.overrides]
        params = load_params(args.params, args.settings, own_sections)
        try:
            main(params, args) if arguments else main(params)
        except Exception as error:
            refusal = server_refusal(error, params, grant)
            if refusal is None:
                raise
            raise PipelineError(refusal) from None
    except (ConfigError, PipelineError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
