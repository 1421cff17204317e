"""Optional integrations with other frameworks; each sub-package imports its framework itself."""
