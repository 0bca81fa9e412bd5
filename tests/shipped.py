"""The shipped settings (params.yaml) with changes: how a test gets a section without restating its values."""

import dataclasses
from pathlib import Path

from thermal2visible.config import load_params

SHIPPED = load_params(Path(__file__).resolve().parents[1] / "params.yaml")


def shipped(section: str, **changes):
    """params.yaml's `section`, with `changes` (validated by the schema as a params.yaml value would be)."""
    return dataclasses.replace(getattr(SHIPPED, section), **changes)
