"""Recurrent layers (ONNX LSTM, GRU, RNN): cuDNN's cudnnRNNForward and oneDNN's RNN primitives
(lstm_forward, with an LSTM's peepholes, gru_forward, lbr_gru_forward for a GRU's
linear_before_reset, vanilla_rnn_forward), one layer each, in ONNX's direction. What neither
library's cell computes (non-default activations, a cell clip, a coupled input-forget gate,
sequences shorter than T), and peepholes on cuDNN, whose LSTM cell has none, is not covered,
with the reason (``uncovered``), never costed as the plain cell."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Cpp, CudnnLowering, CudnnTable, Family, NodeView, OnednnLowering, present, required, word
from .grammar import F, Problem, f32
from .reference import Fills

# ONNX's default activations per direction
RNN_DEFAULT_ACTIVATIONS = {"lstm": ("sigmoid", "tanh", "tanh"), "gru": ("sigmoid", "tanh"), "rnn": ("tanh",)}
_GATES = {"lstm": 4, "gru": 3, "rnn": 1}


@dataclass(frozen=True)
class RnnProblem(Problem):
    """One ONNX LSTM/GRU/RNN layer. ``activations`` are empty when they are ONNX's defaults;
    ``clip`` None: no cell clip; ``peephole``: LSTM's P input; ``lbr``: GRU linear_before_reset;
    ``reverse``: one direction, right to left; ``batch_first``: ONNX layout=1 (X [N, T, I]);
    ``ragged``: sequence_lens given and not every sequence T long (or computed at run time);
    ``init_h``, ``init_c``: initial hidden (cell) state given (the same work, other inputs)."""

    FAMILY: ClassVar[str] = "rnn"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("", "cell", "word"),), (F("t", "seq"), F("mb", "mb")), (F("ic", "ic"),), (F("sic", "hidden"),),
        (F("dir", "dirs"),), (F("bias", "bias", "bool"),), (F("lbr", "lbr", "bool", False),),
        (F("clip", "clip", "float", None),), (F("inforget", "input_forget", "flag", False),),
        (F("peep", "peephole", "flag", False),), (F("", "activations", "words", ()),),
        (F("actalpha", "act_alpha", "floats", ()),), (F("actbeta", "act_beta", "floats", ()),),
        (F("rev", "reverse", "flag", False),), (F("bf", "batch_first", "flag", False),),
        (F("ragged", "ragged", "flag", False),), (F("hinit", "init_h", "flag", False),),
        (F("cinit", "init_c", "flag", False),))

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
    reverse: bool = False
    batch_first: bool = False
    ragged: bool = False
    init_h: bool = False
    init_c: bool = False

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
    defaults = RNN_DEFAULT_ACTIVATIONS[cell] * dirs
    # spelled-out defaults compute what omitted ones do; a direction reads only its own, so the
    # schema's default for RNN (Tanh, Tanh) is the default of a one-direction RNN too
    if acts[:len(defaults)] == defaults:
        acts = ()
    clip = a.get("clip")
    direction = a.get("direction", "forward")
    lens = view.value(4) if present(view, 4) else None
    # full-length sequence_lens compute what omitted ones do; lengths known only at run time may not
    ragged = present(view, 4) and (lens is None or bool((lens != seq).any()))
    return RnnProblem(cell=cell, seq=seq, mb=mb, ic=x.shape[2], hidden=int(a["hidden_size"]), dirs=dirs,
                      bias=present(view, 3), lbr=bool(int(a.get("linear_before_reset", 0))),
                      clip=f32(clip) if clip is not None else None,
                      input_forget=bool(int(a.get("input_forget", 0))),
                      peephole=cell == "lstm" and present(view, 7), activations=acts,
                      act_alpha=tuple(f32(v) for v in a.get("activation_alpha") or ()) if acts else (),
                      act_beta=tuple(f32(v) for v in a.get("activation_beta") or ()) if acts else (),
                      reverse=dirs == 1 and word(direction) == "reverse", batch_first=bool(layout), ragged=ragged,
                      init_h=present(view, 5), init_c=cell == "lstm" and present(view, 6))


def _unexpressed(p: Problem) -> str | None:
    """What of the layer neither library's cell computes, in one line; None: both run it. The
    benchmarks run one plain cell over full-length sequences, so anything else would be costed as
    a different computation."""
    assert isinstance(p, RnnProblem)
    if p.activations:
        return f"activations {', '.join(p.activations)} (the libraries' cells have ONNX's defaults only)"
    if p.clip is not None:
        return f"cell clip {p.clip:g} (the libraries' cells do not clip)"
    if p.input_forget:
        return "input_forget=1 (no library cell couples the input and forget gates)"
    if p.ragged:
        return "sequence_lens shorter than the sequence or computed at run time (the benchmarks run full length)"
    return None


def _cudnn_refuses(p: Problem) -> str | None:
    """Why cudnnRNNForward does not run the layer, in one line; None: it does."""
    assert isinstance(p, RnnProblem)
    return _unexpressed(p) or ("peepholes (input P; cuDNN's LSTM cell has none)" if p.peephole else None)


def _rnn_cudnn(p: Problem) -> str | None:
    return "cudnnRNNForward" if _cudnn_refuses(p) is None else None


_ONEDNN = {"lstm": "lstm_forward", "gru": "gru_forward", "rnn": "vanilla_rnn_forward"}


def _rnn_onednn(p: Problem) -> str | None:
    assert isinstance(p, RnnProblem)
    if _unexpressed(p) is not None:
        return None
    return "lbr_gru_forward" if p.cell == "gru" and p.lbr else _ONEDNN[p.cell]


def _uncovered(p: Problem, backend: str) -> str | None:
    return _cudnn_refuses(p) if backend == "cudnn" else _unexpressed(p)


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


@dataclass(frozen=True)
class RnnParams:
    """oneDNN RnnParams."""

    cell: str
    seq: int
    mb: int
    ic: int
    hidden: int
    dirs: int
    bias: bool
    lbr: bool
    reverse: bool
    batch_first: bool
    init_h: bool
    init_c: bool
    peephole: bool


def _onednn_row(p: RnnProblem, api: str) -> RnnParams:
    return RnnParams(cell=p.cell, seq=p.seq, mb=p.mb, ic=p.ic, hidden=p.hidden, dirs=p.dirs, bias=p.bias,
                     lbr=p.lbr, reverse=p.reverse, batch_first=p.batch_first, init_h=p.init_h, init_c=p.init_c,
                     peephole=p.peephole)


def _fills(p: RnnProblem) -> tuple[int, ...]:
    """X, W, R, then B, initial_h, initial_c and P where the layer has them."""
    return (0, 1, 2) + tuple(i for i, given in ((3, p.bias), (5, p.init_h), (6, p.init_c), (7, p.peephole)) if given)


RNN = Family("rnn", RnnProblem, ("LSTM", "GRU", "RNN"), _rnn_build, cudnn_api=_rnn_cudnn, onednn_api=_rnn_onednn,
             cudnn={"cudnnRNNForward": CudnnLowering(CudnnTable("rnn", "add_rnn", False, True), _cudnn_row)},
             onednn=OnednnLowering("rnn", False, _onednn_row, reference=Fills(_fills)), uncovered=_uncovered)
FAMILIES = (RNN,)
