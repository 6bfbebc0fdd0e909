"""Benanza: lower-bound latency of deep-learning models from generated library micro-benchmarks."""

__version__ = "0.1.0"
