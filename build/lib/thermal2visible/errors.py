"""The errors a user can fix. Stages print them without a traceback; anything else is a bug and keeps its
traceback."""


class ConfigError(ValueError):
    """A params.yaml value that cannot be used; the message names the key."""


class PipelineError(ValueError):
    """An expected failure a user can fix (bad data, missing stage output); the message names the file and why."""
