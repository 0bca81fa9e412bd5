"""The one entry shape of every pipeline stage: `--params`, repeated `--preset params/NAME.yaml` and
`--set section.key=value`, clean errors."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from thermal2visible.config import Params, load_params, preset_overrides
from thermal2visible.errors import ConfigError, PipelineError


def run_stage(main: Callable[[Params], object], description: str | None = None) -> None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument("--preset", dest="presets", action="append", default=[], metavar="FILE",
                        help="apply a preset from params/ (repeatable), before any --set")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one parameter (repeatable), as `dvc exp run -S` does")
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    try:
        presets = [override for preset in args.presets for override in preset_overrides(preset)]
        main(load_params(args.params, [*presets, *args.overrides]))
    except (ConfigError, PipelineError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
