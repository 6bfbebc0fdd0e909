"""The work each layer reports (FLOPs, docs/generate.md "Work"), against counts recomputed from the arrays
ONNX Runtime produces for the real layers: the shapes of what the op actually read and wrote."""

import numpy as np
import onnxruntime as ort
from helpers import io, model, tensor
from onnx import helper, numpy_helper

from benanza.processor import load_model


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def work_model():
    n = helper.make_node
    nodes = [
        n("ReduceMean", ["r"], ["rm"], axes=[1, 2], keepdims=0, name="mean"),  # 392 elements → 8
        n("ReduceMax", ["r"], ["rx"], axes=[2], keepdims=1, name="max"),
        n("ReduceL2", ["r"], ["l2"], axes=[0], keepdims=0, name="l2"),
        n("MaxPool", ["img"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], name="maxpool"),
        n("AveragePool", ["img"], ["ap"], kernel_shape=[2, 2], strides=[2, 2], name="avgpool"),
        n("GlobalAveragePool", ["img"], ["gap"], name="gap"),
        n("Conv", ["img", "w", "b"], ["cv"], pads=[1, 1, 1, 1], group=2, name="conv"),
        n("Softmax", ["x"], ["sm"], axis=-1, name="softmax"),
        n("LayerNormalization", ["x", "g", "bb"], ["ln"], axis=-1, name="lnorm"),
        n("LayerNormalization", ["x", "g2"], ["ln2"], axis=1, name="lnorm_nobias"),
        n("Gemm", ["a", "wb", "c"], ["gm"], transB=1, beta=0.5, name="gemm"),
        n("MatMul", ["x", "wm"], ["mm"], name="matmul"),
        n("Relu", ["x"], ["re"], name="relu"),
        n("Sum", ["x", "x", "x"], ["s3"], name="sum3"),
        n("Transpose", ["x"], ["tr"], perm=[0, 2, 1], name="transpose"),
        n("Slice", ["x", "st", "en", "ax"], ["sl"], name="slice"),
        n("Concat", ["x", "x"], ["cc"], axis=1, name="concat"),
        n("Reshape", ["x", "shp"], ["rs"], name="reshape"),
    ]
    inits = [tensor("w", (6, 2, 3, 3)), tensor("b", (6,)), tensor("g", (32,)), tensor("bb", (32,)),
             tensor("g2", (16, 32)), tensor("wb", (12, 20)), tensor("c", (12,)), tensor("wm", (32, 24)),
             _i64("st", [2]), _i64("en", [10]), _i64("ax", [1]), _i64("shp", [2, 512])]
    ins = [io("r", [8, 7, 7]), io("img", [1, 4, 9, 9]), io("x", [2, 16, 32]), io("a", [5, 20])]
    outs = [io(t, None) for t in ("rm", "rx", "l2", "mp", "ap", "gap", "cv", "sm", "ln", "ln2", "gm", "mm", "re",
                                  "s3", "tr", "sl", "cc", "rs")]
    return model(nodes, ins, outs, inits, opset=17)


def test_flops_count_the_work_of_the_real_layers(save):
    path = save(work_model())
    layers = {n.name: n.layer for n in load_model(path).nodes}
    sess = ort.InferenceSession(path.read_bytes(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in sess.get_inputs()}
    out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    r, x, a = feeds["r"], feeds["x"], feeds["a"]
    rows = x.size // x.shape[-1]
    want = {
        # reductions read every input element once; mean divides per output, L2 squares and roots
        "mean": r.size + out["rm"].size,
        "max": r.size,
        "l2": 2 * r.size + out["l2"].size,
        # pooling: each output reads its window; average divides once more
        "maxpool": out["mp"].size * 9,
        "avgpool": out["ap"].size * 4 + out["ap"].size,
        "gap": out["gap"].size * 81 + out["gap"].size,
        # conv: 2 per multiply-add (2 input channels per group × 3×3 taps per output) + the bias add
        "conv": 2 * out["cv"].size * 2 * 9 + out["cv"].size,
        "softmax": 5 * x.size,
        "lnorm": 7 * x.size + 4 * rows,
        "lnorm_nobias": 6 * x.size + 4 * x.shape[0],
        # 2·m·n·k, C's add and beta's multiply
        "gemm": 2 * out["gm"].size * a.shape[1] + 2 * out["gm"].size,
        "matmul": 2 * out["mm"].size * x.shape[-1],
        "relu": out["re"].size,
        "sum3": 2 * out["s3"].size,
        # data movement and views compute nothing
        "transpose": 0, "slice": 0, "concat": 0, "reshape": 0,
    }
    assert {k: layers[k].flops for k in want} == want
    assert layers["mean"].flops == 392 + 8  # not the 8 outputs alone
    # copies still report the bytes they move (read and written)
    assert layers["transpose"].bytes == 2 * x.nbytes
    assert layers["slice"].bytes >= 2 * out["sl"].nbytes
