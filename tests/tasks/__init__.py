"""Tests of the task registries (tasks/)."""
