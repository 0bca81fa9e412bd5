"""The shipped settings (params.yaml) with changes: how a test gets a section without restating its values."""

import dataclasses
from pathlib import Path

from thermal2visible.config import load_params
from thermal2visible.paths import PARAMS

SHIPPED_FROM = Path(__file__).resolve().parents[1] / PARAMS
SHIPPED = load_params(SHIPPED_FROM)


def shipped(section: str, **changes):
    """params.yaml's `section`, with `changes` (validated by the schema as a params.yaml value would be)."""
    return dataclasses.replace(getattr(SHIPPED, section), **changes)
