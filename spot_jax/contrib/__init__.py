"""Optional integrations with other frameworks; each sub-package imports its framework itself.

  t5x/   spot-jax's prompt methods inside `python -m t5x.train` (the only code importing t5x)
"""
