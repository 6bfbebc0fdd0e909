// RNN/LSTM/GRU through cuDNN's v8-style API (cudnnRNNForward, inference mode), one layer.
#include <string>
#include <vector>

#include "benanza_cudnn/harness.hpp"

namespace benanza::cudnn {
namespace {

cudnnRNNMode_t cell_mode(Cell c) {
  switch (c) {
    case Cell::Lstm: return CUDNN_LSTM;
    case Cell::Gru: return CUDNN_GRU;
    case Cell::RnnTanh: return CUDNN_RNN_TANH;
    case Cell::RnnRelu: return CUDNN_RNN_RELU;
  }
  return CUDNN_LSTM;
}

const char* cell_name(Cell c) {
  switch (c) {
    case Cell::Lstm: return "CUDNN_LSTM";
    // cuDNN's GRU applies the reset gate after the recurrent GEMM: ONNX linear_before_reset=1.
    case Cell::Gru: return "CUDNN_GRU(linear_before_reset=1)";
    case Cell::RnnTanh: return "CUDNN_RNN_TANH";
    case Cell::RnnRelu: return "CUDNN_RNN_RELU";
  }
  return "?";
}

class RnnProblem : public Problem {
 public:
  RnnProblem(const RnnLayer& L, const Variant& v) : lstm_(L.cell == Cell::Lstm) {
    cudnnHandle_t h = cudnn_handle();
    size_t states = 0;
    BZ_CUDNN(cudnnDropoutGetStatesSize(h, &states));
    dropout_states_ = DeviceBuffer(states);
    BZ_CUDNN(cudnnSetDropoutDescriptor(dropout_, h, 0.0f, dropout_states_.get(), states, 0ULL));
    BZ_CUDNN(cudnnSetRNNDescriptor_v8(
        rnn_, CUDNN_RNN_ALGO_STANDARD, cell_mode(L.cell), L.bias ? CUDNN_RNN_DOUBLE_BIAS : CUDNN_RNN_NO_BIAS,
        L.dirs == 2 ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT, cudnn_dtype(v.dtype),
        CUDNN_DATA_FLOAT, cudnn_math(v.math), L.input, L.hidden, L.hidden, 1, dropout_,
        CUDNN_RNN_PADDED_IO_DISABLED));

    // ONNX layout 0 is [seq, batch, features]: cuDNN's packed sequence-major layout.
    std::vector<int> lengths(L.batch, L.seq);
    BZ_CUDNN(cudnnSetRNNDataDescriptor(x_, cudnn_dtype(v.dtype), CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, L.seq,
                                       L.batch, L.input, lengths.data(), nullptr));
    BZ_CUDNN(cudnnSetRNNDataDescriptor(y_, cudnn_dtype(v.dtype), CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, L.seq,
                                       L.batch, L.hidden * L.dirs, lengths.data(), nullptr));
    const int dims[3] = {L.dirs, L.batch, L.hidden};
    const int strides[3] = {L.batch * L.hidden, L.hidden, 1};
    BZ_CUDNN(cudnnSetTensorNdDescriptor(h_, cudnn_dtype(v.dtype), 3, dims, strides));
    dev_lengths_ = DeviceBuffer(lengths.size() * sizeof(int));
    // On the work stream: a plain cudaMemcpy goes to the legacy stream, which does not order
    // against a non-blocking stream. The sync keeps `lengths` alive until the copy is done.
    BZ_CUDA(cudaMemcpyAsync(dev_lengths_.get(), lengths.data(), dev_lengths_.bytes(), cudaMemcpyHostToDevice,
                            stream()));
    BZ_CUDA(cudaStreamSynchronize(stream()));

    size_t weights = 0, work = 0, reserve = 0;
    BZ_CUDNN(cudnnGetRNNWeightSpaceSize(h, rnn_, &weights));
    BZ_CUDNN(cudnnGetRNNTempSpaceSizes(h, rnn_, CUDNN_FWD_MODE_INFERENCE, x_, &work, &reserve));
    weights_ = filled(weights / dtype_size(v.dtype), v.dtype, -0.1f, 0.1f);
    work_ = DeviceBuffer(work);
    reserve_ = DeviceBuffer(reserve);
    workspace_bytes = work + reserve;

    const size_t state = size_t(L.dirs) * L.batch * L.hidden;
    x_buf_ = filled(size_t(L.seq) * L.batch * L.input, v.dtype);
    y_buf_ = filled(size_t(L.seq) * L.batch * L.hidden * L.dirs, v.dtype);
    hx_ = filled(state, v.dtype);
    hy_ = filled(state, v.dtype);
    if (lstm_) {
      cx_ = filled(state, v.dtype);
      cy_ = filled(state, v.dtype);
    }
    implementation = std::string("cudnnRNNForward/") + cell_name(L.cell);
    counters["flops"] = L.work.flops;
    counters["bytes"] = bytes_of(L.work, v);
  }

  void enqueue() override {
    BZ_CUDNN(cudnnRNNForward(cudnn_handle(), rnn_, CUDNN_FWD_MODE_INFERENCE,
                             static_cast<const int32_t*>(dev_lengths_.get()), x_, x_buf_.get(), y_, y_buf_.get(), h_,
                             hx_.get(), hy_.get(), h_, lstm_ ? cx_.get() : nullptr, lstm_ ? cy_.get() : nullptr,
                             weights_.bytes(), weights_.get(), work_.bytes(), work_.get(), reserve_.bytes(),
                             reserve_.get()));
  }

 private:
  bool lstm_;
  DropoutDesc dropout_;
  RnnDesc rnn_;
  RnnDataDesc x_, y_;
  TensorDesc h_;
  DeviceBuffer dropout_states_, dev_lengths_, weights_, work_, reserve_;
  DeviceBuffer x_buf_, y_buf_, hx_, hy_, cx_, cy_;
};

std::unique_ptr<Problem> make_rnn(const RnnLayer& L, const Variant& v) { return std::make_unique<RnnProblem>(L, v); }

}  // namespace

void add_rnn(Registry& r, const RnnLayer* layers, const Variant* variants, size_t count) {
  add_family(r, layers, variants, count, make_rnn);
}

}  // namespace benanza::cudnn
