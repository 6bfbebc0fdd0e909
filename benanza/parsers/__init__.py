"""Parsers of model execution profiles: one module per format, typed records out."""

from .base import (
                   ApiEvent,
                   ConvSignature,
                   FrameworkTrace,
                   GemmSignature,
                   KernelEvent,
                   LibraryCall,
                   OpEvent,
                   ProfileFormatError,
                   Span,
)
from .bundle import ExecutionProfile, LatencyStats, latency_stats, load_bundle, load_file, load_profile
from .cublas_log import parse_cublas_log
from .cudnn_log import parse_cudnn_log
from .kineto import parse_kineto_trace
from .nsys import parse_nsys, parse_nsys_sqlite
from .onednn_verbose import parse_onednn_verbose
from .ort import parse_ort_profile

__all__ = [
    "ApiEvent", "ConvSignature", "ExecutionProfile", "FrameworkTrace", "GemmSignature", "KernelEvent",
    "LatencyStats", "LibraryCall", "OpEvent", "ProfileFormatError", "Span", "latency_stats", "load_bundle",
    "load_file", "load_profile", "parse_cublas_log", "parse_cudnn_log", "parse_kineto_trace", "parse_nsys",
    "parse_nsys_sqlite", "parse_onednn_verbose", "parse_ort_profile",
]
