"""Exceptions the library raises; the CLI turns them into one clean line each."""

from __future__ import annotations

from pathlib import Path


class BenanzaError(Exception):
    """Base of every error Benanza reports to a user."""


class FileProblem(BenanzaError):
    """A problem with one input file: the message names the file and the problem."""

    def __init__(self, path: str | Path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class ModelError(FileProblem):
    """An ONNX model that cannot be read or processed."""


class ShapeError(ModelError):
    """Shapes that cannot be made concrete (symbolic dims without a value, failed inference)."""


class NodeError(BenanzaError):
    """A node the op code cannot read (a required input omitted, a weight of the wrong rank):
    the message says what is wrong; the processor adds the file and the node."""


class LayerKeyError(BenanzaError):
    """A layer key string that does not follow the grammar."""


class UsageError(BenanzaError):
    """Bad command-line values (e.g. a malformed --input-shape)."""
