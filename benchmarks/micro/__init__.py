"""Micro benchmarks (pytest-benchmark) of the engine's building blocks."""
