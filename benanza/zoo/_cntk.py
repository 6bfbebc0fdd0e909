"""Models the ONNX Model Zoo exported from CNTK (2017-2018): LeNet (the zoo's ``mnist``) and
Emotion FER+ (VGG13-like, 64x64 grayscale).

Export conventions reproduced: Convolution without bias followed by a separate Add of a
(C,1,1) bias; Dense as MatMul + Add; a multi-dimensional Times exports as a Reshape of the
parameter to 2-D and a Reshape of the activation to (N, K) -- here ``[0, -1]`` so the batch
stays free.  Dropout is kept.
"""

from __future__ import annotations

import onnx

from ._builder import GraphBuilder


def _conv_plus(g: GraphBuilder, x: str, ch: int, k: int, name: str, plus: str) -> str:
    x = g.conv(x, ch, k, 1, k // 2, bias=False, name=name)
    b = g.random(plus + "_bias", (ch, 1, 1), std=0.01)
    return g.add(x, b, name=plus)


def lenet_mnist(seed: int) -> onnx.ModelProto:
    """CNTK MNIST convnet (the ONNX Model Zoo ``mnist`` model, 28x28 grayscale)."""
    g = GraphBuilder("mnist", seed, doc="CNTK MNIST / LeNet (ONNX Model Zoo layout)")
    x = g.input("Input3", (1, 28, 28))
    # The classifier weight is stored (16,4,4,10) and reshaped to (256,10) inside the graph.
    p193 = g.weight("Parameter193", (16, 4, 4, 10), fan_in=256)
    w = g.reshape(p193, [256, 10], (256, 10), name="Times212_reshape1")
    x = _conv_plus(g, x, 8, 5, "Convolution28", "Plus30")
    x = g.relu(x, name="ReLU32")
    x = g.maxpool(x, 2, 2, name="Pooling66")
    x = _conv_plus(g, x, 16, 5, "Convolution110", "Plus112")
    x = g.relu(x, name="ReLU114")
    x = g.maxpool(x, 3, 3, name="Pooling160")
    n = g.shape(x)[0]
    x = g.reshape(x, [0, -1], (n, 256), name="Times212_reshape0")
    x = g.matmul(x, w, name="Times212")
    x = g.add(x, g.random("Parameter194", (1, 10), std=0.01), name="Plus214")
    g.output(x)
    return g.build()


def emotion_ferplus(seed: int) -> onnx.ModelProto:
    """CNTK FER+ VGG13 (Barsoum et al.), 64x64 grayscale input, 8 emotion logits."""
    g = GraphBuilder("emotion_ferplus", seed, doc="CNTK Emotion FER+ (ONNX Model Zoo layout)")
    x = g.input("Input3", (1, 64, 64))
    x = g.binary("Sub", x, g.scalar("Constant339", 127.5), name="Minus340")
    x = g.binary("Div", x, g.scalar("Constant343", 255.0), name="Block352")
    idx = 0
    for stage, (n_conv, ch) in enumerate(zip([2, 2, 3, 3], [64, 128, 256, 256])):
        for _ in range(n_conv):
            x = _conv_plus(g, x, ch, 3, f"Convolution{idx}", f"Plus{idx}")
            x = g.relu(x, name=f"ReLU{idx}")
            idx += 1
        x = g.maxpool(x, 2, 2, name=f"Pooling{stage}")
        x = g.dropout(x, name=f"Dropout{stage}")
    n, c, h, w = g.shape(x)
    p = g.weight("Parameter_fc6", (c, h, w, 1024), fan_in=c * h * w)
    w6 = g.reshape(p, [c * h * w, 1024], (c * h * w, 1024), name="Times_fc6_reshape1")
    x = g.reshape(x, [0, -1], (n, c * h * w), name="Times_fc6_reshape0")
    x = g.matmul(x, w6, name="Times_fc6")
    x = g.add(x, g.random("Parameter_fc6_b", (1, 1024), std=0.01), name="Plus_fc6")
    x = g.relu(x, name="ReLU_fc6")
    x = g.dropout(x, name="Dropout_fc6")
    x = g.matmul(x, g.weight("Parameter_fc7", (1024, 1024), fan_in=1024), name="Times_fc7")
    x = g.add(x, g.random("Parameter_fc7_b", (1, 1024), std=0.01), name="Plus_fc7")
    x = g.relu(x, name="ReLU_fc7")
    x = g.dropout(x, name="Dropout_fc7")
    x = g.matmul(x, g.weight("Parameter_fc8", (1024, 8), fan_in=1024), name="Times622")
    x = g.add(x, g.random("Parameter_fc8_b", (1, 8), std=0.01), name="Plus692")
    g.output(x)
    return g.build()
