"""Tests of the command lines as users run them, and multi-process runs."""
