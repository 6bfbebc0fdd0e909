"""Models the ONNX Model Zoo exported from MXNet symbols (mx2onnx, 2018-2019): ArcFace
(LResNet100E-IR, insightface) and DUC (ResNet101_DUC_HDC, TuSimple).

Export conventions reproduced: ``mx.sym.identity`` -> Identity, scalar arithmetic -> Sub/Mul
with scalar initializers, LeakyReLU(prelu) -> PRelu whose slope is Reshape'd to (C,1,1) (the
zoo's fixed ArcFace model), ElementWiseSum -> Sum, FullyConnected -> Flatten + Gemm.
"""

from __future__ import annotations

import onnx

from ._builder import GraphBuilder


# --------------------------------------------------------------------------- ArcFace
def _prelu(g: GraphBuilder, x: str, name: str) -> str:
    c = g.channels(x)
    gamma = g.random(name + "_gamma", (c,), std=0.02, mean=0.25)
    slope = g.reshape(gamma, [c, 1, 1], (c, 1, 1), name=name + "_reshape")
    return g.node("PRelu", [x, slope], g.shape(x), name=name)


def arcface_lresnet100e_ir(seed: int) -> onnx.ModelProto:
    """insightface LResNet100E-IR (fresnet, unit v3, 'E' embedding head), 112x112 input."""
    g = GraphBuilder("arcface_lresnet100e_ir", seed,
                     doc="ArcFace LResNet100E-IR (insightface fresnet 100, ONNX Model Zoo layout)")
    x = g.input("data", (3, 112, 112))
    eps = 2e-5
    x = g.node("Identity", [x], g.shape(x), name="id")
    x = g.binary("Sub", x, g.scalar("_minusscalar0_scalar", 127.5), name="_minusscalar0")
    x = g.mul(x, g.scalar("_mulscalar0_scalar", 0.0078125), name="_mulscalar0")
    x = g.conv(x, 64, 3, 1, 1, bias=False, name="conv0")
    x = g.bn(x, eps=eps, name="bn0")
    x = _prelu(g, x, "relu0")
    units = [3, 13, 30, 3]
    filters = [64, 128, 256, 512]
    for si, (n_units, ch) in enumerate(zip(units, filters)):
        for ui in range(n_units):
            p = f"stage{si + 1}_unit{ui + 1}"
            stride = 2 if ui == 0 else 1
            y = g.bn(x, eps=eps, name=p + "_bn1")
            y = g.conv(y, ch, 3, 1, 1, bias=False, name=p + "_conv1")
            y = g.bn(y, eps=eps, name=p + "_bn2")
            y = _prelu(g, y, p + "_relu1")
            y = g.conv(y, ch, 3, stride, 1, bias=False, name=p + "_conv2", gain=0.2)
            y = g.bn(y, eps=eps, name=p + "_bn3")
            if ui == 0:  # dim_match=False
                sc = g.conv(x, ch, 1, stride, 0, bias=False, name=p + "_conv1sc")
                sc = g.bn(sc, eps=eps, name=p + "_sc")
            else:
                sc = x
            x = g.add(y, sc, name=p + "_plus")
    # fc1 type 'E': BN -> Dropout -> FullyConnected(512) -> BN(fix_gamma)
    x = g.bn(x, eps=eps, name="bn1")
    x = g.dropout(x, name="dropout0")
    x = g.flatten(x, name="pre_fc1_flatten")
    x = g.gemm(x, 512, name="pre_fc1")
    x = g.bn(x, eps=eps, name="fc1", fixed=True)
    g.output(x)
    return g.build()


# --------------------------------------------------------------------------- DUC
def duc_resnet101_hdc(seed: int, size: int = 800, label_num: int = 19, cell_cap: int = 16,
                      aspp_num: int = 4, aspp_stride: int = 6) -> onnx.ModelProto:
    """TuSimple ResNet101_DUC_HDC (Cityscapes, 19 classes, output stride 8), 800x800 input.

    Deep 3x3 stem, ResNet-101 bottlenecks with hybrid dilation rates in groups 4-5, four
    dilated 3x3 ASPP convs (rates 6, 12, 18, 24) summed, Reshape to (N, 19, -1), Softmax.
    ``cell_cap=16`` (19*16 = 304 ASPP channels) reproduces the zoo file's parameter count
    (248.6 MiB); TuSimple's code default of 64 would make the file 2.1x larger.
    """
    g = GraphBuilder("resnet101_duc_hdc", seed,
                     doc="TuSimple ResNet101-DUC-HDC (ONNX Model Zoo layout)")
    x = g.input("data", (3, size, size))
    eps = 1e-5

    def conv_bn(x, ch, k, s=1, p=0, d=1, name="", relu=True, gain=1.0):
        x = g.conv(x, ch, k, s, p, dilation=d, bias=False, name=name, gain=gain)
        x = g.bn(x, eps=eps, name=name + "/bn")
        return g.relu(x, name=name + "/relu") if relu else x

    x = conv_bn(x, 64, 3, 2, 1, name="conv1_1_3x3_s2")
    x = conv_bn(x, 64, 3, 1, 1, name="conv1_2_3x3")
    x = conv_bn(x, 128, 3, 1, 1, name="conv1_3_3x3")
    x = g.maxpool(x, 3, 2, 0, name="pool1_3x3_s2")

    def block(x, a, b, c, dilate, suffix, kind):
        # kind: 'o' projection shortcut, 'x' identity, 'd' downsampling projection
        s = 2 if kind == "d" else 1
        if kind in "od":
            sc = conv_bn(x, c, 1, s, 0, name=f"conv{suffix}_1x1_proj", relu=False)
        else:
            sc = x
        y = conv_bn(x, a, 1, s, 0, name=f"conv{suffix}_1x1_reduce")
        y = conv_bn(y, b, 3, 1, dilate, dilate, name=f"conv{suffix}_3x3")
        y = conv_bn(y, c, 1, 1, 0, name=f"conv{suffix}_1x1_increase", relu=False, gain=0.2)
        out = g.sum([y, sc], name=f"res{suffix}")
        return g.relu(out, name=f"res{suffix}_relu")

    x = block(x, 64, 64, 256, 1, "2_1", "o")
    x = block(x, 64, 64, 256, 1, "2_2", "x")
    x = block(x, 64, 64, 256, 1, "2_3", "x")
    x = block(x, 128, 128, 512, 1, "3_1", "d")
    for i in range(2, 5):
        x = block(x, 128, 128, 512, 1, f"3_{i}", "x")
    x = block(x, 256, 256, 1024, 2, "4_1", "o")
    hdc4 = [2, 5, 9, 1]
    for i in range(2, 24):
        x = block(x, 256, 256, 1024, hdc4[(i - 2) % 4], f"4_{i}", "x")
    x = block(x, 512, 512, 2048, 5, "5_1", "o")
    x = block(x, 512, 512, 2048, 9, "5_2", "x")
    x = block(x, 512, 512, 2048, 17, "5_3", "x")
    aspp = []
    for i in range(aspp_num):
        d = (i + 1) * aspp_stride
        aspp.append(g.conv(x, cell_cap * label_num, 3, 1, d, dilation=d, bias=True,
                           name=f"fc1_cityscapes_c{i}"))
    x = g.sum(aspp, name="fc1_cityscapes")
    n, c, h, w = g.shape(x)
    x = g.reshape(x, [0, label_num, -1], (n, label_num, c // label_num * h * w),
                  name="cls_score_reshape")
    x = g.softmax(x, axis=1, name="seg_loss")
    g.output(x)
    return g.build()

