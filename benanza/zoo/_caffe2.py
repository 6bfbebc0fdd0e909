"""Models the ONNX Model Zoo converted from Caffe2 (2018-2019): Inception-v2 (BN-Inception),
DenseNet-121 and ShuffleNet (v1).

Export conventions reproduced:

* Caffe BN layers translated to Caffe2 as SpatialBN followed by a Scale (broadcast Mul and Add
  with ``axis=1``); the Caffe2 -> ONNX frontend turned each legacy-broadcast operand into an
  ``Unsqueeze`` of the parameter, so every BN is BatchNormalization, Unsqueeze, Mul,
  Unsqueeze, Add.  This is where Inception-v2's many Unsqueeze layers (27%) come from.
* Caffe's ceil-mode pooling as explicit, possibly asymmetric pads.
* FC as Reshape-to-2D + Gemm (transB).
* Caffe2's ChannelShuffle as Reshape -> Transpose -> Reshape.
"""

from __future__ import annotations

import onnx

from ._builder import GraphBuilder


def _bn_scale(g: GraphBuilder, x: str, name: str, eps: float = 1e-5) -> str:
    """Caffe BatchNorm + Scale as exported by Caffe2: BN, Unsqueeze, Mul, Unsqueeze, Add."""
    c = g.channels(x)
    y = g.bn(x, eps=eps, name=name + "_bn")
    gamma = g.random(name + "_scale_w", (c,), std=0.05, mean=1.0)
    beta = g.random(name + "_scale_b", (c,), std=0.05)
    gu = g.unsqueeze(gamma, [1, 2], name=name + "_scale_w_unsqueezed")
    y = g.mul(y, gu, name=name + "_scale_mul")
    bu = g.unsqueeze(beta, [1, 2], name=name + "_scale_b_unsqueezed")
    return g.add(y, bu, name=name + "_scale_add")


# --------------------------------------------------------------------------- Inception-v2
_BN_INCEPTION = [
    # name, 1x1, 3x3 reduce, 3x3, double reduce, double 3x3, pool type, pool proj (0: none), stride
    ("3a", 64, 64, 64, 64, 96, "avg", 32, 1),
    ("3b", 64, 64, 96, 64, 96, "avg", 64, 1),
    ("3c", 0, 128, 160, 64, 96, "max", 0, 2),
    ("4a", 224, 64, 96, 96, 128, "avg", 128, 1),
    ("4b", 192, 96, 128, 96, 128, "avg", 128, 1),
    ("4c", 160, 128, 160, 128, 160, "avg", 128, 1),
    ("4d", 96, 128, 192, 160, 192, "avg", 128, 1),
    ("4e", 0, 128, 192, 192, 256, "max", 0, 2),
    ("5a", 352, 192, 320, 160, 224, "avg", 128, 1),
    ("5b", 352, 192, 320, 192, 224, "max", 128, 1),
]


def inception_v2(seed: int) -> onnx.ModelProto:
    """Caffe2 inception_v2 = BN-Inception (Ioffe & Szegedy), every conv followed by BN+Scale+ReLU."""
    g = GraphBuilder("inception_v2", seed, doc="Caffe2 inception_v2 / BN-Inception (ONNX Model Zoo layout)")
    x = g.input("data_0", (3, 224, 224))

    def cbr(x, ch, k, s=1, p=0, name=""):
        x = g.conv(x, ch, k, s, p, name=name + "_1")
        x = _bn_scale(g, x, name)
        return g.relu(x, name=name + "_relu")

    x = cbr(x, 64, 7, 2, 3, "conv1/7x7_s2")
    x = g.caffe_maxpool(x, 3, 2, name="pool1/3x3_s2_1")
    x = cbr(x, 64, 1, name="conv2/3x3_reduce")
    x = cbr(x, 192, 3, 1, 1, name="conv2/3x3")
    x = g.caffe_maxpool(x, 3, 2, name="pool2/3x3_s2_1")
    for nm, c1, c3r, c3, cdr, cd, pool, cp, s in _BN_INCEPTION:
        p = f"inception_{nm}/"
        branches = []
        if c1:
            branches.append(cbr(x, c1, 1, name=p + "1x1"))
        b = cbr(x, c3r, 1, name=p + "3x3_reduce")
        branches.append(cbr(b, c3, 3, s, 1, name=p + "3x3"))
        b = cbr(x, cdr, 1, name=p + "double_3x3_reduce")
        b = cbr(b, cd, 3, 1, 1, name=p + "double_3x3_1")
        branches.append(cbr(b, cd, 3, s, 1, name=p + "double_3x3_2"))
        if s == 2:
            branches.append(g.caffe_maxpool(x, 3, 2, name=p + "pool_1"))
        else:
            op = "AveragePool" if pool == "avg" else "MaxPool"
            b = g.caffe_maxpool(x, 3, 1, 1, name=p + "pool_1", op=op)
            branches.append(cbr(b, cp, 1, name=p + "pool_proj"))
        x = g.concat(branches, axis=1, name=p + "output_1")
    x = g.avgpool(x, 7, 1, 0, name="pool5/7x7_s1_1")
    n, c = g.shape(x)[:2]
    x = g.reshape(x, [0, -1], (n, c), name="OC2_DUMMY_0")
    x = g.gemm(x, 1000, name="loss3/classifier_1")
    x = g.softmax(x, axis=1, name="prob_1")
    g.output(x)
    return g.build()


# --------------------------------------------------------------------------- DenseNet-121
def densenet121(seed: int, ceil_pool1: bool = False) -> onnx.ModelProto:
    """Caffe2 densenet121 (converted from the Caffe DenseNet-121 by Shicai Yang).

    Every BN is BN+Scale (five ONNX nodes), convolutions have no bias except fc6, the
    classifier is a 1x1 convolution on the globally pooled features (no Softmax).
    """
    g = GraphBuilder("densenet121", seed, doc="Caffe2 densenet121 (ONNX Model Zoo layout)")
    x = g.input("data_0", (3, 224, 224))
    x = g.conv(x, 64, 7, 2, 3, bias=False, name="conv1_1")
    x = g.relu(_bn_scale(g, x, "conv1"), name="relu1_1")
    if ceil_pool1:
        x = g.caffe_maxpool(x, 3, 2, 1, name="pool1_1")
    else:
        x = g.maxpool(x, 3, 2, 1, name="pool1_1")
    growth, bottleneck = 32, 128
    blocks = [6, 12, 24, 16]
    for bi, n_layers in enumerate(blocks):
        stage = bi + 2
        for li in range(n_layers):
            p = f"conv{stage}_{li + 1}"
            y = g.relu(_bn_scale(g, x, p + "/x1"), name=p + "/x1/relu")
            y = g.conv(y, bottleneck, 1, bias=False, name=p + "/x1_1")
            y = g.relu(_bn_scale(g, y, p + "/x2"), name=p + "/x2/relu")
            y = g.conv(y, growth, 3, 1, 1, bias=False, name=p + "/x2_1")
            x = g.concat([x, y], axis=1, name=f"concat_{stage}_{li + 1}")
        if bi < len(blocks) - 1:
            p = f"conv{stage}_blk"
            x = g.relu(_bn_scale(g, x, p), name=p + "/relu")
            x = g.conv(x, g.channels(x) // 2, 1, bias=False, name=p + "_1")
            x = g.caffe_maxpool(x, 2, 2, name=f"pool{stage}_1", op="AveragePool")
    x = g.relu(_bn_scale(g, x, "conv5_blk"), name="conv5_blk/relu")
    x = g.global_avgpool(x, name="pool5_1")
    x = g.conv(x, 1000, 1, bias=True, name="fc6_1")
    g.output(x)
    return g.build()


# --------------------------------------------------------------------------- ShuffleNet
def shufflenet(seed: int, groups: int = 3, out_channels=(240, 480, 960), repeats=(4, 8, 4)
               ) -> onnx.ModelProto:
    """Caffe2 ShuffleNet v1 1x, g=3 (Zhang et al.): grouped 1x1 convs, channel shuffle,
    depthwise 3x3.

    The bottleneck width is a quarter of the unit's residual-branch output (so 54, 60 and 120
    in the stride-2 units, as in the widely used Caffe ShuffleNet), and the first 1x1 of the
    network (24 input channels) is not grouped; this gives the paper's 127M MACs.  Stride-1
    units end in Add + Relu, stride-2 units concatenate a 3x3 average-pooled shortcut and
    apply Relu.  The classifier is 7x7 average pooling, Reshape, Gemm, Softmax.
    """
    g = GraphBuilder("shufflenet", seed, doc="Caffe2 ShuffleNet v1 (ONNX Model Zoo layout)")
    x = g.input("gpu_0/data_0", (3, 224, 224))
    x = g.conv(x, 24, 3, 2, 1, bias=False, name="gpu_0/conv1_1")
    x = g.relu(g.bn(x, name="gpu_0/conv1_spatbn_1"), name="gpu_0/conv1_relu")
    x = g.maxpool(x, 3, 2, 1, name="gpu_0/pool1_1")
    in_ch = 24
    unit = 0
    for si, (oc, reps) in enumerate(zip(out_channels, repeats)):
        for r in range(reps):
            stride = 2 if r == 0 else 1
            p = f"gpu_0/gconv{unit}"
            unit += 1
            out = oc - in_ch if stride == 2 else oc
            mid = out // 4
            g1 = groups if (si > 0 or r > 0) else 1
            y = g.conv(x, mid, 1, bias=False, group=g1, name=p + "_1x1a")
            y = g.relu(g.bn(y, name=p + "_1x1a_bn"), name=p + "_1x1a_relu")
            n, c, h, w = g.shape(y)
            y = g.reshape(y, [0, groups, c // groups, h, w], (n, groups, c // groups, h, w),
                          name=p + "_shuffle_reshape1")
            y = g.transpose(y, [0, 2, 1, 3, 4], name=p + "_shuffle_transpose")
            y = g.reshape(y, [0, c, h, w], (n, c, h, w), name=p + "_shuffle_reshape2")
            y = g.conv(y, mid, 3, stride, 1, group=mid, bias=False, name=p + "_3x3dw")
            y = g.bn(y, name=p + "_3x3dw_bn")
            y = g.conv(y, out, 1, group=groups, bias=False, name=p + "_1x1b")
            y = g.bn(y, name=p + "_1x1b_bn")
            if stride == 2:
                sc = g.avgpool(x, 3, 2, 1, name=p + "_shortcut_pool")
                x = g.relu(g.concat([sc, y], axis=1, name=p + "_concat"), name=p + "_relu")
            else:
                x = g.relu(g.add(y, x, name=p + "_sum"), name=p + "_relu")
            in_ch = oc
    x = g.avgpool(x, 7, 1, 0, name="gpu_0/final_avg_1")
    n, c = g.shape(x)[:2]
    x = g.reshape(x, [0, -1], (n, c), name="gpu_0/final_avg_reshaped")
    x = g.gemm(x, 1000, name="gpu_0/last_out_L1000_1")
    x = g.softmax(x, axis=1, name="gpu_0/softmax_1")
    g.output(x)
    return g.build()
