"""params.yaml -> typed, validated settings: the schema (schema.py: every section's keys, types and ranges, rules.py:
the rules that span sections, marks.py: which keys define the trained weights), reading params.yaml with presets and
overrides (load.py), reading settings stored with a model or cache by any version (stored.py), and the words a bad
value is refused with (messages.py). A bad key or value fails naming `section.key` and why."""
