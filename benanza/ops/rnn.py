"""Recurrent layers (ONNX LSTM, GRU, RNN). oneDNN has an RNN primitive, but Benanza's oneDNN
benchmarks do not run it (no runtime family): such layers are not covered there rather than
missing forever."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Cpp, CudnnLowering, CudnnTable, Family, NodeView, present, required, word
from .grammar import F, Problem, f32

# ONNX's default activations per direction
RNN_DEFAULT_ACTIVATIONS = {"lstm": ("sigmoid", "tanh", "tanh"), "gru": ("sigmoid", "tanh"), "rnn": ("tanh",)}
_GATES = {"lstm": 4, "gru": 3, "rnn": 1}


@dataclass(frozen=True)
class RnnProblem(Problem):
    """One ONNX LSTM/GRU/RNN layer. ``activations`` are empty when they are ONNX's defaults;
    ``clip`` None: no cell clip; ``peephole``: LSTM's P input; ``lbr``: GRU linear_before_reset."""

    FAMILY: ClassVar[str] = "rnn"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("", "cell", "word"),), (F("t", "seq"), F("mb", "mb")), (F("ic", "ic"),), (F("sic", "hidden"),),
        (F("dir", "dirs"),), (F("bias", "bias", "bool"),), (F("lbr", "lbr", "bool", False),),
        (F("clip", "clip", "float", None),), (F("inforget", "input_forget", "flag", False),),
        (F("peep", "peephole", "flag", False),), (F("", "activations", "words", ()),),
        (F("actalpha", "act_alpha", "floats", ()),), (F("actbeta", "act_beta", "floats", ()),))

    cell: str
    seq: int
    mb: int
    ic: int
    hidden: int
    dirs: int
    bias: bool
    lbr: bool = False
    clip: float | None = None
    input_forget: bool = False
    peephole: bool = False
    activations: tuple[str, ...] = ()
    act_alpha: tuple[float, ...] = ()
    act_beta: tuple[float, ...] = ()

    def macs(self) -> int:
        per_step = _GATES[self.cell] * (self.ic + self.hidden) * self.hidden
        return per_step * self.seq * self.mb * self.dirs



def _rnn_build(view: NodeView) -> Problem:
    x, w = required(view, 0), required(view, 1)
    a = view.attrs
    layout = int(a.get("layout", 0))
    seq, mb = (x.shape[1], x.shape[0]) if layout else (x.shape[0], x.shape[1])
    dirs = w.shape[0]
    cell = view.op.lower()
    acts = tuple(word(s) for s in a.get("activations") or ())
    if acts == RNN_DEFAULT_ACTIVATIONS[cell] * dirs:
        acts = ()  # spelled-out defaults compute what omitted ones do
    clip = a.get("clip")
    return RnnProblem(cell=cell, seq=seq, mb=mb, ic=x.shape[2], hidden=int(a["hidden_size"]), dirs=dirs,
                      bias=present(view, 3), lbr=bool(int(a.get("linear_before_reset", 0))),
                      clip=f32(clip) if clip is not None else None,
                      input_forget=bool(int(a.get("input_forget", 0))),
                      peephole=cell == "lstm" and present(view, 7), activations=acts,
                      act_alpha=tuple(f32(v) for v in a.get("activation_alpha") or ()) if acts else (),
                      act_beta=tuple(f32(v) for v in a.get("activation_beta") or ()) if acts else ())


def _rnn_cudnn(p: Problem) -> str | None:
    assert isinstance(p, RnnProblem)
    # cuDNN's cells have the default activations, no coupled input-forget gate and no
    # peepholes; a cell clip the benchmarks do not set is a different computation.
    plain = not (p.activations or p.input_forget or p.peephole or p.clip is not None)
    return "cudnnRNNForward" if plain else None


_CELLS = {"lstm": "Lstm", "gru": "Gru", "rnn": "RnnTanh"}


@dataclass(frozen=True)
class RnnLayer:
    """cuDNN RnnLayer: one layer of cudnnRNNForward."""

    cell: Cpp
    seq: int
    batch: int
    input: int
    hidden: int
    dirs: int
    bias: bool


def _cudnn_row(p: RnnProblem, api: str) -> RnnLayer:
    return RnnLayer(cell=Cpp("Cell::" + _CELLS[p.cell]), seq=p.seq, batch=p.mb, input=p.ic, hidden=p.hidden,
                    dirs=p.dirs, bias=p.bias)


RNN = Family("rnn", RnnProblem, ("LSTM", "GRU", "RNN"), _rnn_build, cudnn_api=_rnn_cudnn,
             cudnn={"cudnnRNNForward": CudnnLowering(CudnnTable("rnn", "add_rnn", False, True), _cudnn_row)})
FAMILIES = (RNN,)
