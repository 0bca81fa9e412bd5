"""pydantic's errors in the words a params.yaml reader expects: `section.key: why`."""

from __future__ import annotations

import dataclasses
import typing

from thermal2visible.config.schema import Params


def _annotation(location: tuple, schema: type) -> object:
    """The type `schema` declares at `location` (section, key), or None where it declares nothing."""
    hint: object = schema
    for name in location:
        if name not in getattr(hint, "__dataclass_fields__", {}):
            return None
        hint = typing.get_type_hints(hint)[name]
    return hint


BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}  # a Field constraint
MISSING_FROM_PARAMS = "params.yaml holds a value for every key; the shipped params.yaml has them all"


def reason(
    problem: dict, within: tuple = (), missing: str = MISSING_FROM_PARAMS, schema: type = Params, prefix: str = ""
) -> str:
    """One pydantic error of `schema` -> `<prefix>key: why`, in the words a params.yaml reader expects. `schema` is
    Params (or a stage's extension of it), a section, a network's own Settings or an export's metadata; `within` is
    where in `schema` the validated value sits, `prefix` what the message names the schema's keys under
    ("model.generator_settings.", "metadata "), and `missing` says why a key that is absent should be there."""
    location = within + tuple(part for part in problem["loc"] if isinstance(part, str))
    if typing.get_origin(_annotation(location[:-1], schema)) is typing.Union:
        location = location[:-1]  # pydantic names the member of a union that failed: the key is what a reader needs
    inside_a_list = any(isinstance(part, int) for part in problem["loc"])
    where, value, error_type = prefix + ".".join(location), problem.get("input"), problem["type"]
    annotation = _annotation(location, schema)
    if error_type == "unexpected_keyword_argument":
        parent = _annotation(location[:-1], schema)
        known = getattr(parent, "__dataclass_fields__", {})
        if known and all(dataclasses.is_dataclass(hint) for hint in typing.get_type_hints(parent).values()):
            return f"{where}: unknown section (known: {', '.join(known)})"
        return f"{where}: unknown key (known keys: {', '.join(sorted(known))})"
    if error_type == "dataclass_type":
        return f"{where}: expected a mapping of keys, got {value!r}"
    if error_type == "missing" and not inside_a_list:
        return f"{where}: missing ({missing})"
    if error_type == "value_error":  # a validator's own words; a rule across sections names its key itself
        return f"{where}: {problem['ctx']['error']}" if where else str(problem["ctx"]["error"])
    bound = next((f"{BOUNDS[key]} {limit:g}" for key, limit in problem.get("ctx", {}).items() if key in BOUNDS), None)
    if bound:
        return f"{where}: {value!r} must be {bound}"
    if typing.get_origin(annotation) is tuple:
        return f"{where}: expected a list of {len(typing.get_args(annotation))} numbers, got {value!r}"
    if typing.get_origin(annotation) is typing.Union:
        members = typing.get_args(annotation)
        return f"{where}: expected {' or '.join(_words(member) for member in members)}, got {value!r}"
    if error_type == "literal_error":
        return f"{where}: {value!r} is not one of {list(typing.get_args(annotation))}"
    expected = {
        "int_type": "an integer",
        "float_type": "a number",
        "bool_type": "true or false",
        "string_type": "a string",
    }.get(error_type)
    if expected:
        return f"{where}: expected {expected}, got {value!r}"
    return f"{where}: {value!r}: {problem['msg'].replace('Input should', 'should')}"


def _words(annotation: object) -> str:
    """A member of a union in a params.yaml reader's words."""
    if annotation is bool:
        return "true or false"
    return " or ".join(str(choice) for choice in typing.get_args(annotation))
