"""The HTTP surface: request checks and the OpenAI-compatible routes."""
