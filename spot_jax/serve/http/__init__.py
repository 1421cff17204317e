"""The HTTP surface of `python -m spot_jax.serve`.

  api          HTTP requests checked field by field, OpenAI-style responses and errors
  app          the Starlette routes
  metrics      the Prometheus metrics
"""
