"""Models of the ONNX Model Zoo exported from MXNet Gluon (2019): ResNet v1/v2, MobileNet-v2,
SqueezeNet 1.1 and VGG16/19 with and without BatchNorm.

Export conventions reproduced: Conv2D(use_bias=False) + BatchNormalization + Relu; Gluon's
``nn.Flatten`` / ``Dense`` become Flatten + Gemm; ReLU6 becomes Clip(0, 6); Dropout is kept.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import onnx

from ._builder import GraphBuilder

_RESNET_SPEC = {
    18: ("basic", [2, 2, 2, 2], [64, 64, 128, 256, 512]),
    34: ("basic", [3, 4, 6, 3], [64, 64, 128, 256, 512]),
    50: ("bottle", [3, 4, 6, 3], [64, 256, 512, 1024, 2048]),
    101: ("bottle", [3, 4, 23, 3], [64, 256, 512, 1024, 2048]),
    152: ("bottle", [3, 8, 36, 3], [64, 256, 512, 1024, 2048]),
}


RES_GAIN = 0.2  # weight gain of the last conv of a residual branch (keeps random nets tame)


def _conv_bn(g: GraphBuilder, x: str, ch: int, k: int, s: int, p: int, prefix: str, idx: list,
             relu: bool, gain: float = 1.0, bias: bool = False) -> str:
    x = g.conv(x, ch, k, s, p, bias=bias, name=f"{prefix}conv{idx[0]}_fwd", gain=gain)
    x = g.bn(x, eps=1e-5, name=f"{prefix}batchnorm{idx[1]}_fwd")
    idx[0] += 1
    idx[1] += 1
    if relu:
        x = g.relu(x, name=f"{prefix}relu{idx[2]}_fwd")
        idx[2] += 1
    return x


def _resnet_blocks(layers: Sequence[int], channels: Sequence[int]
                   ) -> Iterator[tuple[int, int, int, int, bool]]:
    """(stage, block, stride, out_channels, downsample) of every residual block, in order."""
    in_ch = channels[0]
    for si, n_blocks in enumerate(layers):
        out_ch = channels[si + 1]
        for bi in range(n_blocks):
            stride = 2 if si > 0 and bi == 0 else 1
            yield si, bi, stride, out_ch, bi == 0 and out_ch != in_ch
            in_ch = out_ch


def resnet_v1(depth: int, seed: int) -> onnx.ModelProto:
    """Gluon ResNetV1 (stride on the first 1x1 of the bottleneck, as in MXNet's resnet*_v1).

    Conv layers have no bias except the bottleneck's two 1x1 convs (Gluon's BottleneckV1 does
    not pass ``use_bias=False`` to them): the paper's Conv->Bias fusion candidates.
    """
    kind, layers, channels = _RESNET_SPEC[depth]
    g = GraphBuilder(f"resnet{depth}_v1", seed, doc=f"Gluon resnet{depth}_v1 (ONNX Model Zoo layout)")
    x = g.input("data", (3, 224, 224))
    pre = "resnetv1_"
    x = g.conv(x, 64, 7, 2, 3, bias=False, name=pre + "conv0_fwd")
    x = g.bn(x, name=pre + "batchnorm0_fwd")
    x = g.relu(x, name=pre + "relu0_fwd")
    x = g.maxpool(x, 3, 2, 1, name=pre + "pool0_fwd")
    for si, bi, stride, out_ch, downsample in _resnet_blocks(layers, channels):
        p = f"{pre}stage{si + 1}_"
        idx = [bi * 10, bi * 10, bi * 10]
        residual = x
        if kind == "basic":
            y = _conv_bn(g, x, out_ch, 3, stride, 1, p, idx, relu=True)
            y = _conv_bn(g, y, out_ch, 3, 1, 1, p, idx, relu=False, gain=RES_GAIN)
        else:
            # Gluon's BottleneckV1 leaves use_bias at its default (True) on its two 1x1
            # convs; only the 3x3 and the downsample conv are bias-free.
            mid = out_ch // 4
            y = _conv_bn(g, x, mid, 1, stride, 0, p, idx, relu=True, bias=True)
            y = _conv_bn(g, y, mid, 3, 1, 1, p, idx, relu=True)
            y = _conv_bn(g, y, out_ch, 1, 1, 0, p, idx, relu=False, gain=RES_GAIN, bias=True)
        if downsample:
            residual = _conv_bn(g, x, out_ch, 1, stride, 0, p, idx, relu=False)
        x = g.add(y, residual, name=f"{p}plus{bi}")
        x = g.relu(x, name=f"{p}activation{bi}")
    x = g.global_avgpool(x, name=pre + "pool1_fwd")
    x = g.flatten(x, name="flatten")
    x = g.gemm(x, 1000, name=pre + "dense0_fwd")
    g.output(x)
    return g.build()


def resnet_v2(depth: int, seed: int) -> onnx.ModelProto:
    """Gluon ResNetV2 (pre-activation; stride on the 3x3 of the bottleneck)."""
    kind, layers, channels = _RESNET_SPEC[depth]
    g = GraphBuilder(f"resnet{depth}_v2", seed, doc=f"Gluon resnet{depth}_v2 (ONNX Model Zoo layout)")
    x = g.input("data", (3, 224, 224))
    pre = "resnetv2_"
    x = g.bn(x, name=pre + "batchnorm0_fwd", fixed=True)  # BatchNorm(scale=False, center=False)
    x = g.conv(x, 64, 7, 2, 3, bias=False, name=pre + "conv0_fwd")
    x = g.bn(x, name=pre + "batchnorm1_fwd")
    x = g.relu(x, name=pre + "relu0_fwd")
    x = g.maxpool(x, 3, 2, 1, name=pre + "pool0_fwd")
    for si, bi, stride, out_ch, downsample in _resnet_blocks(layers, channels):
        p = f"{pre}stage{si + 1}_"
        k = bi * 10
        residual = x
        act = g.relu(g.bn(x, name=f"{p}batchnorm{k}_fwd"), name=f"{p}activation{k}")
        if downsample:
            residual = g.conv(act, out_ch, 1, stride, 0, bias=False, name=f"{p}conv{k + 9}_fwd")
        if kind == "basic":
            y = g.conv(act, out_ch, 3, stride, 1, bias=False, name=f"{p}conv{k}_fwd")
            y = g.relu(g.bn(y, name=f"{p}batchnorm{k + 1}_fwd"), name=f"{p}activation{k + 1}")
            y = g.conv(y, out_ch, 3, 1, 1, bias=False, name=f"{p}conv{k + 1}_fwd", gain=RES_GAIN)
        else:
            mid = out_ch // 4
            y = g.conv(act, mid, 1, 1, 0, bias=False, name=f"{p}conv{k}_fwd")
            y = g.relu(g.bn(y, name=f"{p}batchnorm{k + 1}_fwd"), name=f"{p}activation{k + 1}")
            y = g.conv(y, mid, 3, stride, 1, bias=False, name=f"{p}conv{k + 1}_fwd")
            y = g.relu(g.bn(y, name=f"{p}batchnorm{k + 2}_fwd"), name=f"{p}activation{k + 2}")
            y = g.conv(y, out_ch, 1, 1, 0, bias=False, name=f"{p}conv{k + 2}_fwd", gain=RES_GAIN)
        x = g.add(y, residual, name=f"{p}plus{bi}")
    x = g.bn(x, name=pre + "batchnorm2_fwd")
    x = g.relu(x, name=pre + "relu1_fwd")
    x = g.global_avgpool(x, name=pre + "pool1_fwd")
    x = g.flatten(x, name=pre + "flatten0_flatten0")
    x = g.gemm(x, 1000, name=pre + "dense0_fwd")
    g.output(x)
    return g.build()


def mobilenet_v2(seed: int, multiplier: float = 1.0) -> onnx.ModelProto:
    """Gluon mobilenetv2_1.0: every LinearBottleneck has an expansion 1x1 (even with t=1)."""
    g = GraphBuilder("mobilenetv2_1.0", seed, doc="Gluon mobilenetv2_1.0 (ONNX Model Zoo layout)")
    x = g.input("data", (3, 224, 224))
    pre = "mobilenetv20_"
    counter = {"conv": 0, "bn": 0, "relu6": 0}

    def conv_unit(x, ch, k=1, s=1, p=0, group=1, act=True, prefix=pre + "features_"):
        x = g.conv(x, ch, k, s, p, group=group, bias=False, name=f"{prefix}conv{counter['conv']}_fwd")
        x = g.bn(x, name=f"{prefix}batchnorm{counter['bn']}_fwd")
        counter["conv"] += 1
        counter["bn"] += 1
        if act:
            x = g.clip(x, 0.0, 6.0, name=f"{prefix}relu6{counter['relu6']}_fwd")
            counter["relu6"] += 1
        return x

    x = conv_unit(x, int(32 * multiplier), 3, 2, 1)
    in_group = [int(c * multiplier) for c in [32] + [16] + [24] * 2 + [32] * 3 + [64] * 4 + [96] * 3
                + [160] * 3]
    out_group = [int(c * multiplier) for c in [16] + [24] * 2 + [32] * 3 + [64] * 4 + [96] * 3
                 + [160] * 3 + [320]]
    ts = [1] + [6] * 16
    strides = [1, 2] * 2 + [1, 1, 2] + [1] * 6 + [2] + [1] * 3
    for i, (cin, cout, t, s) in enumerate(zip(in_group, out_group, ts, strides)):
        bp = f"{pre}features_linearbottleneck{i}_"
        y = conv_unit(x, cin * t, prefix=bp)
        y = conv_unit(y, cin * t, 3, s, 1, group=cin * t, prefix=bp)
        y = conv_unit(y, cout, act=False, prefix=bp)
        if s == 1 and cin == cout:
            y = g.add(y, x, name=bp + "elemwise_add0")
        x = y
    last = int(1280 * multiplier) if multiplier > 1.0 else 1280
    x = conv_unit(x, last)
    x = g.global_avgpool(x, name=pre + "features_pool0_fwd")
    x = g.conv(x, 1000, 1, bias=False, name=pre + "output_pred_fwd")
    x = g.flatten(x, name=pre + "output_flatten0_flatten0")
    g.output(x)
    return g.build()


def squeezenet_1_1(seed: int) -> onnx.ModelProto:
    """Gluon squeezenet1.1."""
    g = GraphBuilder("squeezenet1.1", seed, doc="Gluon squeezenet1.1 (ONNX Model Zoo layout)")
    x = g.input("data", (3, 224, 224))
    pre = "squeezenet0_"
    n = {"conv": 0, "relu": 0, "pool": 0, "concat": 0}

    def conv_relu(x, ch, k, s=1, p=0):
        x = g.conv(x, ch, k, s, p, name=f"{pre}conv{n['conv']}_fwd")
        n["conv"] += 1
        x = g.relu(x, name=f"{pre}relu{n['relu']}_fwd")
        n["relu"] += 1
        return x

    def pool(x):
        # MaxPool2D(3, 2, ceil_mode=True); the feature maps (111, 55, 27) divide exactly.
        x = g.maxpool(x, 3, 2, 0, name=f"{pre}pool{n['pool']}_fwd")
        n["pool"] += 1
        return x

    def fire(x, squeeze, e1, e3):
        s = conv_relu(x, squeeze, 1)
        a = conv_relu(s, e1, 1)
        b = conv_relu(s, e3, 3, 1, 1)
        out = g.concat([a, b], axis=1, name=f"{pre}concat{n['concat']}")
        n["concat"] += 1
        return out

    x = conv_relu(x, 64, 3, 2)
    x = pool(x)
    x = fire(x, 16, 64, 64)
    x = fire(x, 16, 64, 64)
    x = pool(x)
    x = fire(x, 32, 128, 128)
    x = fire(x, 32, 128, 128)
    x = pool(x)
    x = fire(x, 48, 192, 192)
    x = fire(x, 48, 192, 192)
    x = fire(x, 64, 256, 256)
    x = fire(x, 64, 256, 256)
    x = g.dropout(x, name=pre + "dropout0_fwd")
    x = conv_relu(x, 1000, 1)
    x = g.avgpool(x, 13, 13, name=f"{pre}pool3_fwd")
    x = g.flatten(x, name=pre + "flatten0_flatten0")
    g.output(x)
    return g.build()


_VGG_CFG = {
    16: [2, 2, 3, 3, 3],
    19: [2, 2, 4, 4, 4],
}


def vgg(depth: int, batch_norm: bool, seed: int) -> onnx.ModelProto:
    """Gluon vgg16/vgg19 (and *_bn): each Dense exports as Flatten + Gemm."""
    name = f"vgg{depth}{'_bn' if batch_norm else ''}"
    g = GraphBuilder(name, seed, doc=f"Gluon {name} (ONNX Model Zoo layout)")
    x = g.input("data", (3, 224, 224))
    pre = "vgg0_"
    ci = 0
    for stage, (n_conv, ch) in enumerate(zip(_VGG_CFG[depth], [64, 128, 256, 512, 512])):
        for _ in range(n_conv):
            x = g.conv(x, ch, 3, 1, 1, name=f"{pre}conv{ci}_fwd")
            if batch_norm:
                x = g.bn(x, name=f"{pre}batchnorm{ci}_fwd")
            x = g.relu(x, name=f"{pre}relu{ci}_fwd")
            ci += 1
        x = g.maxpool(x, 2, 2, name=f"{pre}pool{stage}_fwd")
    for i in range(2):
        x = g.flatten(x, name=f"{pre}dense{i}_flatten")
        x = g.gemm(x, 4096, name=f"{pre}dense{i}_fwd")
        x = g.relu(x, name=f"{pre}dense{i}_relu_fwd")
        x = g.dropout(x, name=f"{pre}dropout{i}_fwd")
    x = g.flatten(x, name=f"{pre}dense2_flatten")
    x = g.gemm(x, 1000, name=f"{pre}dense2_fwd")
    g.output(x)
    return g.build()
