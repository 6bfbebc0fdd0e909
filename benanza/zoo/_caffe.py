"""BVLC Caffe models as converted Caffe -> Caffe2 -> ONNX for the ONNX Model Zoo (2017-2019):
AlexNet, CaffeNet, R-CNN ILSVRC13, GoogleNet, Inception-v1 and ZFNet-512.

Export conventions reproduced: Conv with bias, LRN, Dropout kept, InnerProduct as Gemm
(transB) preceded by a Reshape to 2-D (here batch-agnostic: shape ``[0, -1]``), Softmax.
Caffe's ceil-mode pooling appears as explicit, possibly asymmetric pads; where the zoo
model pools in floor mode instead, this is noted on the builder.
"""

from __future__ import annotations

import onnx

from ._builder import GraphBuilder


def _fc(g: GraphBuilder, x: str, n: int, name: str) -> str:
    return g.gemm(x, n, name=name)


def _flatten_for_fc(g: GraphBuilder, x: str, name: str) -> str:
    n, c, h, w = g.shape(x)
    return g.reshape(x, [0, -1], (n, c * h * w), name=name)


def _pool(g: GraphBuilder, x: str, k: int, s: int, name: str, caffe_ceil: bool, pad: int = 0,
          op: str = "MaxPool") -> str:
    if caffe_ceil:
        return g.caffe_maxpool(x, k, s, pad, name=name, op=op)
    if op == "MaxPool":
        return g.maxpool(x, k, s, pad, name=name)
    return g.avgpool(x, k, s, pad, name=name)


def alexnet_family(variant: str, seed: int) -> onnx.ModelProto:
    """bvlc_alexnet, bvlc_reference_caffenet, bvlc_reference_rcnn_ilsvrc13 (224x224 input).

    AlexNet normalises before pooling, CaffeNet/R-CNN pool before normalising.  R-CNN has a
    200-way fc-rcnn and no Softmax.  In the zoo's AlexNet the first two pools round down
    (26x26 and 12x12 maps, the paper's 656M MACs) and pool5 carries a [0,0,1,1] pad so that
    fc6 still sees 256x6x6; CaffeNet and R-CNN use Caffe's ceil-mode maps (27, 13, 6).
    """
    g = GraphBuilder(f"bvlc_{variant}", seed, doc=f"BVLC {variant} via Caffe2 (ONNX Model Zoo layout)")
    x = g.input("data_0", (3, 224, 224))
    alex = variant == "alexnet"
    ceil = not alex

    def norm_pool(x, i):
        if alex:
            x = g.lrn(x, 5, 1e-4, 0.75, 1.0, name=f"norm{i}_1")
            return _pool(g, x, 3, 2, f"pool{i}_1", ceil)
        x = _pool(g, x, 3, 2, f"pool{i}_1", ceil)
        return g.lrn(x, 5, 1e-4, 0.75, 1.0, name=f"norm{i}_1")

    x = g.conv(x, 96, 11, 4, 0, name="conv1_1")
    x = g.relu(x, name="conv1_2")
    x = norm_pool(x, 1)
    x = g.conv(x, 256, 5, 1, 2, group=2, name="conv2_1")
    x = g.relu(x, name="conv2_2")
    x = norm_pool(x, 2)
    x = g.conv(x, 384, 3, 1, 1, name="conv3_1")
    x = g.relu(x, name="conv3_2")
    x = g.conv(x, 384, 3, 1, 1, group=2, name="conv4_1")
    x = g.relu(x, name="conv4_2")
    x = g.conv(x, 256, 3, 1, 1, group=2, name="conv5_1")
    x = g.relu(x, name="conv5_2")
    if alex:
        x = g.maxpool(x, 3, 2, [0, 0, 1, 1], name="pool5_1")
    else:
        x = _pool(g, x, 3, 2, "pool5_1", ceil)
    assert g.shape(x)[1:] == (256, 6, 6), g.shape(x)
    x = _flatten_for_fc(g, x, "OC2_DUMMY_0")
    x = _fc(g, x, 4096, "fc6_1")
    x = g.relu(x, name="fc6_2")
    x = g.dropout(x, name="fc6_3")
    x = _fc(g, x, 4096, "fc7_1")
    x = g.relu(x, name="fc7_2")
    x = g.dropout(x, name="fc7_3")
    if variant == "rcnn":
        x = _fc(g, x, 200, "fc-rcnn_1")
    else:
        x = _fc(g, x, 1000, "fc8_1")
        x = g.softmax(x, axis=1, name="prob_1")
    g.output(x)
    return g.build()


_GOOGLENET_INCEPTION = [
    # name, 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj
    ("3a", 64, 96, 128, 16, 32, 32),
    ("3b", 128, 128, 192, 32, 96, 64),
    None,  # pool3
    ("4a", 192, 96, 208, 16, 48, 64),
    ("4b", 160, 112, 224, 24, 64, 64),
    ("4c", 128, 128, 256, 24, 64, 64),
    ("4d", 112, 144, 288, 32, 64, 64),
    ("4e", 256, 160, 320, 32, 128, 128),
    None,  # pool4
    ("5a", 256, 160, 320, 32, 128, 128),
    ("5b", 384, 192, 384, 48, 128, 128),
]


def googlenet(variant: str, seed: int) -> onnx.ModelProto:
    """bvlc_googlenet and Caffe2's inception_v1 (GoogLeNet without the auxiliary heads).

    bvlc_googlenet keeps Caffe's ceil-mode pools (maps 112, 56, 28, 14, 7).  The zoo's
    inception_v1 pools in floor mode (112, 55, 27, 13, 6: the paper's 1.44 GMACs) and its
    7x7 average pool carries pads [0,0,1,1] to reduce the 6x6 map to 1x1.
    """
    ceil = variant == "bvlc_googlenet"
    g = GraphBuilder(variant, seed, doc=f"{variant} via Caffe2 (ONNX Model Zoo layout)")
    x = g.input("data_0", (3, 224, 224))
    x = g.conv(x, 64, 7, 2, 3, name="conv1/7x7_s2_1")
    x = g.relu(x, name="conv1/7x7_s2_2")
    x = _pool(g, x, 3, 2, "pool1/3x3_s2_1", ceil)
    x = g.lrn(x, 5, 1e-4, 0.75, 1.0, name="pool1/norm1_1")
    x = g.conv(x, 64, 1, 1, 0, name="conv2/3x3_reduce_1")
    x = g.relu(x, name="conv2/3x3_reduce_2")
    x = g.conv(x, 192, 3, 1, 1, name="conv2/3x3_1")
    x = g.relu(x, name="conv2/3x3_2")
    x = g.lrn(x, 5, 1e-4, 0.75, 1.0, name="conv2/norm2_1")
    x = _pool(g, x, 3, 2, "pool2/3x3_s2_1", ceil)
    pool_id = 3
    for spec in _GOOGLENET_INCEPTION:
        if spec is None:
            x = _pool(g, x, 3, 2, f"pool{pool_id}/3x3_s2_1", ceil)
            pool_id += 1
            continue
        nm, c1, c3r, c3, c5r, c5, cp = spec
        p = f"inception_{nm}/"
        b1 = g.relu(g.conv(x, c1, 1, name=p + "1x1_1"), name=p + "1x1_2")
        b2 = g.relu(g.conv(x, c3r, 1, name=p + "3x3_reduce_1"), name=p + "3x3_reduce_2")
        b2 = g.relu(g.conv(b2, c3, 3, 1, 1, name=p + "3x3_1"), name=p + "3x3_2")
        b3 = g.relu(g.conv(x, c5r, 1, name=p + "5x5_reduce_1"), name=p + "5x5_reduce_2")
        b3 = g.relu(g.conv(b3, c5, 5, 1, 2, name=p + "5x5_1"), name=p + "5x5_2")
        b4 = g.maxpool(x, 3, 1, 1, name=p + "pool_1")
        b4 = g.relu(g.conv(b4, cp, 1, name=p + "pool_proj_1"), name=p + "pool_proj_2")
        x = g.concat([b1, b2, b3, b4], axis=1, name=p + "output_1")
    if ceil:
        x = g.avgpool(x, 7, 1, 0, name="pool5/7x7_s1_1")
    else:
        x = g.avgpool(x, 7, 1, [0, 0, 1, 1], name="pool5/7x7_s1_1")
    assert g.shape(x)[1:] == (1024, 1, 1), g.shape(x)
    x = g.dropout(x, name="pool5/7x7_s1_2")
    x = _flatten_for_fc(g, x, "OC2_DUMMY_0")
    x = _fc(g, x, 1000, "loss3/classifier_1")
    x = g.softmax(x, axis=1, name="prob_1")
    g.output(x)
    return g.build()


def zfnet512(seed: int, channels=(96, 256, 512, 512, 512), ceil: bool = False,
             fc: int = 4096) -> onnx.ModelProto:
    """Caffe2's zfnet512: ZFNet (7x7/2 and 5x5/2 convs, LRN) with 512-wide conv3-5.

    Exported from a Caffe2-trained net (``gpu_0/`` blob names): no Dropout in the test net,
    floor-mode pools (maps 110, 54, 25, 12, 5), FC as Reshape + Gemm, Softmax.  With conv3-5
    at 512 channels this is the paper's 1.48 GMACs.
    """
    g = GraphBuilder("zfnet512", seed, doc="Caffe2 zfnet512 (ONNX Model Zoo layout)")
    x = g.input("gpu_0/data_0", (3, 224, 224))
    c1, c2, c3, c4, c5 = channels
    x = g.conv(x, c1, 7, 2, 1, name="gpu_0/conv1_1")
    x = g.relu(x, name="gpu_0/conv1_2")
    x = g.lrn(x, 5, 1e-4, 0.75, 1.0, name="gpu_0/norm1_1")
    x = _pool(g, x, 3, 2, "gpu_0/pool1_1", ceil)
    x = g.conv(x, c2, 5, 2, 0, name="gpu_0/conv2_1")
    x = g.relu(x, name="gpu_0/conv2_2")
    x = g.lrn(x, 5, 1e-4, 0.75, 1.0, name="gpu_0/norm2_1")
    x = _pool(g, x, 3, 2, "gpu_0/pool2_1", ceil)
    x = g.relu(g.conv(x, c3, 3, 1, 1, name="gpu_0/conv3_1"), name="gpu_0/conv3_2")
    x = g.relu(g.conv(x, c4, 3, 1, 1, name="gpu_0/conv4_1"), name="gpu_0/conv4_2")
    x = g.relu(g.conv(x, c5, 3, 1, 1, name="gpu_0/conv5_1"), name="gpu_0/conv5_2")
    x = _pool(g, x, 3, 2, "gpu_0/pool5_1", ceil)
    x = _flatten_for_fc(g, x, "OC2_DUMMY_0")
    x = g.relu(_fc(g, x, fc, "gpu_0/fc6_1"), name="gpu_0/fc6_2")
    x = g.relu(_fc(g, x, fc, "gpu_0/fc7_1"), name="gpu_0/fc7_2")
    x = _fc(g, x, 1000, "gpu_0/fc8_1")
    x = g.softmax(x, axis=1, name="gpu_0/softmax_1")
    g.output(x)
    return g.build()
