"""User-facing errors: each message is one line naming the problem and what would be valid."""


class ConfigError(ValueError):
  """A run is misconfigured (bad gin value, unknown task, inconsistent lengths, ...)."""


def one_line(error: BaseException) -> str:
  """The first meaningful line of an exception's message (its type name if it has none); gin
  and orbax append context lines, KeyError quotes its message."""
  text = str(error).strip() or type(error).__name__
  line = text.splitlines()[0].strip()
  if isinstance(error, KeyError) and line.startswith(("'", '"')):
    line = line.strip("'\"")
  return line
