"""The HTTP surface of the continuous engine.

  generation   /v1/completions and /v1/chat/completions requests checked field by field
  openai       their routes' answers: JSON, or server-sent events ending with [DONE]
"""
