"""Benanza: lower-bound latency of deep-learning models from generated library micro-benchmarks."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # ``benanza.measure`` without importing the profiler on every ``import benanza``
    if name == "measure":
        from .profiler import measure

        return measure
    raise AttributeError(f"module 'benanza' has no attribute {name!r}")
