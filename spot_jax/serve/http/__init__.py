"""The HTTP surface of `python -m spot_jax.serve`.

  api          HTTP requests checked field by field, OpenAI-style responses and errors
  app          the Starlette routes
  metrics      the Prometheus metrics
  generation   /v1/completions and /v1/chat/completions requests for the continuous engine
  openai       their answers: JSON, or server-sent events ending with [DONE]
  detok        generated ids' text as it comes (each id decoded a bounded number of times)
"""
