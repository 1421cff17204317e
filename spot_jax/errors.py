"""User-facing errors: each message is one line naming the problem and what would be valid."""


class ConfigError(ValueError):
  """A run is misconfigured (bad gin value, unknown task, inconsistent lengths, ...)."""
