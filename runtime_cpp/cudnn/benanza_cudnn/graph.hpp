// The cuDNN graph API families (graph.cpp): what main.cpp needs of them besides registration.
#pragma once

namespace benanza::cudnn {

// `--benanza_check_graphs=SM`: builds and validates the cudnn_frontend graph of every graph
// layer and data type of this binary for compute capability SM (e.g. 90) without touching a
// GPU, and prints one `BENANZA_GRAPH {"name": first variant, "ok": ..., "message": ...}` line
// each. Validation is the frontend's own support check (data types, head dims, shapes); engine
// configs and plans need the device and are only built by the benchmarks. Returns the exit code.
int check_graphs(int sm_version);

}  // namespace benanza::cudnn
