"""The one entry shape of every pipeline stage: `--params`, repeated `--preset params/NAME.yaml` and
`--set section.key=value`, clean errors."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from typing import Callable

from thermal2visible.paths import PARAMS
from thermal2visible.config import Params, load_params, preset_overrides
from thermal2visible.errors import ConfigError, PipelineError


def quiet_lightning() -> None:
    """Keep a stage's output to what it says: Lightning's advertising tips and a deprecation inside Lightning
    itself (its own pytree helper, on every fit) tell a user nothing they can act on."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: not record.getMessage().startswith("💡 Tip:")
    )
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")


def add_overrides(parser: argparse.ArgumentParser, meaning: str) -> None:
    """`--set SECTION.KEY=VALUE` (repeatable) into `args.overrides`."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE", help=meaning
    )


def run_stage(main: Callable[[Params], object], description: str | None = None) -> None:
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
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    quiet_lightning()
    try:
        presets = [override for preset in args.presets for override in preset_overrides(preset)]
        main(load_params(args.params, [*presets, *args.overrides]))
    except (ConfigError, PipelineError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
