"""Bounds on what a model may ask for, in a module of its own: the command line states them in
its options' ranges without loading the model processor (and ONNX, NumPy) to start."""

# No library Benanza benchmarks takes more than 12 dims (oneDNN; cuDNN 8) or a dim past int32,
# and a hostile file claiming more (a Reshape target of a million dims) would otherwise keep
# shape inference building symbols for minutes.
MAX_RANK = 32
MAX_DIM = 2**31 - 1
