"""Benanza: lower-bound latency of deep-learning models from generated library micro-benchmarks."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # ``benanza.measure`` and ``benanza.ort_session_options`` without importing the profiler on
    # every ``import benanza``
    if name in ("measure", "ort_session_options"):
        from . import profiler

        return getattr(profiler, name)
    raise AttributeError(f"module 'benanza' has no attribute {name!r}")
