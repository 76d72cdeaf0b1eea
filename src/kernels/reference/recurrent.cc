// Reference kernels of RNN, GRU and LSTM (schemas and shapes: src/ops/recurrent.cc; ONNX's equations, gate order
// RNN: -, GRU: z r h, LSTM: i o f c; peepholes P: i o f).
//
// Per direction, the input projection X·W^T (+ the biases that add straight onto it) is computed for every step at
// once, as one [S*N, I] x [I, G*H] product; the recurrence then runs per batch item (items are independent), over
// that item's own sequence length, so reverse directions start at each item's last valid step. Steps past an item's
// length leave zeros in Y; Y_h / Y_c hold the state after the item's last processed step.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/reference/reference.h"
#include "ops/op_registry.h"
#include "ops/recurrent.h"

namespace osprey {
namespace {

float Dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t k = 0; k < n; ++k) sum += a[k] * b[k];
  return sum;
}

// c[m, n] = a[m, :] · b[n, :] + bias[n] for m < rows, n < cols: rows of `a` and `b` are `depth` long. Blocked over
// rows of both so a block of `b` stays in cache while a block of `a` passes over it.
void MatMulTransB(const float* a, const float* b, const float* bias, float* c, int64_t rows, int64_t cols,
                  int64_t depth) {
  constexpr int64_t kRowBlock = 16, kColBlock = 64;
  const int64_t row_blocks = (rows + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static) if (static_cast<double>(rows) * cols * depth >= 1e6)
  for (int64_t rb = 0; rb < row_blocks; ++rb) {
    const int64_t r_end = std::min(rows, (rb + 1) * kRowBlock);
    for (int64_t c0 = 0; c0 < cols; c0 += kColBlock) {
      const int64_t c_end = std::min(cols, c0 + kColBlock);
      for (int64_t m = rb * kRowBlock; m < r_end; ++m)
        for (int64_t n = c0; n < c_end; ++n) c[m * cols + n] = Dot(a + m * depth, b + n * depth, depth) + bias[n];
    }
  }
}

struct Dims {
  int64_t seq, batch, input, hidden, dirs;
  int64_t layout;
  // Offsets (in floats) of step t, item b, direction d in X's rows, Y, and the state tensors.
  int64_t XRow(int64_t t, int64_t b) const { return layout == 0 ? t * batch + b : b * seq + t; }
  int64_t YOffset(int64_t t, int64_t d, int64_t b) const {
    return (layout == 0 ? (t * dirs + d) * batch + b : (b * seq + t) * dirs + d) * hidden;
  }
  int64_t StateOffset(int64_t d, int64_t b) const { return (layout == 0 ? d * batch + b : b * dirs + d) * hidden; }
};

float Clip(float x, float clip) { return clip > 0.f ? std::min(std::max(x, -clip), clip) : x; }

void RecurrentKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const RecurrentSpec spec = ParseRecurrentSpec(node);
  const bool gru = node.op_type == "GRU", lstm = node.op_type == "LSTM";
  const Tensor& x = ctx.In(0);
  const Tensor& w = ctx.In(1);
  const Tensor& r = ctx.In(2);
  Dims dims;
  dims.layout = spec.layout;
  dims.seq = spec.layout == 0 ? x.dim(0) : x.dim(1);
  dims.batch = spec.layout == 0 ? x.dim(1) : x.dim(0);
  dims.input = x.dim(2);
  dims.dirs = spec.num_directions;
  const int64_t gh = w.dim(1), hidden = gh / spec.gates;
  dims.hidden = hidden;
  const int64_t seq = dims.seq, batch = dims.batch;

  std::vector<int64_t> lengths(static_cast<size_t>(batch), seq);
  if (ctx.HasIn(4)) {
    const Tensor& lens = ctx.In(4);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t len = lens.dtype() == DType::kI32 ? lens.data<int32_t>()[b] : lens.data<int64_t>()[b];
      if (len < 0 || len > seq)
        throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": sequence_lens[" + std::to_string(b) + "] is " +
                                                     std::to_string(len) + ", expected 0.." + std::to_string(seq));
      lengths[static_cast<size_t>(b)] = len;
    }
  }

  const int num_outputs = static_cast<int>(ctx.outputs.size());
  float* y = num_outputs > 0 && ctx.outputs[0] ? ctx.Out(0).data<float>() : nullptr;
  float* y_h = num_outputs > 1 && ctx.outputs[1] ? ctx.Out(1).data<float>() : nullptr;
  float* y_c = lstm && num_outputs > 2 && ctx.outputs[2] ? ctx.Out(2).data<float>() : nullptr;
  if (y) std::fill(y, y + ctx.Out(0).numel(), 0.f);

  // Work space: the input projection of every step of one direction, and per-item scratch for the step's gates.
  const int64_t rows = seq * batch;
  Tensor projection(DType::kF32, Shape{rows, gh});
  float* xw = projection.data<float>();
  std::vector<float> input_bias(static_cast<size_t>(gh));

  for (int64_t d = 0; d < dims.dirs; ++d) {
    const float* wd = w.data<float>() + d * gh * dims.input;
    const float* rd = r.data<float>() + d * gh * hidden;
    const float* wb = ctx.HasIn(3) ? ctx.In(3).data<float>() + d * 2 * gh : nullptr;
    const float* rb = wb ? wb + gh : nullptr;
    const float* peep = lstm && ctx.HasIn(7) ? ctx.In(7).data<float>() + d * 3 * hidden : nullptr;
    // Biases that add onto X·W^T directly: Wb + Rb, except GRU's Rbh with linear_before_reset (it is scaled by r).
    for (int64_t g = 0; g < gh; ++g) {
      float bias = wb ? wb[g] : 0.f;
      const bool inside_reset = gru && spec.linear_before_reset && g >= 2 * hidden;
      if (rb && !inside_reset) bias += rb[g];
      input_bias[static_cast<size_t>(g)] = bias;
    }
    MatMulTransB(x.data<float>(), wd, input_bias.data(), xw, rows, gh, dims.input);
    const bool reverse = spec.reverse || d == 1;

#pragma omp parallel for schedule(static) if (batch > 1 && seq * gh * hidden >= (int64_t{1} << 16))
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<float> h(static_cast<size_t>(hidden), 0.f), c(static_cast<size_t>(hidden), 0.f);
      std::vector<float> gates(static_cast<size_t>(gh)), scratch(static_cast<size_t>(hidden));
      const int64_t state = dims.StateOffset(d, b);
      if (ctx.HasIn(5)) std::copy_n(ctx.In(5).data<float>() + state, hidden, h.data());
      if (lstm && ctx.HasIn(6)) std::copy_n(ctx.In(6).data<float>() + state, hidden, c.data());
      const int64_t len = lengths[static_cast<size_t>(b)];
      for (int64_t step = 0; step < len; ++step) {
        const int64_t t = reverse ? len - 1 - step : step;
        const float* xw_t = xw + dims.XRow(t, b) * gh;
        if (gru) {
          // z and r: f(xw + h·R^T); h gate: g(xw + (r*h)·Rh^T) or g(xw + r*(h·Rh^T + Rbh)).
          const RecurrentActivation& f = spec.Activation(static_cast<int>(d), 0);
          const RecurrentActivation& g = spec.Activation(static_cast<int>(d), 1);
          for (int64_t k = 0; k < 2 * hidden; ++k)
            gates[k] = f.Apply(Clip(xw_t[k] + Dot(h.data(), rd + k * hidden, hidden), spec.clip));
          const float* z = gates.data();
          const float* reset = gates.data() + hidden;
          const float* rh = rd + 2 * hidden * hidden;
          if (spec.linear_before_reset) {
            for (int64_t k = 0; k < hidden; ++k) {
              const float recurrent = Dot(h.data(), rh + k * hidden, hidden) + (rb ? rb[2 * hidden + k] : 0.f);
              gates[2 * hidden + k] = g.Apply(Clip(xw_t[2 * hidden + k] + reset[k] * recurrent, spec.clip));
            }
          } else {
            for (int64_t k = 0; k < hidden; ++k) scratch[k] = reset[k] * h[k];
            for (int64_t k = 0; k < hidden; ++k)
              gates[2 * hidden + k] = g.Apply(Clip(xw_t[2 * hidden + k] + Dot(scratch.data(), rh + k * hidden, hidden),
                                                   spec.clip));
          }
          for (int64_t k = 0; k < hidden; ++k) h[k] = (1.f - z[k]) * gates[2 * hidden + k] + z[k] * h[k];
        } else if (lstm) {
          const RecurrentActivation& f = spec.Activation(static_cast<int>(d), 0);
          const RecurrentActivation& g = spec.Activation(static_cast<int>(d), 1);
          const RecurrentActivation& act_h = spec.Activation(static_cast<int>(d), 2);
          for (int64_t k = 0; k < gh; ++k) gates[k] = xw_t[k] + Dot(h.data(), rd + k * hidden, hidden);
          float* gi = gates.data();
          float* go = gates.data() + hidden;
          float* gf = gates.data() + 2 * hidden;
          float* gc = gates.data() + 3 * hidden;
          for (int64_t k = 0; k < hidden; ++k) {
            const float i_gate = f.Apply(Clip(gi[k] + (peep ? peep[k] * c[k] : 0.f), spec.clip));
            const float f_gate =
                spec.input_forget ? 1.f - i_gate : f.Apply(Clip(gf[k] + (peep ? peep[2 * hidden + k] * c[k] : 0.f),
                                                                spec.clip));
            const float candidate = g.Apply(Clip(gc[k], spec.clip));
            c[k] = f_gate * c[k] + i_gate * candidate;
            const float o_gate = f.Apply(Clip(go[k] + (peep ? peep[hidden + k] * c[k] : 0.f), spec.clip));
            h[k] = o_gate * act_h.Apply(c[k]);
          }
        } else {
          const RecurrentActivation& f = spec.Activation(static_cast<int>(d), 0);
          for (int64_t k = 0; k < hidden; ++k)
            scratch[k] = f.Apply(Clip(xw_t[k] + Dot(h.data(), rd + k * hidden, hidden), spec.clip));
          std::copy(scratch.begin(), scratch.end(), h.begin());
        }
        if (y) std::copy(h.begin(), h.end(), y + dims.YOffset(t, d, b));
      }
      if (y_h) std::copy(h.begin(), h.end(), y_h + state);
      if (y_c) std::copy(c.begin(), c.end(), y_c + state);
    }
  }
}

}  // namespace

void AddRecurrentReferenceKernels(ReferenceKernelTable& t) {
  t.Add("RNN", RecurrentKernel);
  t.Add("GRU", RecurrentKernel);
  t.Add("LSTM", RecurrentKernel);
}

}  // namespace osprey
