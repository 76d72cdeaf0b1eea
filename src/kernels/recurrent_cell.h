#pragma once
// The RNN / GRU / LSTM computation (ONNX's equations; gate order RNN: -, GRU: z r h, LSTM: i o f c; peepholes P:
// i o f), shared by the reference kernel (kernels/reference/recurrent.cc, plain loops) and the fast kernel
// (kernels/cpu/recurrent_kernels.cc, oneDNN's sgemm): they differ only in the matrix product they pass in.
//
// Per direction, the input projection X·W^T (+ the biases that add straight onto it) is one [S*N, I] x [I, G*H]
// product for every step at once; the recurrence then runs over groups of batch items taking each step together (one
// [n, H] x [H, G*H] product per step), each item over its own sequence length, so a reverse direction starts at each
// item's last valid step. Steps past an item's length leave zeros in Y; Y_h / Y_c hold the state after the item's
// last processed step.
//
// An LSTM lowered from com.microsoft.DynamicQuantizeLSTM (runtime/dynamic_quantize_lstm.cc) carries `_int8_weights` = 1
// with its int8 weights less their zero points, R' as input 8 ([D, G*H, H], as R) with its scales as input 9
// ([D, G*H]) and W' as input 10 ([D, G*H, I], as W) with its scales as input 11: its products are then computed as
// ONNX Runtime computes them, the activation (X once for every step, h at each step) quantised to uint8 with its own
// range (QuantizeDynamic: DynamicQuantizeLinear's arithmetic), an int32 product, float(acc) * (a_scale * scale[g]).
// (ORT quantises all batch items' h together; here each item's own: the same for batch 1.)
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "ops/dynamic_quantize.h"
#include "ops/recurrent.h"

namespace osprey {

/// c[m, n] += sum_k a[m * depth + k] * b[n * depth + k] for m < rows, n < cols (row-major, b transposed).
using RecurrentGemm = void (*)(const float* a, const float* b, float* c, int64_t rows, int64_t cols, int64_t depth);
/// data[i] = act(clip(data[i])) for i < n, where clip(x) bounds x to [-clip, clip] when clip > 0.
using RecurrentActivate = void (*)(const RecurrentActivation& act, float* data, int64_t n, float clip);

/// Which int8 weight a product uses.
enum class RecurrentWeight { kR = 0, kW = 1 };

/// acc[g] = sum_k (aq[k] - a_zero) * w[g * depth + k] for g < cols, w the int8 weight `which` of direction `dir`
/// (`self`: the kernel's own state, e.g. packed weights; `w` is the plain [cols, depth] tensor data).
struct RecurrentQuantProduct {
  void (*product)(const void* self, RecurrentWeight which, int64_t dir, const int8_t* w, const uint8_t* aq,
                  int32_t a_zero, int32_t* acc, int64_t cols, int64_t depth) = nullptr;
  const void* self = nullptr;
  /// The input projection of all `rows` rows of aq [rows, depth] at once (acc [rows, cols] as `product` with kW would
  /// give row by row, reading W once instead of once per row); false, with nothing written, when the kernel has none.
  bool (*project)(const void* self, int64_t dir, const uint8_t* aq, int64_t rows, int32_t a_zero,
                  int32_t* acc) = nullptr;
};

/// A fast kernel's own float products on its packed weights (`self`); where one is null (or `project` returns false)
/// the gemm runs on W or R itself.
struct RecurrentFloatProducts {
  /// c[i, n] += sum_k h[i, k] * R[col0 + n][k] for i < rows, n < cols (h rows of `depth`, c rows of `cols`), R
  /// direction `dir`'s [G*H, H] recurrence weight (one step of `rows` batch items).
  void (*step)(const void* self, int64_t dir, int64_t col0, const float* h, float* c, int64_t rows, int64_t cols,
               int64_t depth) = nullptr;
  /// xw[r, g] = bias[g] + sum_i x[r, i] * W[g][i] for r < rows, g < G*H, W direction `dir`'s [G*H, I] input weight
  /// (every step's input projection); false, with nothing written, when it was not built for `rows`.
  bool (*project)(const void* self, int64_t dir, const float* x, const float* bias, float* xw, int64_t rows) = nullptr;
  const void* self = nullptr;
  /// `step` splits each product's columns over the threads: the directions then run one after another, each with all
  /// its items in one group (each thread reading part of R per step), instead of one per thread (each reading all of
  /// its direction's R).
  bool splits_steps = false;
  /// Columns [first, last) of what `step` computes for the range at col0 (c rows of `cols`), on the calling thread;
  /// first and last multiples of `column_block` (or last == cols). With it, a split step runs whole on the threads:
  /// chunks of hidden units, each taken by a free thread (its columns of every gate, then its cells), one barrier per
  /// step.
  void (*step_columns)(const void* self, int64_t dir, int64_t col0, const float* h, float* c, int64_t rows,
                       int64_t cols, int64_t depth, int64_t first, int64_t last) = nullptr;
  int64_t column_block = 0;
};

/// The reference int8 product: plain loops.
inline void RecurrentQuantProductLoops(const void*, RecurrentWeight, int64_t, const int8_t* w, const uint8_t* aq,
                                       int32_t a_zero, int32_t* acc, int64_t cols, int64_t depth) {
  for (int64_t g = 0; g < cols; ++g) {
    const int8_t* wg = w + g * depth;
    int32_t sum = 0;
    for (int64_t k = 0; k < depth; ++k) sum += (static_cast<int32_t>(aq[k]) - a_zero) * wg[k];
    acc[g] = sum;
  }
}

/// a (n floats) -> uint8 with DynamicQuantizeLinear's arithmetic (ops/dynamic_quantize.h). Returns false, with nothing
/// written, when the scale is 0 (a all zero: the product is zero).
inline bool QuantizeDynamic(const float* a, int64_t n, uint8_t* q, float* scale, int32_t* zero) {
  float lo = 0.f, hi = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    lo = a[i] < lo ? a[i] : lo;  // a NaN never replaces the running value
    hi = a[i] > hi ? a[i] : hi;
  }
  const DynamicQuantParams p = DynamicQuantParamsOf(lo, hi);
  if (!(p.scale > 0.f)) return false;
  const float z = static_cast<float>(p.zero);
  for (int64_t i = 0; i < n; ++i) q[i] = DynamicQuantizeValue(a[i], p.scale, z);
  *scale = p.scale;
  *zero = p.zero;
  return true;
}

/// RecurrentActivate with RecurrentActivation::Apply (libm), one element at a time: the reference.
inline void ApplyRecurrentActivation(const RecurrentActivation& act, float* data, int64_t n, float clip) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = clip > 0.f ? std::min(std::max(data[i], -clip), clip) : data[i];
    data[i] = act.Apply(x);
  }
}

/// Bytes of the input projection RunRecurrent works in: [directions, sequence * batch, gates * hidden] floats for input
/// X of `x_shape` and input weight W of `w_shape`; 0 for shapes it cannot be (checked when the node runs).
inline size_t RecurrentProjectionBytes(const Shape& x_shape, const Shape& w_shape) {
  if (x_shape.size() != 3 || w_shape.size() != 3) return 0;
  for (int64_t v : {x_shape[0], x_shape[1], w_shape[0], w_shape[1]})
    if (v <= 0 || v > (int64_t{1} << 31)) return 0;
  const double bytes = double(w_shape[0]) * double(x_shape[0]) * double(x_shape[1]) * double(w_shape[1]) * 4;
  return bytes > double(int64_t{1} << 40) ? 0 : static_cast<size_t>(bytes);
}

namespace recurrent_detail {

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

// One item's cell after its step product, over hidden units [u0, u1) (the whole step: 0, hidden), as ONNX defines it.
struct Cell {
  const RecurrentSpec& spec;
  RecurrentActivate activate;
  int di;  // direction
  int64_t hidden;
  const float* peep;  // LSTM peepholes (i o f) of the direction, or null

  // LSTM: gi the item's gates (i o f c, xw + h·R^T), ci its cell state (updated), si hidden floats of scratch; h into
  // ho.
  void Lstm(float* gi, float* ci, float* si, float* ho, int64_t u0, int64_t u1) const {
    const int64_t m = u1 - u0;
    float* g_i = gi + u0;
    float* go = gi + hidden + u0;
    float* gf = gi + 2 * hidden + u0;
    float* gc = gi + 3 * hidden + u0;
    float* cc = ci + u0;
    float* ss = si + u0;
    const RecurrentActivation& f = spec.Activation(di, 0);
    if (peep) {
      for (int64_t k = 0; k < m; ++k) g_i[k] += peep[u0 + k] * cc[k];
      for (int64_t k = 0; k < m; ++k) gf[k] += peep[2 * hidden + u0 + k] * cc[k];
    }
    activate(f, g_i, m, spec.clip);
    if (spec.input_forget) {
      for (int64_t k = 0; k < m; ++k) gf[k] = 1.f - g_i[k];
    } else {
      activate(f, gf, m, spec.clip);
    }
    activate(spec.Activation(di, 1), gc, m, spec.clip);
    for (int64_t k = 0; k < m; ++k) cc[k] = gf[k] * cc[k] + g_i[k] * gc[k];
    if (peep)
      for (int64_t k = 0; k < m; ++k) go[k] += peep[hidden + u0 + k] * cc[k];
    activate(f, go, m, spec.clip);
    std::copy(cc, cc + m, ss);
    activate(spec.Activation(di, 2), ss, m, 0.f);
    for (int64_t k = 0; k < m; ++k) ho[u0 + k] = go[k] * ss[k];
  }

  // GRU with linear_before_reset: zr the item's z and r gates (xw + h·R^T), hr = h·Rh^T + Rbh, xh the input row's
  // h part, ci hidden floats of scratch; h (hi, the state before the step) into ho.
  void GruLinearBeforeReset(float* zr, const float* hr, const float* xh, float* ci, const float* hi, float* ho,
                            int64_t u0, int64_t u1) const {
    const int64_t m = u1 - u0;
    float* z = zr + u0;
    float* r = zr + hidden + u0;
    activate(spec.Activation(di, 0), z, m, spec.clip);
    activate(spec.Activation(di, 0), r, m, spec.clip);
    float* cc = ci + u0;
    for (int64_t k = 0; k < m; ++k) cc[k] = xh[u0 + k] + r[k] * hr[u0 + k];
    activate(spec.Activation(di, 1), cc, m, spec.clip);
    for (int64_t k = 0; k < m; ++k) ho[u0 + k] = (1.f - z[k]) * cc[k] + z[k] * hi[u0 + k];
  }

  // RNN: si the item's xw + h·R^T; h into ho.
  void Rnn(float* si, float* ho, int64_t u0, int64_t u1) const {
    activate(spec.Activation(di, 0), si + u0, u1 - u0, spec.clip);
    std::copy(si + u0, si + u1, ho + u0);
  }
};

}  // namespace recurrent_detail

/// Runs the RNN, GRU or LSTM node of `ctx` (inputs and outputs as the schema in src/ops/recurrent.cc checked them)
/// with `gemm` for every matrix product and `activate` for every activation. Directions and groups of batch items run
/// in parallel (OpenMP) when there is enough work. `projection_space`: RecurrentProjectionBytes of memory for the input projection
/// (a kernel's workspace); null: allocated here.
inline void RunRecurrent(KernelContext& ctx, RecurrentGemm gemm, RecurrentActivate activate,
                         RecurrentQuantProduct quant = {RecurrentQuantProductLoops, nullptr},
                         RecurrentFloatProducts products = {}, float* projection_space = nullptr) {
  const Node& node = ctx.node;
  const RecurrentSpec spec = ParseRecurrentSpec(node);
  const bool gru = node.op_type == "GRU", lstm = node.op_type == "LSTM";
  const bool int8_weights = lstm && node.GetInt("_int8_weights", 0) != 0;
  const Tensor& x = ctx.In(0);
  const Tensor& w = ctx.In(1);
  const Tensor& r = ctx.In(2);
  recurrent_detail::Dims dims;
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

  // Work space: the input projection of every step, per direction (a Tensor when allocated here, so the host memory
  // limit applies).
  const int64_t rows = seq * batch;
  Tensor allocated;
  if (!projection_space) allocated = Tensor(DType::kF32, Shape{dims.dirs, rows, gh});
  float* const projection = projection_space ? projection_space : allocated.data<float>();
  std::vector<uint8_t> xq(int8_weights ? static_cast<size_t>(rows * dims.input) : 0);
  float x_scale = 0.f;
  int32_t x_zero = 0;
  bool x_nonzero = false;
  for (int64_t d = 0; d < dims.dirs; ++d) {
    const float* wb = ctx.HasIn(3) ? ctx.In(3).data<float>() + d * 2 * gh : nullptr;
    const float* rb = wb ? wb + gh : nullptr;
    // Biases that add onto X·W^T directly: Wb + Rb, except GRU's Rbh with linear_before_reset (it is scaled by r).
    std::vector<float> input_bias(static_cast<size_t>(gh), 0.f);
    for (int64_t g = 0; g < gh; ++g) {
      const bool inside_reset = gru && spec.linear_before_reset && g >= 2 * hidden;
      input_bias[static_cast<size_t>(g)] = (wb ? wb[g] : 0.f) + (rb && !inside_reset ? rb[g] : 0.f);
    }
    float* xw = projection + d * rows * gh;
    if (!int8_weights && products.project &&
        products.project(products.self, d, x.data<float>(), input_bias.data(), xw, rows))
      continue;
    for (int64_t row = 0; row < rows; ++row) std::copy(input_bias.begin(), input_bias.end(), xw + row * gh);
    if (!int8_weights) {
      gemm(x.data<float>(), w.data<float>() + d * gh * dims.input, xw, rows, gh, dims.input);
      continue;
    }
    // X quantised once for every step (as ONNX Runtime quantises the whole input before its product).
    if (d == 0) x_nonzero = QuantizeDynamic(x.data<float>(), rows * dims.input, xq.data(), &x_scale, &x_zero);
    if (!x_nonzero) continue;
    const int8_t* wq = ctx.In(10).data<int8_t>() + d * gh * dims.input;
    const float* ws = ctx.In(11).data<float>() + d * gh;
    std::vector<int32_t> all;
    if (quant.project) all.resize(static_cast<size_t>(rows * gh));
    const bool projected = quant.project && quant.project(quant.self, d, xq.data(), rows, x_zero, all.data());
#pragma omp parallel for schedule(static) if (rows > 1 && rows * gh * dims.input >= (1 << 18))
    for (int64_t row = 0; row < rows; ++row) {
      std::vector<int32_t> own(projected ? 0 : static_cast<size_t>(gh));
      const int32_t* acc = projected ? all.data() + row * gh : own.data();
      if (!projected)
        quant.product(quant.self, RecurrentWeight::kW, d, wq, xq.data() + row * dims.input, x_zero, own.data(), gh,
                      dims.input);
      float* out = xw + row * gh;
      for (int64_t g = 0; g < gh; ++g) out[g] += static_cast<float>(acc[g]) * (x_scale * ws[g]);
    }
  }

  // A split step run whole on the threads (products.step_columns): the directions one after another, every item in
  // one group, the hidden units in chunks of whole panels, each chunk's columns of every gate multiplied and then its
  // cells computed by the thread that took it. One barrier per step (h is read whole by the next step's products: it
  // goes to the other of two buffers), where step() splits only the products and runs the activations on one thread,
  // with a fork and join per product. A 512-wide LSTM at batch 8 on a 2-vCPU EPYC Zen 3: 14.1 -> 11.8 ms (medians of
  // six alternated runs; ORT 1.32: 9.0-9.7). GRU without linear_before_reset multiplies r * h, which needs every unit
  // of r, and so keeps step().
  const int64_t threads = std::max(1, omp_get_max_threads());
  const int64_t block = products.column_block;
  if (products.splits_steps && products.step_columns && block > 0 && !int8_weights && threads > 1 &&
      !omp_in_parallel() && (!gru || spec.linear_before_reset) && hidden % block == 0 && hidden / block > 1) {
    const int64_t n = batch, blocks = hidden / block;
    const int team = static_cast<int>(std::min(threads, blocks));
    // Chunks of whole panels, about four per thread.
    const int64_t chunk_units = std::max<int64_t>(1, blocks / (4 * team)) * block;
    const int64_t chunks = (hidden + chunk_units - 1) / chunk_units;
    // The ranges the products read (step_columns checks them; it throws here, outside the parallel region).
    const std::vector<std::pair<int64_t, int64_t>> ranges =
        gru ? std::vector<std::pair<int64_t, int64_t>>{{0, 2 * hidden}, {2 * hidden, hidden}}
            : std::vector<std::pair<int64_t, int64_t>>{{0, gh}};
    for (int64_t d = 0; d < dims.dirs; ++d) {
      const float* xw = projection + d * rows * gh;
      const float* rb = ctx.HasIn(3) ? ctx.In(3).data<float>() + d * 2 * gh + gh : nullptr;
      const float* peep = lstm && ctx.HasIn(7) ? ctx.In(7).data<float>() + d * 3 * hidden : nullptr;
      const bool reverse = spec.reverse || d == 1;
      const recurrent_detail::Cell cell{spec, activate, static_cast<int>(d), hidden, peep};
      auto buffer = [](int64_t count) { return std::vector<float>(static_cast<size_t>(count), 0.f); };
      std::vector<float> h0 = buffer(n * hidden), h1 = buffer(n * hidden), c = buffer(n * hidden);
      std::vector<float> scratch = buffer(n * hidden), cand = buffer(gru ? n * hidden : 0);
      std::vector<float> gates = buffer(lstm ? n * gh : gru ? n * 2 * hidden : 0);
      for (const auto& [col0, cols] : ranges)
        products.step_columns(products.self, d, col0, h0.data(), lstm ? gates.data() : scratch.data(), n, cols, hidden,
                              0, 0);
      int64_t steps = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t state = dims.StateOffset(d, i);
        if (ctx.HasIn(5)) std::copy_n(ctx.In(5).data<float>() + state, hidden, h0.data() + i * hidden);
        if (lstm && ctx.HasIn(6)) std::copy_n(ctx.In(6).data<float>() + state, hidden, c.data() + i * hidden);
        steps = std::max(steps, lengths[static_cast<size_t>(i)]);
      }
#pragma omp parallel num_threads(team)
      for (int64_t step = 0; step < steps; ++step) {
        const float* hin = (step & 1 ? h1 : h0).data();
        float* hout = (step & 1 ? h0 : h1).data();
        // The items' input rows (nullptr once past an item's length).
        auto input_row = [&](int64_t i) -> const float* {
          const int64_t len = lengths[static_cast<size_t>(i)];
          return step < len ? xw + dims.XRow(reverse ? len - 1 - step : step, i) * gh : nullptr;
        };
        // Units taken a chunk at a time by whichever thread is free (a thread the host delays holds up no other),
        // every other step last to first (the panels read last, still in a cache, first: as step() does); the loop's
        // end is the step's barrier.
#pragma omp for schedule(dynamic, 1)
        for (int64_t taken = 0; taken < chunks; ++taken) {
          const int64_t chunk = step & 1 ? chunks - 1 - taken : taken;
          const int64_t u0 = chunk * chunk_units, u1 = std::min(hidden, u0 + chunk_units);
          auto copy_units = [&](const float* from, float* to) { std::copy(from + u0, from + u1, to + u0); };
          for (int64_t i = 0; i < n; ++i) {  // the units' inputs, where the products add
            const float* xw_t = input_row(i);
            if (!xw_t) continue;
            if (lstm) {
              for (int64_t g = 0; g < 4; ++g) copy_units(xw_t + g * hidden, gates.data() + i * gh + g * hidden);
            } else if (gru) {
              for (int64_t g = 0; g < 2; ++g) copy_units(xw_t + g * hidden, gates.data() + (2 * i + g) * hidden);
              for (int64_t k = u0; k < u1; ++k) scratch[i * hidden + k] = rb ? rb[2 * hidden + k] : 0.f;
            } else {
              copy_units(xw_t, scratch.data() + i * hidden);
            }
          }
          if (lstm) {
            for (int64_t g = 0; g < 4; ++g)
              products.step_columns(products.self, d, 0, hin, gates.data(), n, gh, hidden, g * hidden + u0,
                                    g * hidden + u1);
          } else if (gru) {
            for (int64_t g = 0; g < 2; ++g)
              products.step_columns(products.self, d, 0, hin, gates.data(), n, 2 * hidden, hidden, g * hidden + u0,
                                    g * hidden + u1);
            products.step_columns(products.self, d, 2 * hidden, hin, scratch.data(), n, hidden, hidden, u0, u1);
          } else {
            products.step_columns(products.self, d, 0, hin, scratch.data(), n, hidden, hidden, u0, u1);
          }
          for (int64_t i = 0; i < n; ++i) {
            const float* xw_t = input_row(i);
            float* ho = hout + i * hidden;
            if (!xw_t) {
              copy_units(hin + i * hidden, ho);  // past its length: the state stays
              continue;
            }
            if (lstm)
              cell.Lstm(gates.data() + i * gh, c.data() + i * hidden, scratch.data() + i * hidden, ho, u0, u1);
            else if (gru)
              cell.GruLinearBeforeReset(gates.data() + i * 2 * hidden, scratch.data() + i * hidden, xw_t + 2 * hidden,
                                        cand.data() + i * hidden, hin + i * hidden, ho, u0, u1);
            else
              cell.Rnn(scratch.data() + i * hidden, ho, u0, u1);
            if (y) {
              const int64_t len = lengths[static_cast<size_t>(i)];
              copy_units(ho, y + dims.YOffset(reverse ? len - 1 - step : step, d, i));
            }
          }
        }
      }
      const float* h = (steps & 1 ? h1 : h0).data();
      for (int64_t i = 0; i < n; ++i) {
        const int64_t state = dims.StateOffset(d, i);
        if (y_h) std::copy_n(h + i * hidden, hidden, y_h + state);
        if (y_c) std::copy_n(c.data() + i * hidden, hidden, y_c + state);
      }
    }
    return;
  }

  // The recurrence: directions and items are independent. The items of a direction run in groups that take each step
  // together, so one product per step reads R once for the whole group ([n, H] x [H, cols]); (direction, group) pairs
  // run in parallel. Groups: every item in one when the kernel's step product splits its columns over the threads
  // itself, else as many as fill the threads beside the directions. Each item keeps its own length (a reverse
  // direction starts at the item's last valid step); an item past its length is multiplied with the others but left
  // as it is. An exception may not leave an OpenMP region: the first one is kept and rethrown after it.
  const int64_t groups =
      products.splits_steps ? 1 : std::min(batch, std::max<int64_t>(1, (threads + dims.dirs - 1) / dims.dirs));
  const int64_t group_size = batch > 0 ? (batch + groups - 1) / groups : 0;
  std::exception_ptr failure;
#pragma omp parallel for collapse(2) \
    schedule(static) if (!products.splits_steps && dims.dirs * groups > 1 && seq * gh * hidden >= (1 << 16))
  for (int64_t d = 0; d < dims.dirs; ++d) {
    for (int64_t g = 0; g < groups; ++g) {
      try {
        const int64_t first = g * group_size, n = std::min(batch, first + group_size) - first;
        if (n <= 0) continue;
        const float* xw = projection + d * rows * gh;
        const float* rd = r.data<float>() + d * gh * hidden;
        const float* rb = ctx.HasIn(3) ? ctx.In(3).data<float>() + d * 2 * gh + gh : nullptr;
        const float* peep = lstm && ctx.HasIn(7) ? ctx.In(7).data<float>() + d * 3 * hidden : nullptr;
        const bool reverse = spec.reverse || d == 1;
        const int di = static_cast<int>(d);
        const recurrent_detail::Cell cell{spec, activate, di, hidden, peep};
        auto buffer = [](int64_t count) { return std::vector<float>(static_cast<size_t>(count), 0.f); };
        // Per item (row i of each): the state, the gates (LSTM: i o f c; RNN: one; GRU: z r here, h in `cand`).
        std::vector<float> h = buffer(n * hidden), c = buffer(n * hidden), scratch = buffer(n * hidden);
        std::vector<float> gates = buffer(n * (gru ? 2 * hidden : gh)), cand = buffer(gru ? n * hidden : 0);
        std::vector<uint8_t> hq(int8_weights ? static_cast<size_t>(hidden) : 0);
        std::vector<int32_t> acc(int8_weights ? static_cast<size_t>(gh) : 0);
        const int8_t* rq = int8_weights ? ctx.In(8).data<int8_t>() + d * gh * hidden : nullptr;
        const float* rs = int8_weights ? ctx.In(9).data<float>() + d * gh : nullptr;
        int64_t steps = 0;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t state = dims.StateOffset(d, first + i);
          if (ctx.HasIn(5)) std::copy_n(ctx.In(5).data<float>() + state, hidden, h.data() + i * hidden);
          if (lstm && ctx.HasIn(6)) std::copy_n(ctx.In(6).data<float>() + state, hidden, c.data() + i * hidden);
          steps = std::max(steps, lengths[static_cast<size_t>(first + i)]);
        }
        // out[i, 0..cols) += a[i, 0..H) · R[col0 .. col0 + cols)^T for every item i of the group.
        auto step_gemm = [&](const float* a, int64_t col0, float* out, int64_t cols) {
          if (products.step)
            products.step(products.self, d, col0, a, out, n, cols, hidden);
          else
            gemm(a, rd + col0 * hidden, out, n, cols, hidden);
        };
        for (int64_t step = 0; step < steps; ++step) {
          // The step's input row of item i (nullptr once the item is past its length).
          auto input_row = [&](int64_t i) -> const float* {
            const int64_t len = lengths[static_cast<size_t>(first + i)];
            if (step >= len) return nullptr;
            return xw + dims.XRow(reverse ? len - 1 - step : step, first + i) * gh;
          };
          auto time_of = [&](int64_t i) {
            const int64_t len = lengths[static_cast<size_t>(first + i)];
            return reverse ? len - 1 - step : step;
          };
          if (gru) {
            // z and r: f(xw + h·R^T); h gate: g(xw + (r*h)·Rh^T) or, with linear_before_reset,
            // g(xw + r*(h·Rh^T + Rbh)).
            for (int64_t i = 0; i < n; ++i)
              if (const float* xw_t = input_row(i)) std::copy(xw_t, xw_t + 2 * hidden, gates.data() + i * 2 * hidden);
            step_gemm(h.data(), 0, gates.data(), 2 * hidden);
            if (spec.linear_before_reset) {
              for (int64_t i = 0; i < n; ++i)
                for (int64_t k = 0; k < hidden; ++k) scratch[i * hidden + k] = rb ? rb[2 * hidden + k] : 0.f;
              step_gemm(h.data(), 2 * hidden, scratch.data(), hidden);
            }
            if (spec.linear_before_reset) {
              for (int64_t i = 0; i < n; ++i)
                if (const float* xw_t = input_row(i))
                  cell.GruLinearBeforeReset(gates.data() + i * 2 * hidden, scratch.data() + i * hidden,
                                            xw_t + 2 * hidden, cand.data() + i * hidden, h.data() + i * hidden,
                                            h.data() + i * hidden, 0, hidden);
            } else {
              for (int64_t i = 0; i < n; ++i) {
                const float* xw_t = input_row(i);
                if (!xw_t) continue;
                float* zr = gates.data() + i * 2 * hidden;
                activate(spec.Activation(di, 0), zr, 2 * hidden, spec.clip);
                const float* reset = zr + hidden;
                const float* hi = h.data() + i * hidden;
                float* si = scratch.data() + i * hidden;
                for (int64_t k = 0; k < hidden; ++k) si[k] = reset[k] * hi[k];
                std::copy(xw_t + 2 * hidden, xw_t + 3 * hidden, cand.data() + i * hidden);
              }
              step_gemm(scratch.data(), 2 * hidden, cand.data(), hidden);
              for (int64_t i = 0; i < n; ++i) {
                if (!input_row(i)) continue;
                const float* z = gates.data() + i * 2 * hidden;
                float* ci = cand.data() + i * hidden;
                float* hi = h.data() + i * hidden;
                activate(spec.Activation(di, 1), ci, hidden, spec.clip);
                for (int64_t k = 0; k < hidden; ++k) hi[k] = (1.f - z[k]) * ci[k] + z[k] * hi[k];
              }
            }
          } else if (lstm) {
            for (int64_t i = 0; i < n; ++i)
              if (const float* xw_t = input_row(i)) std::copy(xw_t, xw_t + gh, gates.data() + i * gh);
            if (!int8_weights) step_gemm(h.data(), 0, gates.data(), gh);
            for (int64_t i = 0; i < n; ++i) {
              if (!input_row(i)) continue;
              float* gi = gates.data() + i * gh;
              float* hi = h.data() + i * hidden;
              float* ci = c.data() + i * hidden;
              float* si = scratch.data() + i * hidden;
              float h_scale = 0.f;
              int32_t h_zero = 0;
              if (int8_weights && QuantizeDynamic(hi, hidden, hq.data(), &h_scale, &h_zero)) {
                quant.product(quant.self, RecurrentWeight::kR, d, rq, hq.data(), h_zero, acc.data(), gh, hidden);
                for (int64_t j = 0; j < gh; ++j) gi[j] += static_cast<float>(acc[j]) * (h_scale * rs[j]);
              }
              cell.Lstm(gi, ci, si, hi, 0, hidden);
            }
          } else {
            for (int64_t i = 0; i < n; ++i)
              if (const float* xw_t = input_row(i)) std::copy(xw_t, xw_t + hidden, scratch.data() + i * hidden);
            step_gemm(h.data(), 0, scratch.data(), hidden);
            for (int64_t i = 0; i < n; ++i)
              if (input_row(i)) cell.Rnn(scratch.data() + i * hidden, h.data() + i * hidden, 0, hidden);
          }
          if (y)
            for (int64_t i = 0; i < n; ++i)
              if (input_row(i)) std::copy_n(h.data() + i * hidden, hidden, y + dims.YOffset(time_of(i), d, first + i));
        }
        for (int64_t i = 0; i < n; ++i) {
          const int64_t state = dims.StateOffset(d, first + i);
          if (y_h) std::copy_n(h.data() + i * hidden, hidden, y_h + state);
          if (y_c) std::copy_n(c.data() + i * hidden, hidden, y_c + state);
        }
      } catch (...) {
#pragma omp critical(osprey_recurrent_failure)
        if (!failure) failure = std::current_exception();
      }
    }
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace osprey
