"""Tests of the repository as a whole: architecture, docs, packaging."""
