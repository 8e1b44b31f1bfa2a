"""Benchmarks that size a deployment: codec DSP cost and calls per worker core."""
