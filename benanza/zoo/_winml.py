"""Tiny YOLOv2 (VOC) as in the ONNX Model Zoo: converted Darknet -> Core ML -> ONNX
(WinMLTools), 416x416 input, 125x(12|13)x(12|13) grid output.

Export conventions reproduced: a pre-processing scaler (the zoo's ImageScaler(1/255), which
opset 13 no longer has, is the equivalent single Mul), Conv without bias +
BatchNormalization + LeakyRelu(0.1), 2x2 max pools, a biased 1x1 detection conv.
"""

from __future__ import annotations

import onnx

from ._builder import GraphBuilder


def tiny_yolo_v2(seed: int, pad_last_pool: bool = False) -> onnx.ModelProto:
    """Tiny YOLOv2-VOC.

    ``pad_last_pool=False`` (default) leaves the stride-1 2x2 max pool unpadded, giving the
    12x12 map behind the paper's 3.13 GMACs; Darknet pads it to keep 13x13 (3.49 GMACs).
    """
    g = GraphBuilder("tiny_yolov2", seed, doc="Tiny YOLOv2 VOC via Core ML (ONNX Model Zoo layout)")
    x = g.input("image", (3, 416, 416))
    x = g.mul(x, g.scalar("scalerPreprocessor_scale", 1.0 / 255.0), name="scalerPreprocessor")
    chans = [16, 32, 64, 128, 256, 512, 1024, 1024]
    for i, ch in enumerate(chans):
        sfx = "" if i == 0 else str(i)
        x = g.conv(x, ch, 3, 1, 1, bias=False, name=f"convolution{sfx}")
        x = g.bn(x, eps=1e-5, name=f"BatchNormalization{sfx}")
        x = g.leaky_relu(x, 0.1, name=f"activation{sfx}")
        if i < 5:
            x = g.maxpool(x, 2, 2, name=f"pooling{sfx}")
        elif i == 5:
            x = g.maxpool(x, 2, 1, [0, 0, 1, 1] if pad_last_pool else 0, name=f"pooling{sfx}")
    x = g.conv(x, 125, 1, 1, 0, bias=True, name="convolution8")
    g.output(x)
    return g.build()
