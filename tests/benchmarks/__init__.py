"""Tests of the benchmarks/ programs (no timing assertions)."""
