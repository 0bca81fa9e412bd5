"""YAML read as data: PyYAML's safe loader without aliases and anchors.

`safe_load` builds no objects, but it expands aliases: a few hundred bytes of nested anchors (each level naming the
one below nine times) become billions of values once anything walks the result, and that walk (a `json.dumps`, a
schema check) is one uninterruptible call. No settings file of this project needs an alias, so the first one is
refused with its line, before anything is built."""

from __future__ import annotations

import yaml


class AliasRefused(yaml.YAMLError):
    pass


class _DataLoader(yaml.SafeLoader):
    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            kind = "alias *" if isinstance(event, yaml.AliasEvent) else "anchor &"
            raise AliasRefused(
                f"line {event.start_mark.line + 1}: YAML {kind}{event.anchor} refused (settings are plain data: "
                "write the value out where it is used)"
            )
        return super().compose_node(parent, index)


def load_yaml(text: str) -> object:
    """The YAML document in `text`; AliasRefused (a yaml.YAMLError naming the line) at an alias or anchor."""
    return yaml.load(text, Loader=_DataLoader)  # noqa: S506 - a SafeLoader subclass
