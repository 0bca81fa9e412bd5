"""What a stage records for DVC: its numbers in a metrics file, which `dvc metrics show` and `dvc exp show` turn into
columns, and everything else it says (names, digests, reasons, flags) in a report beside it, so that those tables
hold numbers only whatever a stage adds. The two are read back as one record."""

import json
from numbers import Real
from pathlib import Path

from thermal2visible.errors import PipelineError


def is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def split_numbers(record: dict) -> tuple[dict, dict]:
    """(the numbers of `record`, the rest), each keeping the nesting it had; sections that end up empty are left out."""
    numbers, rest = {}, {}
    for key, value in record.items():
        if isinstance(value, dict):
            inner_numbers, inner_rest = split_numbers(value)
            if inner_numbers:
                numbers[key] = inner_numbers
            if inner_rest:
                rest[key] = inner_rest
        else:
            (numbers if is_number(value) else rest)[key] = value
    return numbers, rest


def write_json(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n")


def write_record(record: dict, metrics: Path, report: Path | None = None) -> None:
    """`record`'s numbers to `metrics`, the rest to `report`; a stage without a report records numbers only."""
    numbers, rest = split_numbers(record)
    if rest and report is None:
        raise ValueError(f"{metrics}: a metrics file holds numbers only, not {sorted(rest)}")
    write_json(metrics, numbers)
    if report is not None:
        write_json(report, rest)


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PipelineError(f"{path}: missing (dvc repro runs the stage that writes it)") from None
    except json.JSONDecodeError as error:
        raise PipelineError(f"{path}: not valid JSON ({error})") from None


def merged(numbers: dict, rest: dict) -> dict:
    whole = dict(numbers)
    for key, value in rest.items():
        whole[key] = merged(whole[key], value) if isinstance(value, dict) and key in whole else value
    return whole


def read_record(metrics: Path, report: Path | None = None) -> dict:
    """The record a stage wrote with write_record, numbers and report together."""
    return merged(read_json(metrics), read_json(report) if report is not None else {})
