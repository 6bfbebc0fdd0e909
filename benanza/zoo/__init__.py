"""The paper's 30 reference models (Benanza, Table I) rebuilt offline as ONNX files.

Each model follows the structure of the ONNX Model Zoo version the paper used (2019): the
same operators in the same arrangement, the same shapes, random weights.  Models are built
with ``onnx.helper`` and numpy only, deterministically (a fixed seed per model: the same
bytes on every run), in opset 13, float32, with the batch dimension of the single graph
input symbolic (``N``) and every internal Reshape batch-agnostic.

    >>> from benanza.zoo import MODELS, build_all
    >>> [m.name for m in MODELS][:3]
    ['arcface', 'bvlc-alexnet', 'bvlc-caffenet']
    >>> build_all("models", names=["lenet"])  # doctest: +SKIP

See ``models/README.md`` for the per-model layer/MAC table and the documented deviations.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from ..errors import UsageError
from . import _caffe, _caffe2, _cntk, _gluon, _mxnet, _winml
from ._builder import IR_VERSION, OPSET

__all__ = ["IR_VERSION", "MODELS", "OPSET", "ZooModel", "build_all", "get", "names"]


@dataclass(frozen=True)
class ZooModel:
    """One Table I model.

    ``expected_layers``/``expected_macs`` are what the built model has when it cannot match
    the paper exactly while following the real exported structure; ``layers_note`` and
    ``macs_note`` say why.  Otherwise they equal ``paper_layers``/``paper_macs``.
    """

    id: int
    name: str  # file stem, e.g. "resnet50-v1"
    paper_name: str  # spelling in Table I
    task: str  # IC, OD, FR, ER, SS, HR
    paper_macs: float
    paper_layers: int
    year: int
    source: str  # which exporter / original model the structure follows
    input_shape: tuple[int, ...]  # per-sample shape of the single input (batch is "N")
    builder: Callable[[int], onnx.ModelProto] = field(repr=False, compare=False)
    expected_layers: int = -1
    layers_note: str = ""
    expected_macs: float = -1.0
    macs_note: str = ""

    def __post_init__(self) -> None:
        if self.expected_layers < 0:
            object.__setattr__(self, "expected_layers", self.paper_layers)
        if self.expected_macs < 0:
            object.__setattr__(self, "expected_macs", self.paper_macs)

    @property
    def seed(self) -> int:
        return 20190000 + self.id

    def build(self) -> onnx.ModelProto:
        """Build the model in memory (deterministic: same seed, same bytes)."""
        return self.builder(self.seed)

    @property
    def filename(self) -> str:
        return f"{self.name}.onnx"


def _m(id, name, paper_name, task, macs, layers, year, source, input_shape, builder, **kw):
    return ZooModel(id=id, name=name, paper_name=paper_name, task=task, paper_macs=macs,
                    paper_layers=layers, year=year, source=source, input_shape=input_shape,
                    builder=builder, **kw)


_IMG = (3, 224, 224)

_INCEPTION_V1_NOTE = (
    "Built 143 layers: the zoo's inception_v1 is bvlc-googlenet's graph (same weights: the "
    "files differ by a few hundred bytes) with floor-mode pools, i.e. Conv 57, Relu 57, MaxPool "
    "13, Concat 9, LRN 2, AveragePool, Dropout, Reshape, Gemm, Softmax; a published dump of "
    "inception_v1 also has 143 nodes.  No 144th compute or data-movement node could be "
    "identified; the paper's extra layer is most likely a Constant (the Reshape's target shape "
    "in the opset>=5 files), which is not a layer under Benanza's counting rule."
)

_MOBILENET_MACS_NOTE = (
    "Gluon mobilenetv2_1.0 at 224x224 has 313.6M MACs (300.8M of the reference MobileNetV2 plus "
    "12.8M for Gluon's 1x1 expansion in the t=1 block); the zoo file (13.6 MB, 3.5M parameters) "
    "is that width-1.0 net.  Table I's 437M is not reachable with this structure: it matches "
    "neither the zoo model's shapes nor any layer-count-preserving variant at 224x224 (a "
    "width-1.2 net would give 436.8M but has 4.9M parameters)."
)

_DUC_MACS_NOTE = (
    "The zoo's ResNet101-DUC-HDC takes 800x800 images (its test data is 1x3x800x800) and has 304 "
    "ASPP channels (19 classes x 16: this reproduces the zoo file's 248.6 MiB exactly).  At that "
    "size the graph has 673.1 GMACs: ResNet-101 at output stride 8 on a 100x100 map plus four "
    "dilated 3x3 ASPP convs of 2048->304 channels.  Table I's 34.94G is ~19x smaller and is not "
    "reproduced by any consistent shape of this graph (it would need a ~184x184 input); the "
    "structure and the layer count do not depend on the input size."
)

MODELS: tuple[ZooModel, ...] = (
    _m(1, "arcface", "Arcface", "FR", 12.08e9, 412, 2018,
       "MXNet insightface LResNet100E-IR (fresnet unit v3, PRelu slopes reshaped)", (3, 112, 112),
       _mxnet.arcface_lresnet100e_ir),
    _m(2, "bvlc-alexnet", "BVLC-Alexnet", "IC", 656e6, 24, 2012,
       "Caffe bvlc_alexnet via Caffe2", _IMG, lambda s: _caffe.alexnet_family("alexnet", s)),
    _m(3, "bvlc-caffenet", "BVLC-Caffenet", "IC", 721e6, 24, 2012,
       "Caffe bvlc_reference_caffenet via Caffe2", _IMG,
       lambda s: _caffe.alexnet_family("caffenet", s)),
    _m(4, "bvlc-googlenet", "BVLC-Googlenet", "IC", 1.59e9, 143, 2014,
       "Caffe bvlc_googlenet via Caffe2", _IMG, lambda s: _caffe.googlenet("bvlc_googlenet", s)),
    _m(5, "bvlc-rcnn-ilsvrc13", "BVLC-RCNN-ILSVRC13", "IC", 718e6, 23, 2013,
       "Caffe bvlc_reference_rcnn_ilsvrc13 via Caffe2", _IMG,
       lambda s: _caffe.alexnet_family("rcnn", s)),
    _m(6, "densenet-121", "Densenet-121", "IC", 2.87e9, 910, 2016,
       "Caffe DenseNet-121 (BN+Scale) via Caffe2", _IMG, _caffe2.densenet121),
    _m(7, "duc", "DUC", "SS", 34.94e9, 355, 2017,
       "MXNet TuSimple ResNet101_DUC_HDC", (3, 800, 800), _mxnet.duc_resnet101_hdc,
       expected_macs=673.074204672e9, macs_note=_DUC_MACS_NOTE),
    _m(8, "emotion-ferplus", "Emotion Ferplus", "ER", 877e6, 52, 2016,
       "CNTK FER+ VGG13", (1, 64, 64), _cntk.emotion_ferplus),
    _m(9, "inception-v1", "Inception-v1", "IC", 1.44e9, 144, 2015,
       "Caffe2 inception_v1 (GoogLeNet, floor-mode pools)", _IMG,
       lambda s: _caffe.googlenet("inception_v1", s),
       expected_layers=143, layers_note=_INCEPTION_V1_NOTE),
    _m(10, "inception-v2", "Inception-v2", "IC", 2.03e9, 509, 2015,
       "Caffe2 inception_v2 (BN-Inception, BN+Scale with Unsqueeze'd operands)", _IMG,
       _caffe2.inception_v2),
    _m(11, "lenet", "LeNet", "HR", 796e3, 12, 2010,
       "CNTK MNIST (zoo 'mnist')", (1, 28, 28), _cntk.lenet_mnist),
    _m(12, "mobilenet-v2", "MobileNet-v2", "IC", 437e6, 155, 2017,
       "MXNet Gluon mobilenetv2_1.0", _IMG, _gluon.mobilenet_v2,
       expected_macs=313.619328e6, macs_note=_MOBILENET_MACS_NOTE),
    _m(13, "resnet18-v1", "Resnet18-v1", "IC", 1.82e9, 69, 2015,
       "MXNet Gluon resnet18_v1", _IMG, lambda s: _gluon.resnet_v1(18, s)),
    _m(14, "resnet18-v2", "Resnet18-v2", "IC", 1.82e9, 69, 2016,
       "MXNet Gluon resnet18_v2", _IMG, lambda s: _gluon.resnet_v2(18, s)),
    _m(15, "resnet34-v1", "Resnet34-v1", "IC", 3.67e9, 125, 2015,
       "MXNet Gluon resnet34_v1", _IMG, lambda s: _gluon.resnet_v1(34, s)),
    _m(16, "resnet34-v2", "Resnet34-v2", "IC", 3.67e9, 125, 2016,
       "MXNet Gluon resnet34_v2", _IMG, lambda s: _gluon.resnet_v2(34, s)),
    _m(17, "resnet50-v1", "Resnet50-v1", "IC", 3.87e9, 175, 2015,
       "MXNet Gluon resnet50_v1", _IMG, lambda s: _gluon.resnet_v1(50, s)),
    _m(18, "resnet50-v2", "Resnet50-v2", "IC", 4.10e9, 174, 2016,
       "MXNet Gluon resnet50_v2", _IMG, lambda s: _gluon.resnet_v2(50, s)),
    _m(19, "resnet101-v1", "Resnet101-v1", "IC", 7.58e9, 345, 2015,
       "MXNet Gluon resnet101_v1", _IMG, lambda s: _gluon.resnet_v1(101, s)),
    _m(20, "resnet101-v2", "Resnet101-v2", "IC", 7.81e9, 344, 2016,
       "MXNet Gluon resnet101_v2", _IMG, lambda s: _gluon.resnet_v2(101, s)),
    _m(21, "resnet152-v1", "Resnet152-v1", "IC", 11.30e9, 515, 2015,
       "MXNet Gluon resnet152_v1", _IMG, lambda s: _gluon.resnet_v1(152, s)),
    _m(22, "resnet152-v2", "Resnet152-v2", "IC", 11.53e9, 514, 2016,
       "MXNet Gluon resnet152_v2", _IMG, lambda s: _gluon.resnet_v2(152, s)),
    _m(23, "shufflenet", "Shufflenet", "IC", 127e6, 203, 2015,
       "Caffe2 ShuffleNet v1 (1x, g=3)", _IMG, _caffe2.shufflenet),
    _m(24, "squeezenet-v1.1", "Squeezenet-v1.1", "IC", 352e6, 66, 2016,
       "MXNet Gluon squeezenet1.1", _IMG, _gluon.squeezenet_1_1),
    _m(25, "tiny-yolo-v2", "Tiny Yolo-v2", "OD", 3.13e9, 32, 2016,
       "Darknet tiny-yolo-voc via Core ML / WinMLTools", (3, 416, 416), _winml.tiny_yolo_v2),
    _m(26, "vgg16-bn", "Vgg16-BN", "IC", 15.38e9, 54, 2014,
       "MXNet Gluon vgg16_bn", _IMG, lambda s: _gluon.vgg(16, True, s)),
    _m(27, "vgg16", "Vgg16", "IC", 15.38e9, 41, 2014,
       "MXNet Gluon vgg16", _IMG, lambda s: _gluon.vgg(16, False, s)),
    _m(28, "vgg19-bn", "Vgg19-bn", "IC", 19.55e9, 63, 2014,
       "MXNet Gluon vgg19_bn", _IMG, lambda s: _gluon.vgg(19, True, s)),
    _m(29, "vgg19", "Vgg19", "IC", 19.55e9, 47, 2014,
       "MXNet Gluon vgg19", _IMG, lambda s: _gluon.vgg(19, False, s)),
    _m(30, "zfnet512", "Zfnet512", "IC", 1.48e9, 22, 2013,
       "Caffe2 zfnet512", _IMG, _caffe.zfnet512),
)

_BY_NAME = {m.name: m for m in MODELS}


def names() -> list[str]:
    return [m.name for m in MODELS]


def get(name: str) -> ZooModel:
    """Look a model up by file stem (case-insensitive; a trailing ``.onnx`` is ignored)."""
    key = name.strip().lower()
    key = key.removesuffix(".onnx")
    try:
        return _BY_NAME[key]
    except KeyError:
        raise UsageError(f"unknown zoo model {name!r}; known: {', '.join(names())}") from None


def _select(names_: Iterable[str] | None) -> Iterator[ZooModel]:
    if names_ is None:
        yield from MODELS
        return
    if isinstance(names_, str):
        names_ = [names_]
    wanted = [get(n) for n in names_]  # validate everything before building anything
    seen: set[str] = set()
    for m in wanted:
        if m.name not in seen:
            seen.add(m.name)
            yield m


def build_all(out_dir: str | os.PathLike, names: Sequence[str] | None = None,
              progress: Callable[[str], None] | None = None) -> list[Path]:
    """Build the models (all 30 by default, in Table I order) into ``out_dir/<name>.onnx``.

    Weights are stored inline (every model is < 2 GB).  Existing files are overwritten; each
    file is written to a temporary name first and renamed, so an interrupted build never
    leaves a truncated model behind.  ``progress(name)`` is called after each model.
    Returns the written paths.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    selected = list(_select(names))
    paths: list[Path] = []
    for m in selected:
        model = m.build()
        path = out / m.filename
        tmp = path.with_name(path.name + ".tmp")
        data = model.SerializeToString()
        del model
        with open(tmp, "wb") as f:
            f.write(data)
        del data
        os.replace(tmp, path)
        paths.append(path)
        if progress is not None:
            progress(m.name)
    return paths
