"""Typed problem records: what one layer computes, one frozen record per op family.

The records live with their families (``benanza.ops.<family>``), the key grammar in
``benanza.ops.grammar`` and the table of families in ``benanza.ops.registry``; this module is
the one place that gathers the names the rest of Benanza uses.

Every problem formats to a benchdnn-style key, ``family:token_token_...``, and parses back
(``parse_problem(format_problem(p)) == p``). A layer key is that text plus ``_<dtype>``:
``conv:mb1_ic64ih56iw56_oc64oh56ow56_kh3kw3_sh1sw1_ph1pw1_dh1dw1_g1_bias0_f32``.
"""

from __future__ import annotations

from .ops.attention import AttentionProblem
from .ops.binary import COMMUTATIVE, BinaryProblem, broadcast, canonical_operands
from .ops.conv import ConvProblem, DeconvProblem
from .ops.copy import ConcatProblem, CopyProblem, TransposeProblem
from .ops.eltwise import DropoutProblem, EltwiseProblem, PreluProblem
from .ops.gemm import GemmProblem, MatMulProblem
from .ops.generic import VIEW_OPS, GenericProblem
from .ops.grammar import FLT_MAX, LayerKey, Problem, f32, format_dims, format_number, key_hash, layer_key, parse_key
from .ops.norm import BnormProblem, LnormProblem, LrnProblem
from .ops.pool import PoolProblem
from .ops.reduce import ReduceProblem
from .ops.registry import PROBLEM_TYPES as TYPED
from .ops.registry import format_problem, parse_layer_key, parse_problem
from .ops.resample import ResampleProblem
from .ops.rnn import RNN_DEFAULT_ACTIVATIONS, RnnProblem
from .ops.softmax import SoftmaxProblem

__all__ = [
    "AttentionProblem", "BinaryProblem", "BnormProblem", "COMMUTATIVE", "ConcatProblem", "ConvProblem", "CopyProblem",
    "DeconvProblem", "DropoutProblem", "EltwiseProblem", "FLT_MAX", "GemmProblem", "GenericProblem", "LayerKey",
    "LnormProblem", "LrnProblem", "MatMulProblem", "PoolProblem", "PreluProblem", "Problem", "RNN_DEFAULT_ACTIVATIONS",
    "ReduceProblem", "ResampleProblem", "RnnProblem", "SoftmaxProblem", "TYPED", "TransposeProblem", "VIEW_OPS",
    "broadcast", "canonical_operands", "f32", "format_dims", "format_number", "format_problem", "key_hash",
    "layer_key", "parse_key", "parse_layer_key", "parse_problem",
]
