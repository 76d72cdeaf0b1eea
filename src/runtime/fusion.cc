// Fusion passes over the live (unfolded) nodes of a compile. See docs/architecture.md for the fused-node convention.
#include <algorithm>
#include <cmath>

#include "core/hash.h"
#include "ops/activation.h"
#include "ops/batch_norm.h"
#include "ops/conv_input_scale.h"
#include "ops/conv_window.h"
#include "ops/fused_depthwise.h"
#include "ops/fused_pool.h"
#include "ops/matmul_views.h"
#include "ops/op_registry.h"
#include "ops/slice.h"
#include "runtime/plan_impl.h"

namespace osprey {

namespace {

struct Uses {
  std::vector<std::vector<int>> consumers;  // value id -> indices of live nodes reading it
};

Uses CountUses(const CompileState& st) {
  Uses u;
  u.consumers.assign(st.values.size(), {});
  for (size_t i = 0; i < st.nodes.size(); ++i)
    for (int v : st.nodes[i].inputs)
      if (v >= 0) u.consumers[v].push_back(static_cast<int>(i));
  return u;
}

bool IsF32Known(const CompileState& st, int v) {
  return v >= 0 && st.values[v].known && st.values[v].dtype == DType::kF32;
}

// Single consumer, not a graph output: the value can disappear into a fused node.
bool Private(const CompileState& st, const Uses& u, int v) {
  return u.consumers[v].size() == 1 && !st.is_graph_output[v];
}

// A new constant: weight `w` (a float32 constant) with channel c's values times scale[c], channel c being row c (a
// Conv's weight [K, ...]) or, with `columns`, column c (a MatMul's [K, N]): batch normalisation or a per-channel Mul
// folded into the layer. With a weight store the scaled weight is derived from `w` once (WeightStore::Derive, keyed
// by the scales) and every later compile of the model gets that buffer: a new input shape compiles the model again
// (PP-OCR's recogniser at every text width), and copying, scaling and hashing its weights each time took ~4 ms of a
// 20 ms compile. Returns the new value's id.
int ScaledWeight(CompileState& st, int w, const std::vector<float>& scale, bool columns) {
  const Tensor& source = st.values[w].value;
  const int64_t n = static_cast<int64_t>(scale.size());
  const int64_t per = source.numel() / std::max<int64_t>(n, 1);
  auto fill = [&](float* out) {
    const float* in = source.data<float>();
    for (int64_t i = 0; i < source.numel(); ++i) out[i] = in[i] * scale[static_cast<size_t>(columns ? i % n : i / per)];
  };
  if (st.weights == nullptr || source.raw() == nullptr) {
    Tensor scaled(DType::kF32, source.shape());
    fill(scaled.data<float>());
    return st.AddConstant(std::move(scaled));
  }
  const std::string key = std::string(columns ? "columns" : "rows") + " scaled by " +
                          HashBytes(scale.data(), scale.size() * sizeof(float)).ToHex();
  std::shared_ptr<Buffer> buffer =
      st.weights->Derive(source, key, source.nbytes(), [&](void* data) { fill(static_cast<float*>(data)); });
  return st.AddStoredConstant(Tensor::View(DType::kF32, source.shape(), std::move(buffer), 0));
}

// Value -> the node writing it (-1 for graph inputs and constants), built once per pass: a search per candidate would
// make a graph of many candidates quadratic to compile.
std::vector<int> Producers(const CompileState& st) {
  std::vector<int> producer(st.values.size(), -1);
  for (size_t i = 0; i < st.nodes.size(); ++i)
    for (int out : st.nodes[i].outputs)
      if (out >= 0) producer[out] = static_cast<int>(i);
  return producer;
}

// Removes the nodes marked dead, keeping the others in order.
void DropDead(CompileState& st, const std::vector<char>& dead) {
  std::vector<Node> kept;
  kept.reserve(st.nodes.size());
  for (size_t i = 0; i < st.nodes.size(); ++i)
    if (!dead[i]) kept.push_back(std::move(st.nodes[i]));
  st.nodes = std::move(kept);
}

// A MatMul by a constant [K, N] weight, with or without a fused constant bias of N values (`_bias`, input 2) and no
// other fused part: the form the weight folds below rewrite.
bool MatMulByConstant(const CompileState& st, const Node& mm) {
  const bool has_bias = mm.Has("_bias");
  if (mm.op_type != "MatMul" || !mm.domain.empty() || mm.outputs.size() != 1 ||
      mm.attrs.size() != (has_bias ? 1u : 0u) || mm.inputs.size() != (has_bias ? 3u : 2u))
    return false;
  const int w = mm.inputs[1];
  if (!IsF32Known(st, w) || st.values[w].shape.size() != 2) return false;
  return !has_bias || (IsF32Known(st, mm.inputs[2]) && st.values[mm.inputs[2]].value.numel() == st.values[w].shape[1]);
}

}  // namespace

bool PerChannelConstant(const CompileState& st, int k, const Shape& ys, std::vector<float>* values) {
  if (!IsF32Known(st, k) || ys.size() < 3) return false;
  const Tensor& kv = st.values[k].value;
  const Shape& ks = kv.shape();
  if (ks.size() > ys.size()) return false;
  for (size_t d = 0; d < ks.size(); ++d)
    if (ks[d] != 1 && ys.size() - ks.size() + d != 1) return false;
  const int64_t c = ys[1];
  if (kv.numel() != 1 && kv.numel() != c) return false;
  const float* kp = kv.data<float>();
  values->resize(c);
  for (int64_t i = 0; i < c; ++i) (*values)[i] = kp[kv.numel() == 1 ? 0 : i];
  return true;
}

namespace {

// BatchNormalization(Conv(x, W, B)) -> Conv(x, W', B') with W' = W * s, B' = (B - mean) * s + beta,
// s = gamma / sqrt(var + eps), per output channel.
void FoldBatchNorm(CompileState& st) {
  Uses u = CountUses(st);
  std::vector<char> dead(st.nodes.size(), 0);
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    Node& conv = st.nodes[i];
    if (conv.op_type != "Conv" || dead[i] || conv.outputs.size() != 1 || HasFusedPool(conv)) continue;
    int y = conv.outputs[0];
    if (!Private(st, u, y) || st.values[y].dtype != DType::kF32) continue;
    int j = u.consumers[y][0];
    Node& bn = st.nodes[j];
    if (bn.op_type != "BatchNormalization" || bn.outputs.size() != 1 || bn.inputs[0] != y) continue;
    if (bn.GetInt("training_mode", 0) != 0) continue;
    if (!IsF32Known(st, conv.inputs[1])) continue;
    int nb = conv.NumInputs();
    if (nb >= 3 && !IsF32Known(st, conv.inputs[2])) continue;
    bool params_known = true;
    for (int k = 1; k <= 4; ++k) params_known = params_known && IsF32Known(st, bn.inputs[k]);
    if (!params_known) continue;
    const Tensor& w = st.values[conv.inputs[1]].value;
    const int64_t cout = w.dim(0);
    const float* gamma = st.values[bn.inputs[1]].value.data<float>();
    const float* beta = st.values[bn.inputs[2]].value.data<float>();
    const float* mean = st.values[bn.inputs[3]].value.data<float>();
    const float* var = st.values[bn.inputs[4]].value.data<float>();
    if (st.values[bn.inputs[1]].value.numel() != cout) continue;
    const float eps = bn.GetFloat("epsilon", 1e-5f);
    std::vector<float> scale(static_cast<size_t>(cout));
    Tensor b2(DType::kF32, {cout});
    for (int64_t c = 0; c < cout; ++c) {
      const float s = gamma[c] / std::sqrt(var[c] + eps);
      scale[static_cast<size_t>(c)] = s;
      float b = nb >= 3 ? st.values[conv.inputs[2]].value.data<float>()[c] : 0.f;
      b2.data<float>()[c] = (b - mean[c]) * s + beta[c];
    }
    int w_id = ScaledWeight(st, conv.inputs[1], scale, /*columns=*/false);
    int b_id = st.AddConstant(std::move(b2));
    u.consumers.resize(st.values.size());
    conv.inputs.resize(3);
    conv.inputs[1] = w_id;
    conv.inputs[2] = b_id;
    conv.outputs[0] = bn.outputs[0];
    // The conv now produces the BN's output; it stays at its position (its inputs are all earlier).
    dead[j] = 1;
  }
  DropDead(st, dead);
}

// BatchNormalization of a rank-2 [M, N] tensor (channels = the last axis) made by a MatMul with a constant [K, N]
// weight, directly or through a Reshape or Flatten that keeps the last dim (LeViT's Linear + BatchNorm1d as PyTorch
// exports it: MatMul [1, 196, 256] -> Reshape (dynamo) or Flatten (TorchScript) [196, 256] -> BatchNormalization)
// -> MatMul(x, W', b') [-> Reshape], with
// W'[:, n] = W[:, n] * s[n], b' = (b - mean) * s + beta, s = gamma / sqrt(var + eps), b the MatMul's fused bias or 0.
void FoldBatchNormIntoMatMul(CompileState& st) {
  Uses u = CountUses(st);
  std::vector<int> producer(st.values.size(), -1);
  for (size_t i = 0; i < st.nodes.size(); ++i)
    for (int v : st.nodes[i].outputs)
      if (v >= 0) producer[v] = static_cast<int>(i);
  std::vector<char> dead(st.nodes.size(), 0);
  for (size_t j = 0; j < st.nodes.size(); ++j) {
    const Node& bn = st.nodes[j];
    if (bn.op_type != "BatchNormalization" || bn.outputs.size() != 1 || bn.GetInt("training_mode", 0) != 0) continue;
    const int x = bn.inputs[0];
    if (x < 0 || st.values[x].dtype != DType::kF32 || st.values[x].shape.size() != 2 || !Private(st, u, x)) continue;
    bool params_known = bn.inputs.size() == 5;
    for (int k = 1; params_known && k <= 4; ++k) params_known = IsF32Known(st, bn.inputs[k]);
    const int64_t n = st.values[x].shape[1];
    if (!params_known || st.values[bn.inputs[1]].value.numel() != n) continue;
    int mm_i = producer[x], reshape_i = -1;
    if (mm_i >= 0 && (st.nodes[mm_i].op_type == "Reshape" || st.nodes[mm_i].op_type == "Flatten")) {
      reshape_i = mm_i;
      const int r_in = st.nodes[reshape_i].inputs[0];
      if (r_in < 0 || !Private(st, u, r_in) || st.values[r_in].shape.empty() || st.values[r_in].shape.back() != n)
        continue;
      mm_i = producer[r_in];
    }
    if (mm_i < 0 || dead[mm_i] || !MatMulByConstant(st, st.nodes[mm_i])) continue;
    Node& mm = st.nodes[mm_i];
    const bool has_bias = mm.Has("_bias");
    const int w = mm.inputs[1];
    if (st.values[w].shape[1] != n) continue;
    const float* gamma = st.values[bn.inputs[1]].value.data<float>();
    const float* beta = st.values[bn.inputs[2]].value.data<float>();
    const float* mean = st.values[bn.inputs[3]].value.data<float>();
    const float* var = st.values[bn.inputs[4]].value.data<float>();
    const float eps = bn.GetFloat("epsilon", 1e-5f);
    std::vector<float> scale(static_cast<size_t>(n));
    Tensor b2(DType::kF32, {n});
    for (int64_t c = 0; c < n; ++c) {
      const float s = gamma[c] / std::sqrt(var[c] + eps);
      scale[static_cast<size_t>(c)] = s;
      const float b = has_bias ? st.values[mm.inputs[2]].value.data<float>()[c] : 0.f;
      b2.data<float>()[c] = (b - mean[c]) * s + beta[c];
    }
    const int out = bn.outputs[0];
    const int w2 = ScaledWeight(st, w, scale, /*columns=*/true);
    mm.inputs = {mm.inputs[0], w2, st.AddConstant(std::move(b2))};
    mm.attrs["_bias"] = Attribute::Int(1);
    if (reshape_i >= 0)
      st.nodes[reshape_i].outputs[0] = out;
    else
      mm.outputs[0] = out;
    u.consumers.resize(st.values.size());
    dead[j] = 1;
  }
  DropDead(st, dead);
}

// Mul(MatMul(x, W[, b]), s) -> MatMul(x, W', b') with W'[:, n] = W[:, n] * s[n] and b' = b * s, where the constant s
// holds one value per column of the MatMul's output (its last axis) or a single value; also through a Transpose
// between the two, s then varying along the axis the Transpose moved the last one to. ConvNeXt's layer scale is this:
// Linear -> permute back to NCHW -> Mul by gamma [C, 1, 1] (18 Muls, 3.3 ms of torchvision's ConvNeXt-T at batch 8).
void FoldMatMulScale(CompileState& st) {
  Uses u = CountUses(st);
  const std::vector<int> producer = Producers(st);
  std::vector<char> dead(st.nodes.size(), 0);
  for (size_t j = 0; j < st.nodes.size(); ++j) {
    const Node& mul = st.nodes[j];
    if (mul.op_type != "Mul" || !mul.domain.empty() || mul.inputs.size() != 2 || mul.outputs.size() != 1) continue;
    int k = -1;
    for (int i = 0; i < 2; ++i)
      if (IsF32Known(st, mul.inputs[i]) && mul.inputs[1 - i] >= 0 && !st.values[mul.inputs[1 - i]].known) k = i;
    if (k < 0) continue;
    const int t = mul.inputs[1 - k];
    const Tensor& scale = st.values[mul.inputs[k]].value;
    const Shape& ts = st.values[t].shape;
    if (st.values[t].dtype != DType::kF32 || !Private(st, u, t) || st.values[mul.outputs[0]].shape != ts ||
        scale.shape().size() > ts.size())
      continue;
    // The axis of t that the scale varies along (-1: one value for all).
    int axis = -1;
    bool one_axis = true;
    for (size_t d = 0; d < scale.shape().size(); ++d) {
      if (scale.shape()[d] == 1) continue;
      const int a = static_cast<int>(ts.size() - scale.shape().size() + d);
      one_axis = one_axis && axis < 0 && scale.shape()[d] == ts[a];
      axis = a;
    }
    if (!one_axis) continue;
    int mm_i = producer[t], transpose_i = -1;
    if (mm_i >= 0 && st.nodes[mm_i].op_type == "Transpose" && st.nodes[mm_i].domain.empty()) {
      transpose_i = mm_i;
      const Node& tr = st.nodes[transpose_i];
      const int in = tr.inputs.empty() ? -1 : tr.inputs[0];
      if (in < 0 || !Private(st, u, in)) continue;
      const std::vector<int64_t> perm = TransposePerm(tr, ts.size());
      if (axis >= 0) axis = static_cast<int>(perm[axis]);
      mm_i = producer[in];
    }
    if (mm_i < 0 || dead[mm_i] || !MatMulByConstant(st, st.nodes[mm_i])) continue;
    Node& mm = st.nodes[mm_i];
    const bool has_bias = mm.Has("_bias");
    const int w = mm.inputs[1];
    const int64_t n = st.values[w].shape[1];
    if (axis >= 0 && axis != static_cast<int>(st.values[mm.outputs[0]].shape.size()) - 1) continue;
    std::vector<float> s_of(static_cast<size_t>(n));  // copied: AddConstant below may move st.values
    for (int64_t c = 0; c < n; ++c) s_of[static_cast<size_t>(c)] = scale.data<float>()[scale.numel() == 1 ? 0 : c];
    std::vector<int> inputs{mm.inputs[0], ScaledWeight(st, w, s_of, /*columns=*/true)};
    if (has_bias) {
      Tensor b2 = st.values[mm.inputs[2]].value.Clone();
      for (int64_t c = 0; c < n; ++c) b2.data<float>()[c] *= s_of[static_cast<size_t>(c)];
      inputs.push_back(st.AddConstant(std::move(b2)));
    }
    mm.inputs = inputs;
    (transpose_i >= 0 ? st.nodes[transpose_i] : mm).outputs[0] = mul.outputs[0];
    u.consumers.resize(st.values.size());
    dead[j] = 1;
  }
  DropDead(st, dead);
}

// Conv(x, W, B) followed by Mul, Add or Sub (conv output first) with a constant that is one value per output channel
// (shape [C, 1, 1], [1, C, 1, 1], or a single value) -> one Conv with the constant folded in: W'[c] = W[c] * s[c] and
// B' = B * s for Mul, B' = B +/- t for Add/Sub. TensorFlow exporters (tf2onnx) leave batch normalisation as such a
// Mul and Add after depthwise convolutions; folded, the activation behind them fuses into the Conv too.
void FoldConvAffine(CompileState& st) {
  bool changed = true;
  while (changed) {
    changed = false;
    Uses u = CountUses(st);
    std::vector<char> dead(st.nodes.size(), 0);
    for (size_t i = 0; i < st.nodes.size(); ++i) {
      Node& conv = st.nodes[i];
      if (conv.op_type != "Conv" || dead[i] || conv.outputs.size() != 1 || conv.Has("_activation") ||
          conv.Has("_residual") || HasFusedPool(conv))
        continue;
      const int y = conv.outputs[0];
      if (!Private(st, u, y) || st.values[y].dtype != DType::kF32) continue;
      const int j = u.consumers[y][0];
      if (dead[j]) continue;
      const Node& op = st.nodes[j];
      const bool mul = op.op_type == "Mul", add = op.op_type == "Add", sub = op.op_type == "Sub";
      if (!(mul || add || sub) || op.NumInputs() != 2 || op.outputs.size() != 1) continue;
      const int side = op.inputs[0] == y ? 0 : 1;
      if (op.inputs[side] != y || op.inputs[1 - side] == y || (sub && side != 0)) continue;
      const int k = op.inputs[1 - side];
      if (!IsF32Known(st, k) || st.values[op.outputs[0]].shape != st.values[y].shape) continue;
      if (!IsF32Known(st, conv.inputs[1])) continue;
      const int nb = conv.NumInputs();
      if (nb >= 3 && conv.inputs[2] >= 0 && !IsF32Known(st, conv.inputs[2])) continue;
      const Tensor& w = st.values[conv.inputs[1]].value;
      const Shape& ys = st.values[y].shape;
      const int64_t cout = w.dim(0);
      std::vector<float> kv;
      if (ys.size() < 3 || ys[1] != cout || !PerChannelConstant(st, k, ys, &kv)) continue;
      auto kval = [&](int64_t c) { return kv[c]; };
      const float* bias = nb >= 3 && conv.inputs[2] >= 0 ? st.values[conv.inputs[2]].value.data<float>() : nullptr;
      Tensor b2(DType::kF32, {cout});
      float* bp = b2.data<float>();
      for (int64_t c = 0; c < cout; ++c) bp[c] = bias ? bias[c] : 0.f;
      if (mul) {
        for (int64_t c = 0; c < cout; ++c) bp[c] *= kval(c);
        conv.inputs[1] = ScaledWeight(st, conv.inputs[1], kv, /*columns=*/false);
      } else {
        for (int64_t c = 0; c < cout; ++c) bp[c] = add ? bp[c] + kval(c) : bp[c] - kval(c);
      }
      conv.inputs.resize(3);
      conv.inputs[2] = st.AddConstant(std::move(b2));
      conv.outputs[0] = op.outputs[0];
      dead[j] = 1;
      changed = true;
      u.consumers.resize(st.values.size());
    }
    DropDead(st, dead);
  }
}

// Mul, Add or Sub of a per-channel constant on a rank-4 float32 tensor that is not a convolution's output (pre-activation
// batch norm as TF exporters write it: DenseNet, ResNetV2), together with a per-channel Add or Sub right after a Mul,
// -> one BatchNormalization (scale s, bias b, mean 0, variance 1, epsilon 0: x * s + b), when there were two steps or
// a fusable activation follows: FuseActivation then makes the chain one pass over the data instead of two or three.
void AffineToBatchNorm(CompileState& st) {
  Uses u = CountUses(st);
  std::vector<char> dead(st.nodes.size(), 0);
  bool changed = false;
  // The constant side of an elementwise Mul/Add/Sub node with data input x (x - k only for Sub), or -1.
  auto affine = [&](const Node& n, int* x) {
    const bool sub = n.op_type == "Sub";
    if ((n.op_type != "Mul" && n.op_type != "Add" && !sub) || n.NumInputs() != 2 || n.outputs.size() != 1) return -1;
    for (int side = 0; side < (sub ? 1 : 2); ++side) {
      const int a = n.inputs[side], k = n.inputs[1 - side];
      if (a < 0 || k < 0 || IsF32Known(st, a) || !IsF32Known(st, k)) continue;
      const CompileValue& av = st.values[a];
      if (av.dtype != DType::kF32 || av.shape.size() != 4 || st.values[n.outputs[0]].shape != av.shape) continue;
      *x = a;
      return k;
    }
    return -1;
  };
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    if (dead[i]) continue;
    int x = -1;
    const int k = affine(st.nodes[i], &x);
    const Shape& shape = x >= 0 ? st.values[x].shape : Shape{};
    std::vector<float> kv;
    if (k < 0 || !PerChannelConstant(st, k, shape, &kv)) continue;
    const int64_t c = shape[1];
    std::vector<float> scale(c, 1.f), bias(c, 0.f);
    const std::string& op = st.nodes[i].op_type;
    for (int64_t ch = 0; ch < c; ++ch) {
      if (op == "Mul") scale[ch] = kv[ch];
      else bias[ch] = op == "Add" ? kv[ch] : -kv[ch];
    }
    int out = st.nodes[i].outputs[0], steps = 1;
    if (op == "Mul" && Private(st, u, out)) {  // x * s + b
      const int j = u.consumers[out][0];
      int y = -1;
      const int k2 = dead[j] ? -1 : affine(st.nodes[j], &y);
      std::vector<float> bv;
      if (k2 >= 0 && y == out && st.nodes[j].op_type != "Mul" && PerChannelConstant(st, k2, shape, &bv)) {
        for (int64_t ch = 0; ch < c; ++ch) bias[ch] = st.nodes[j].op_type == "Add" ? bv[ch] : -bv[ch];
        out = st.nodes[j].outputs[0];
        dead[j] = 1;
        ++steps;
      }
    }
    bool activation_follows = false;
    if (Private(st, u, out)) {
      Activation act;
      const int j = u.consumers[out][0];
      activation_follows = !dead[j] && FusableActivationOf(st, st.nodes[j], &act);
    }
    if (steps == 1 && !activation_follows) continue;
    Node bn;
    bn.op_type = "BatchNormalization";
    bn.name = st.nodes[i].name;
    auto constant = [&](const std::vector<float>& v) {
      return st.AddConstant(Tensor::FromVector<float>({c}, v));
    };
    bn.inputs = {x, constant(scale), constant(bias), constant(std::vector<float>(c, 0.f)),
                 constant(std::vector<float>(c, 1.f))};
    bn.outputs = {out};
    bn.attrs["epsilon"] = Attribute::Float(0.f);
    st.nodes[i] = std::move(bn);
    changed = true;
    u.consumers.resize(st.values.size());
  }
  if (!changed) return;
  DropDead(st, dead);
}

// (A Conv carrying a pool, written so in a model file, takes nothing more: its output is the pool's.) Group norms take
// the activation that follows them (BiT's GroupNorm + ReLU, diffusion models' GroupNorm + SiLU).
bool Fusable(const Node& n) {
  const std::string& op = n.op_type;
  return (op == "Conv" || op == "Gemm" || op == "MatMul" || op == "BatchNormalization" || op == kGroupNormOp ||
          op == "InstanceNormalization" || op == "GroupNormalization") &&
         n.outputs.size() == 1 && !n.Has("_activation") && !HasFusedPool(n);
}

// Conv(x) + r -> Conv with residual input r; MatMul(x) + r likewise (a transformer's residual connections after its
// projections). Also through a Transpose: Transpose(MatMul(x), p) + r -> Transpose(MatMul(x, r'), p) with
// r' = Transpose(r, p^-1): ConvNeXt's block runs its Linear layers on channels-last data, permutes the result back and
// adds the block's input; once the layout pass stores r channels-last, both Transposes are views of the same bytes.
// The fused node moves to the Add's position, where r is available.
void FuseResidualAdd(CompileState& st) {
  const Uses u = CountUses(st);
  std::vector<int> producer = Producers(st);
  std::vector<char> dead(st.nodes.size(), 0);
  std::vector<Node> inserted_before(st.nodes.size()), inserted_after(st.nodes.size());  // op_type empty: none
  for (size_t j = 0; j < st.nodes.size(); ++j) {
    Node& add = st.nodes[j];
    if (add.op_type != "Add" || !add.domain.empty() || add.NumInputs() != 2 || add.outputs.size() != 1) continue;
    const int out = add.outputs[0];
    for (int side = 0; side < 2; ++side) {
      const int y = add.inputs[side], r = add.inputs[1 - side];
      if (y < 0 || r < 0 || y == r || !Private(st, u, y)) continue;
      if (st.values[y].shape != st.values[r].shape || st.values[y].shape != st.values[out].shape) continue;
      if (st.values[y].dtype != DType::kF32 || st.values[r].dtype != DType::kF32) continue;
      int pi = producer[y], ti = -1;  // the producer, and a Transpose between it and the Add
      if (pi >= 0 && st.nodes[pi].op_type == "Transpose" && st.nodes[pi].domain.empty() &&
          st.nodes[pi].inputs.size() == 1 && st.nodes[pi].inputs[0] >= 0 && Private(st, u, st.nodes[pi].inputs[0])) {
        ti = pi;
        pi = producer[st.nodes[ti].inputs[0]];
      }
      if (pi < 0 || dead[pi]) continue;
      const Node& p = st.nodes[pi];
      const bool conv = p.op_type == "Conv" && ti < 0;
      const bool matmul = p.op_type == "MatMul" && p.domain.empty() && !p.Has("_int8") && p.inputs.size() <= 3;
      if (!(conv || matmul) || !Fusable(p) || p.Has("_residual")) continue;
      int residual = r;
      if (ti >= 0) {
        const size_t rank = st.values[y].shape.size();
        const std::vector<int64_t> perm = TransposePerm(st.nodes[ti], rank);
        std::vector<int64_t> inverse(rank, -1);
        for (size_t d = 0; d < perm.size() && perm.size() == rank; ++d)
          if (perm[d] >= 0 && perm[d] < static_cast<int64_t>(rank)) inverse[perm[d]] = static_cast<int64_t>(d);
        if (std::count(inverse.begin(), inverse.end(), -1) > 0) continue;
        const Shape moved = st.values[p.outputs[0]].shape;  // a copy: AddValue grows st.values
        residual = st.AddValue(DType::kF32, moved);
        Node& back = inserted_before[j];
        back.op_type = "Transpose";
        back.name = add.name + "/residual_transposed";
        back.inputs = {r};
        back.outputs = {residual};
        back.attrs["perm"] = Attribute::Ints(inverse);
      }
      Node fused = st.nodes[pi];
      fused.inputs.resize(4, -1);
      fused.inputs[3] = residual;
      fused.attrs["_residual"] = Attribute::Int(1);
      dead[pi] = 1;
      if (ti >= 0) {
        inserted_after[j] = st.nodes[ti];  // reads the fused node's output as it read the MatMul's, writes the Add's
        inserted_after[j].outputs[0] = out;
        dead[ti] = 1;
      } else {
        fused.outputs[0] = out;
      }
      add = std::move(fused);
      producer[out] = -1;  // nothing fuses into a node with a residual again
      break;
    }
  }
  std::vector<Node> nodes;
  nodes.reserve(st.nodes.size());
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    if (dead[i]) continue;
    if (!inserted_before[i].op_type.empty()) nodes.push_back(std::move(inserted_before[i]));
    nodes.push_back(std::move(st.nodes[i]));
    if (!inserted_after[i].op_type.empty()) nodes.push_back(std::move(inserted_after[i]));
  }
  st.nodes = std::move(nodes);
}

// Whether `n` is a plain 2-D float32 Conv (no fused residual, depthwise or int8 part) with a constant weight of
// `kernel` x `kernel`, a constant or absent bias, dilation 1 and equal strides of 1 or 2; `win` receives its window.
bool SimpleConv2d(const CompileState& st, const Node& n, int64_t kernel, ConvWindow* win) {
  if (n.op_type != "Conv" || n.outputs.size() != 1 || n.Has("_residual") || n.Has("_dw_strides") || n.Has("_int8") ||
      HasFusedPool(n) || n.inputs.size() < 2 || n.inputs[0] < 0 || !IsF32Known(st, n.inputs[1]))
    return false;
  if (n.inputs.size() > 2 && n.inputs[2] >= 0 && !IsF32Known(st, n.inputs[2])) return false;
  const Shape& x = st.values[n.inputs[0]].shape;
  const Shape& w = st.values[n.inputs[1]].shape;
  if (x.size() != 4 || w.size() != 4 || w[2] != kernel || w[3] != kernel) return false;
  if (st.values[n.inputs[0]].dtype != DType::kF32) return false;
  *win = ResolveConvWindow(n, x, {kernel, kernel}, /*ceil_mode=*/false);
  for (int i = 0; i < 2; ++i)
    if (win->dilations[i] != 1 || win->strides[i] != win->strides[0] || win->strides[i] > 2) return false;
  return true;
}

}  // namespace

// A pointwise Conv whose output only a 3x3 depthwise Conv reads -> one Conv with the depthwise part fused
// (ops/fused_depthwise.h), where `fast_kernel_takes` says the fused node has a fast kernel (oneDNN's fused 1x1 +
// depthwise convolution exists for some shapes only; elsewhere the pair stays two nodes).
void FuseConvDepthwise(CompileState& st, const std::function<bool(const Node&)>& fast_kernel_takes) {
  Uses u = CountUses(st);
  std::vector<char> dead(st.nodes.size(), 0);
  std::vector<int> producer = Producers(st);
  bool changed = false;
  for (size_t j = 0; j < st.nodes.size(); ++j) {
    const Node& dw = st.nodes[j];
    ConvWindow dw_win, pw_win;
    if (dead[j] || !SimpleConv2d(st, dw, 3, &dw_win)) continue;
    // oneDNN's depthwise post-op takes one begin pad for both axes (0 or 1; the end pads follow from the output size,
    // which the kernel checks).
    if (dw_win.pad_begin[0] != dw_win.pad_begin[1] || dw_win.pad_begin[0] > 1) continue;
    const int v = dw.inputs[0];
    const Shape& mid = st.values[v].shape;
    if (dw.GetInt("group", 1) != mid[1] || st.values[dw.inputs[1]].shape[0] != mid[1] || !Private(st, u, v)) continue;
    const int pi = producer[v];
    if (pi < 0 || dead[pi]) continue;
    const Node& pw = st.nodes[pi];
    if (!SimpleConv2d(st, pw, 1, &pw_win) || pw_win.strides[0] != 1 || pw.GetInt("group", 1) != 1) continue;
    bool no_pads = true;
    for (int i = 0; i < 2; ++i) no_pads = no_pads && pw_win.pad_begin[i] == 0 && pw_win.pad_end[i] == 0;
    if (!no_pads) continue;
    Node fused =
        FuseDepthwiseInto(pw, dw, {dw_win.pad_begin[0], dw_win.pad_begin[1], dw_win.pad_end[0], dw_win.pad_end[1]});
    if (!fast_kernel_takes(fused)) continue;
    for (int out : dw.outputs)
      if (out >= 0) producer[out] = pi;
    st.nodes[pi] = std::move(fused);
    dead[j] = 1;
    changed = true;
  }
  if (!changed) return;
  DropDead(st, dead);
}

// Conv (with or without a fused residual) whose output only a PRelu with per-channel (or single) constant slopes reads
// -> one Conv with `_prelu` and the slopes as input 6 (ops/activation.h), where `fast_kernel_takes` says oneDNN runs it
// with the PRelu as a post-op. MediaPipe's and MTCNN's models put a PRelu after nearly every convolution.
void FuseConvPRelu(CompileState& st, const std::function<bool(const Node&)>& fast_kernel_takes) {
  Uses u = CountUses(st);
  std::vector<int> producer = Producers(st);
  std::vector<char> dead(st.nodes.size(), 0);
  bool changed = false;
  for (size_t j = 0; j < st.nodes.size(); ++j) {
    const Node& prelu = st.nodes[j];
    if (prelu.op_type != "PRelu" || !prelu.domain.empty() || prelu.inputs.size() != 2 || prelu.outputs.size() != 1)
      continue;
    const int y = prelu.inputs[0];
    if (y < 0 || !Private(st, u, y) || producer[y] < 0) continue;
    const Node& conv = st.nodes[producer[y]];
    if (conv.op_type != "Conv" || conv.outputs.size() != 1 || !conv.GetString("_activation", "").empty() ||
        conv.Has("_dw_strides") || conv.Has("_int8") || conv.Has("_prelu") || HasFusedPool(conv) ||
        st.values[y].dtype != DType::kF32 || st.values[prelu.outputs[0]].shape != st.values[y].shape)
      continue;
    std::vector<float> slopes;
    if (!PerChannelConstant(st, prelu.inputs[1], st.values[y].shape, &slopes)) continue;
    Node fused = conv;
    fused.inputs.resize(kPReluSlopeInput + 1, -1);
    fused.inputs[kPReluSlopeInput] =
        st.AddConstant(Tensor::FromVector<float>({static_cast<int64_t>(slopes.size())}, slopes));
    fused.attrs["_prelu"] = Attribute::Int(1);
    fused.outputs[0] = prelu.outputs[0];
    if (!fast_kernel_takes(fused)) continue;
    producer.resize(st.values.size(), -1);
    producer[fused.outputs[0]] = producer[y];
    st.nodes[producer[y]] = std::move(fused);
    dead[j] = 1;
    changed = true;
  }
  if (!changed) return;
  DropDead(st, dead);
}

namespace {

// `d` as a value times a constant scalar (finite, non-zero): a Div of it by one, or a Mul of it and one on either side
// (the attention's 1 / sqrt(d)); `*x` the value, `*factor` the scalar (inverted for a Div). False for anything else.
bool ScalarScaling(const CompileState& st, const Node& d, int* x, float* factor) {
  if ((d.op_type != "Div" && d.op_type != "Mul") || !d.domain.empty() || d.inputs.size() != 2 ||
      d.outputs.size() != 1 || d.outputs[0] < 0)
    return false;
  const bool first_known = d.op_type == "Mul" && IsF32Known(st, d.inputs[0]);  // Mul commutes, Div does not
  const int c = d.inputs[first_known ? 0 : 1], v = d.inputs[first_known ? 1 : 0];
  if (!IsF32Known(st, c) || st.values[c].value.numel() != 1 || v < 0 || st.values[v].known ||
      st.values[v].shape != st.values[d.outputs[0]].shape)
    return false;
  const float f = st.values[c].value.data<float>()[0];
  if (!std::isfinite(f) || f == 0.f) return false;
  *x = v;
  *factor = d.op_type == "Div" ? 1.f / f : f;
  return true;
}

// What `node` does to a view of its input 0 (Transpose, a shape-only op, a unit-step Slice), into `view`; false where
// the result is not a strided view or the node is none of those.
bool ApplyToView(const CompileState& st, const Node& node, StridedView* view) {
  if (!node.domain.empty() || node.inputs.empty() || node.inputs[0] < 0 || node.outputs.size() != 1) return false;
  const Shape& out = st.values[node.outputs[0]].shape;
  if (node.op_type == "Transpose") {
    const std::vector<int64_t> perm = TransposePerm(node, view->dims.size());
    if (perm.size() != view->dims.size()) return false;
    *view = TransposedView(*view, perm);
    return view->dims == out;
  }
  if (OpRegistry::TraitsOf(node.op_type).same_bytes) return ReshapeView(*view, out, view);
  if (node.op_type != "Slice") return false;
  SliceArgs args;
  const auto known = [&](int i) -> const Tensor* {
    const int v = i < static_cast<int>(node.inputs.size()) ? node.inputs[i] : -1;
    return v >= 0 && st.values[v].known ? &st.values[v].value : nullptr;
  };
  if (!ReadSliceArgs(node, st.opset, known, &args)) return false;
  const SliceRange range = ResolveSlice(view->dims, args, node);
  for (int64_t step : range.step)
    if (step != 1) return false;
  *view = SlicedView(*view, range.first, out);
  return true;
}

// Operand `v` of a MatMul as a view of the furthest value up the chain of view-making nodes (ApplyToView) that make
// it, each one's output read by the next alone: `*source` that value, `absorbed` the chain's nodes.
StridedView OperandView(const CompileState& st, const Uses& u, const std::vector<int>& producer, int v, int* source,
                        std::vector<int>* absorbed) {
  std::vector<int> chain;  // nearest first
  for (int at = v; producer[at] >= 0 && Private(st, u, at);) {
    const Node& n = st.nodes[producer[at]];
    const bool viewing =
        n.domain.empty() && n.outputs.size() == 1 && !n.inputs.empty() && n.inputs[0] >= 0 &&
        (n.op_type == "Transpose" || n.op_type == "Slice" || OpRegistry::TraitsOf(n.op_type).same_bytes);
    if (!viewing || st.values[n.inputs[0]].dtype != DType::kF32 || st.values[n.inputs[0]].known) break;
    chain.push_back(producer[at]);
    at = n.inputs[0];
  }
  // From the furthest value down; where a node's result is not a view, start again from its output.
  *source = chain.empty() ? v : st.nodes[chain.back()].inputs[0];
  StridedView view = DenseView(st.values[*source].shape);
  absorbed->clear();
  for (size_t k = chain.size(); k-- > 0;) {
    const Node& n = st.nodes[chain[k]];
    if (ApplyToView(st, n, &view)) {
      absorbed->push_back(chain[k]);
    } else {
      *source = n.outputs[0];
      view = DenseView(st.values[*source].shape);
      absorbed->clear();
    }
  }
  return view;
}

}  // namespace

// MatMul(views of a, views of b) [-> Transpose] -> one _MatMulViews node (ops/matmul_views.h; plan_impl.h says when).
void FuseMatMulViews(CompileState& st) {
  Uses u = CountUses(st);
  const std::vector<int> producer = Producers(st);
  std::vector<char> dead(st.nodes.size(), 0);
  for (size_t j = 0; j < st.nodes.size(); ++j) {
    Node& mm = st.nodes[j];
    if (mm.op_type != "MatMul" || !mm.domain.empty() || mm.inputs.size() != 2 || mm.outputs.size() != 1 ||
        mm.Has("_bias") || mm.Has("_residual") || mm.Has("_activation") || mm.Has("_int8"))
      continue;
    const int a0 = mm.inputs[0], b0 = mm.inputs[1];
    if (a0 < 0 || b0 < 0 || st.values[a0].known || st.values[b0].known || st.values[a0].dtype != DType::kF32 ||
        st.values[b0].dtype != DType::kF32 || st.values[a0].shape.size() < 2 ||
        st.values[a0].shape.size() != st.values[b0].shape.size() || st.values[a0].shape.size() > 6 ||
        NumElements(st.values[a0].shape) == 0 || NumElements(st.values[b0].shape) == 0)
      continue;  // (empty values are folded before this pass; a view of one would have no element to start at)
    // A scalar Div or Mul of either operand (the attention's 1 / sqrt(d)) becomes the product's scale.
    float scale = 1.f;
    int operand[2] = {a0, b0};
    std::vector<int> absorbed_nodes;
    for (int& o : operand) {
      const int p = producer[o];
      int x = -1;
      float f = 1.f;
      if (p < 0 || !Private(st, u, o) || !ScalarScaling(st, st.nodes[p], &x, &f)) continue;
      scale *= f;
      absorbed_nodes.push_back(p);
      o = x;
    }
    StridedView views[2];
    int sources[2];
    for (int k = 0; k < 2; ++k) {
      std::vector<int> absorbed;
      views[k] = OperandView(st, u, producer, operand[k], &sources[k], &absorbed);
      absorbed_nodes.insert(absorbed_nodes.end(), absorbed.begin(), absorbed.end());
    }
    // oneDNN's strided matmul (gemm:jit) wants each operand's rows or columns contiguous, and the output's rows.
    const size_t rank = views[0].dims.size();
    bool unit = true;
    for (const StridedView& v : views) unit = unit && (v.strides[rank - 1] == 1 || v.strides[rank - 2] == 1);
    if (!unit) continue;
    // The product written through a Transpose that alone reads it and keeps its last axis last.
    const int y = mm.outputs[0];
    int transpose = -1;
    if (Private(st, u, y) && st.nodes[u.consumers[y][0]].op_type == "Transpose" &&
        st.nodes[u.consumers[y][0]].domain.empty()) {
      const std::vector<int64_t> perm = st.nodes[u.consumers[y][0]].GetInts("perm", {});
      if (perm.size() == rank && perm.back() == static_cast<int64_t>(rank) - 1) transpose = u.consumers[y][0];
    }
    if (absorbed_nodes.empty() && transpose < 0) continue;
    bool clash = false;  // a node another MatMul of this pass took already
    for (int n : absorbed_nodes) clash = clash || dead[n];
    if (clash || (transpose >= 0 && dead[transpose])) continue;
    Node fused;
    fused.op_type = kMatMulViewsOp;
    fused.name = mm.name;
    fused.inputs = {sources[0], sources[1]};
    fused.outputs = {y};
    WriteView(fused, "a", views[0]);
    WriteView(fused, "b", views[1]);
    if (scale != 1.f) fused.attrs["scale"] = Attribute::Float(scale);
    if (transpose >= 0) {
      fused.attrs["out_perm"] = Attribute::Ints(st.nodes[transpose].GetInts("perm", {}));
      fused.outputs = {st.nodes[transpose].outputs[0]};
      dead[transpose] = 1;
    }
    for (int n : absorbed_nodes) dead[n] = 1;
    mm = std::move(fused);
  }
  DropDead(st, dead);
}

// MatMul or _MatMulViews (q, k) [-> Div or Mul by a constant scalar] [-> up to two terms added] -> Softmax(last axis)
// -> MatMul or _MatMulViews (the scores whole, v), each value read by the next node alone -> one _AttentionViews node
// (ops/matmul_views.h), where `fast_kernel_takes` it.
void FuseAttentionViews(CompileState& st, const std::function<bool(const Node&)>& fast_kernel_takes) {
  const Uses u = CountUses(st);
  const std::vector<int> producer = Producers(st);
  std::vector<char> dead(st.nodes.size(), 0);
  bool changed = false;
  // A product's operands as views: a _MatMulViews node's, or a plain MatMul's whole operands (equal ranks 2-6).
  auto product_views_of = [&](const Node& n, StridedView* a, StridedView* b, float* scale) {
    if (!n.domain.empty() || n.inputs.size() != 2 || n.outputs.size() != 1 || n.inputs[0] < 0 || n.inputs[1] < 0)
      return false;
    if (n.op_type == kMatMulViewsOp) {
      *a = ReadView(n, "a");
      *b = ReadView(n, "b");
      *scale = n.GetFloat("scale", 1.f);
      return true;
    }
    if (n.op_type != "MatMul" || n.Has("_bias") || n.Has("_residual") || n.Has("_activation") || n.Has("_int8"))
      return false;
    const CompileValue &x = st.values[n.inputs[0]], &y = st.values[n.inputs[1]];
    if (x.known || y.known || x.dtype != DType::kF32 || y.dtype != DType::kF32 || x.shape.size() < 2 ||
        x.shape.size() > 6 || x.shape.size() != y.shape.size() || NumElements(x.shape) == 0 ||
        NumElements(y.shape) == 0)
      return false;
    *a = DenseView(x.shape);
    *b = DenseView(y.shape);
    *scale = 1.f;
    return true;
  };
  // With `residual`, a MatMul with a fused residual (the scores plus a term of their shape, runtime/fusion.cc
  // FuseResiduals: Swin's last stage, whose one window makes the position bias as large as the scores) gives it there.
  auto product_views = [&](const Node& n, StridedView* a, StridedView* b, float* scale, int* residual) {
    if (residual != nullptr && n.op_type == "MatMul" && n.GetInt("_residual", 0) == 1 && n.inputs.size() == 4 &&
        n.inputs[2] < 0 && n.inputs[3] >= 0 && !n.Has("_bias")) {
      Node plain = n;
      plain.inputs.resize(2);
      plain.attrs.erase("_residual");
      *residual = n.inputs[3];
      return product_views_of(plain, a, b, scale);
    }
    return product_views_of(n, a, b, scale);
  };
  for (size_t j = 0; j < st.nodes.size(); ++j) {
    const Node& softmax = st.nodes[j];
    if (softmax.op_type != "Softmax" || !softmax.domain.empty() || softmax.inputs.size() != 1 ||
        softmax.outputs.size() != 1 || softmax.inputs[0] < 0)
      continue;
    const int scores = softmax.inputs[0], probs = softmax.outputs[0];
    const int64_t rank = static_cast<int64_t>(st.values[scores].shape.size());
    int64_t axis = softmax.GetInt("axis", st.opset >= 13 ? -1 : 1);
    if (axis < 0) axis += rank;
    // (Before opset 13 the axis flattens what follows it into one: the same as the last axis only for the last.)
    if (axis != rank - 1 || st.values[scores].dtype != DType::kF32 || producer[scores] < 0 || !Private(st, u, scores) ||
        !Private(st, u, probs))
      continue;
    const int second = u.consumers[probs][0];
    const Shape score_shape = st.values[scores].shape;  // (a copy: AddConstant below grows st.values)
    // Up from the Softmax: terms added to the scores (each a value and the shape the scores had where it was added:
    // an Add of something that broadcasts to them, or Reshape -> Add of a constant -> Reshape back, Swin's shifted-
    // window mask), then a Div or Mul of the scores by a constant scalar (BERT-style exports scale the scores, not
    // q), then the product. Each value on the way is read by the next node alone.
    std::vector<std::pair<int, Shape>> terms;
    std::vector<int> absorbed;
    int at = scores;
    auto private_producer = [&](int value) {
      return value >= 0 && !st.values[value].known && Private(st, u, value) && producer[value] >= 0 &&
                     !dead[producer[value]]
                 ? producer[value]
                 : -1;
    };
    // An Add's operand that is not `from` when `from` is one of them, else -1; *term the other.
    auto add_of = [&](const Node& n, int* from, int* term) {
      if (n.op_type != "Add" || !n.domain.empty() || n.inputs.size() != 2 || n.outputs.size() != 1) return false;
      for (int side = 0; side < 2; ++side) {
        const int x = n.inputs[side], t = n.inputs[1 - side];
        if (x < 0 || t < 0 || x == t || st.values[t].dtype != DType::kF32 ||
            st.values[x].shape != st.values[n.outputs[0]].shape || private_producer(x) < 0)
          continue;
        *from = x;
        *term = t;
        return true;
      }
      return false;
    };
    while (terms.size() < 2) {
      const int pi = private_producer(at);
      if (pi < 0) break;
      const Node& n = st.nodes[pi];
      int x = -1, t = -1;
      if (add_of(n, &x, &t)) {
        terms.emplace_back(t, st.values[at].shape);
        absorbed.push_back(pi);
        at = x;
        continue;
      }
      if (n.op_type != "Reshape" || !n.domain.empty() || n.outputs.size() != 1) break;
      const int inner = private_producer(n.inputs[0]);
      if (inner < 0 || !add_of(st.nodes[inner], &x, &t) || !st.values[t].known) break;
      const int r1 = private_producer(x);
      if (r1 < 0 || st.nodes[r1].op_type != "Reshape" || !st.nodes[r1].domain.empty() ||
          st.values[st.nodes[r1].inputs[0]].shape != score_shape)
        break;
      terms.emplace_back(t, st.values[x].shape);
      absorbed.insert(absorbed.end(), {pi, inner, r1});
      at = st.nodes[r1].inputs[0];
    }
    float factor = 1.f;
    if (const int pi = private_producer(at); pi >= 0) {
      int x = -1;
      if (ScalarScaling(st, st.nodes[pi], &x, &factor)) {
        absorbed.push_back(pi);
        at = x;
      }
    }
    const int first = private_producer(at);
    if (first < 0) continue;
    if (dead[first] || dead[second]) continue;
    StridedView q, k, p, v;
    float scale = 1.f, second_scale = 1.f;
    const Node &a = st.nodes[first], &b = st.nodes[second];
    int residual = -1;
    if (!product_views(a, &q, &k, &scale, &residual) || a.Has("out_perm") ||
        !product_views(b, &p, &v, &second_scale, nullptr) || second_scale != 1.f || b.inputs[0] != probs ||
        b.inputs[1] == probs)
      continue;
    scale *= factor;
    if (residual >= 0) {  // added before any factor would be folded into the scale: none may be there
      if (factor != 1.f) continue;
      terms.emplace_back(residual, score_shape);
    }
    const StridedView whole = DenseView(st.values[probs].shape);  // the second product reads the probabilities whole
    if (p.offset != 0 || p.dims != whole.dims || p.strides != whole.strides ||
        static_cast<int64_t>(q.dims.size()) != rank)
      continue;
    // One term added at the scores' own shape is the node's bias as it is; more, or one added in another shape, are
    // summed now into one constant of the scores' shape (they must be constants, the sum at most kMaxBiasFloats).
    int bias = -1;
    if (terms.size() == 1 && terms[0].second == score_shape) {
      bias = terms[0].first;
      if (!BroadcastsTo(st.values[bias].shape, score_shape)) continue;
    } else if (!terms.empty()) {
      constexpr int64_t kMaxBiasFloats = int64_t{1} << 24;
      bool constant = NumElements(score_shape) <= kMaxBiasFloats;
      for (const auto& [t, shape] : terms)
        constant = constant && IsF32Known(st, t) && BroadcastsTo(st.values[t].shape, shape);
      if (!constant) continue;
      std::vector<float> sum(static_cast<size_t>(NumElements(score_shape)), 0.f);
      for (const auto& [t, shape] : terms) {
        const StridedView from = BroadcastView(st.values[t].shape, shape);
        const float* data = st.values[t].value.data<float>();
        for (size_t flat = 0; flat < sum.size(); ++flat) {
          int64_t rest = static_cast<int64_t>(flat), offset = 0;
          for (size_t d = shape.size(); d-- > 0;) {
            offset += rest % shape[d] * from.strides[d];
            rest /= shape[d];
          }
          sum[flat] += data[offset];
        }
      }
      bias = st.AddConstant(Tensor::FromVector<float>(score_shape, sum));
    }
    Node fused;
    fused.op_type = kAttentionViewsOp;
    fused.name = b.name;
    fused.inputs = {a.inputs[0], a.inputs[1], b.inputs[1]};
    if (bias >= 0) fused.inputs.push_back(bias);
    fused.outputs = b.outputs;
    WriteView(fused, "q", q);
    WriteView(fused, "k", k);
    WriteView(fused, "v", v);
    if (scale != 1.f) fused.attrs["scale"] = Attribute::Float(scale);
    if (b.Has("out_perm")) fused.attrs["out_perm"] = Attribute::Ints(b.GetInts("out_perm", {}));
    if (!fast_kernel_takes(fused)) continue;
    st.nodes[second] = std::move(fused);
    dead[first] = dead[j] = 1;
    for (int n : absorbed) dead[n] = 1;
    changed = true;
  }
  if (changed) DropDead(st, dead);
}

// Mul(x, s) -> 1x1 Conv, where s holds one factor per image and channel ([N, C, 1, 1] or [1, C, 1, 1], computed at run
// time: a squeeze-and-excitation gate) -> one Conv with `_input_scale` and s as input 7 (ops/conv_input_scale.h), for
// plans on the CPU's fast kernels: osprey's 1x1 kernel scales the input where it reads it, oneDNN's path scales it in
// a pass of its own (what the Mul did). The Conv stays where it is: x and s were both read by the Mul before it.
void FuseConvInputScale(CompileState& st) {
  const Uses u = CountUses(st);
  const std::vector<int> producer = Producers(st);
  std::vector<char> dead(st.nodes.size(), 0);
  bool changed = false;
  for (size_t j = 0; j < st.nodes.size(); ++j) {
    Node& conv = st.nodes[j];
    if (conv.op_type != "Conv" || !conv.domain.empty() || conv.inputs.empty() || conv.outputs.size() != 1 ||
        conv.GetInt("group", 1) != 1 || conv.Has("_int8") || conv.Has("_dw_strides") || HasInputScale(conv) ||
        HasFusedPool(conv))
      continue;
    const int m = conv.inputs[0];
    if (m < 0 || !Private(st, u, m) || producer[m] < 0 || dead[producer[m]]) continue;
    const Shape& ms = st.values[m].shape;
    const int w = conv.inputs.size() > 1 ? conv.inputs[1] : -1;
    if (ms.size() != 4 || st.values[m].dtype != DType::kF32 || w < 0 || st.values[w].shape.size() != 4 ||
        st.values[w].shape[2] != 1 || st.values[w].shape[3] != 1)
      continue;
    const Node& mul = st.nodes[producer[m]];
    if (mul.op_type != "Mul" || !mul.domain.empty() || mul.inputs.size() != 2 || mul.Has("_then")) continue;
    int x = -1, scale = -1;
    for (int side = 0; side < 2; ++side) {
      const int a = mul.inputs[side], b = mul.inputs[1 - side];
      if (a < 0 || b < 0 || st.values[a].shape != ms || st.values[b].dtype != DType::kF32) continue;
      const Shape& bs = st.values[b].shape;
      if (bs.size() == 4 && (bs[0] == 1 || bs[0] == ms[0]) && bs[1] == ms[1] && bs[2] == 1 && bs[3] == 1) {
        x = a;
        scale = b;
        break;
      }
    }
    if (x < 0 || st.values[x].dtype != DType::kF32) continue;
    conv.inputs.resize(kInputScaleInput + 1, -1);
    conv.inputs[0] = x;
    conv.inputs[kInputScaleInput] = scale;
    conv.attrs["_input_scale"] = Attribute::Int(1);
    dead[producer[m]] = 1;
    changed = true;
  }
  if (changed) DropDead(st, dead);
}

// After the layout pass, on channels-last values: Concat (along the channels) -> BatchNormalization (inference, no
// activation or ReLU) -> 1x1 Conv, each read by the next alone, either of the first two optional -> one Conv with
// `_input_parts` (the Concat's inputs) and `_input_affine` (the normalisation's per-channel a and b, `_input_relu`)
// (ops/conv_input_scale.h), where `fast_kernel_takes` it (osprey's 1x1 kernel, which forms its input chunk by chunk
// where it reads it): the passes that wrote and read the whole concatenated, normalised feature map are gone. DenseNet
// concatenates every earlier feature map and normalises it before each 1x1 layer; SqueezeNet's fire modules, YOLO's
// C2f and SPPF blocks concatenate before one.
// Only where the Conv's input takes at least kMinFusedInputBytes: smaller ones stay in a core's cache between the
// passes, which then cost little, and osprey's kernel ran some of those layers slower than oneDNN's (DenseNet-121 at
// batch 1 on a Zen 4: its last block's 100-200 KB inputs 1.46-1.51 ms fused against 1.25-1.27, its first block's
// 0.8-3.2 MB 3.5-3.6 against 4.0-4.1; docs/performance.md "Fortieth session").
constexpr int64_t kMinFusedInputBytes = int64_t{1} << 20;

namespace {
// DropDead for the passes after AssignLayouts: the nodes' transparency marks (CompileState::transparent) follow.
void DropDeadAfterLayouts(CompileState& st, const std::vector<char>& dead) {
  std::vector<char> transparent;
  for (size_t i = 0; i < st.nodes.size(); ++i)
    if (!dead[i]) transparent.push_back(st.transparent[i]);
  DropDead(st, dead);
  st.transparent = std::move(transparent);
}
}  // namespace

void FuseConvInputs(CompileState& st, const std::function<bool(const Node&)>& fast_kernel_takes) {
  const Uses u = CountUses(st);
  const std::vector<int> producer = Producers(st);
  std::vector<char> dead(st.nodes.size(), 0);
  auto nhwc_f32 = [&](int v) {
    return v >= 0 && st.layouts[v] == Layout::kNhwc && st.values[v].dtype == DType::kF32 &&
           st.values[v].shape.size() == 4;
  };
  // The live node writing private NHWC value `v` if it is a `op` node, else -1.
  auto private_producer = [&](int v, const char* op) {
    if (!nhwc_f32(v) || !Private(st, u, v) || producer[v] < 0 || dead[producer[v]]) return -1;
    const Node& n = st.nodes[producer[v]];
    return n.op_type == op && n.domain.empty() && n.outputs.size() == 1 ? producer[v] : -1;
  };
  bool changed = false;
  for (size_t j = 0; j < st.nodes.size(); ++j) {
    const Node& conv = st.nodes[j];
    if (conv.op_type != "Conv" || !conv.domain.empty() || conv.outputs.size() != 1 || conv.inputs.size() < 2 ||
        conv.inputs.size() > kInputScaleInput || conv.GetInt("group", 1) != 1 || conv.Has("_int8") ||
        conv.Has("_dw_strides") || conv.Has("_prelu") || HasFusedInput(conv) || HasFusedPool(conv) ||
        !nhwc_f32(conv.inputs[0]) ||
        NumElements(st.values[conv.inputs[0]].shape) * int64_t{sizeof(float)} < kMinFusedInputBytes)
      continue;
    Node fused = conv;
    int x = conv.inputs[0];
    std::vector<int> absorbed;
    const int bn_index = private_producer(x, "BatchNormalization");
    if (bn_index >= 0) {
      const Node& bn = st.nodes[bn_index];
      const int64_t channels = st.values[x].shape[1];
      bool known = bn.inputs.size() == 5 && bn.GetInt("training_mode", 0) == 0 && nhwc_f32(bn.inputs[0]);
      for (int k = 1; k <= 4 && known; ++k)
        known = IsF32Known(st, bn.inputs[k]) && st.values[bn.inputs[k]].value.numel() == channels;
      const std::string act = bn.GetString("_activation", "");
      if (known && (act.empty() || act == "Relu")) {
        // The BatchNormalization kernels' own factors (ops/batch_norm.h).
        const float* gamma = st.values[bn.inputs[1]].value.data<float>();
        const float* beta = st.values[bn.inputs[2]].value.data<float>();
        const float* mean = st.values[bn.inputs[3]].value.data<float>();
        const float* var = st.values[bn.inputs[4]].value.data<float>();
        const float eps = bn.GetFloat("epsilon", 1e-5f);
        Tensor a(DType::kF32, {channels}), b(DType::kF32, {channels});
        for (int64_t c = 0; c < channels; ++c)
          BatchNormFactors(gamma[c], beta[c], mean[c], var[c], eps, a.data<float>() + c, b.data<float>() + c);
        fused.inputs.resize(kInputAffineShift + 1, -1);
        fused.inputs[kInputAffineScale] = st.AddConstant(std::move(a));
        fused.inputs[kInputAffineShift] = st.AddConstant(std::move(b));
        st.layouts.resize(st.values.size(), Layout::kPlain);
        fused.attrs["_input_affine"] = Attribute::Int(1);
        if (!act.empty()) fused.attrs["_input_relu"] = Attribute::Int(1);
        x = bn.inputs[0];
        absorbed.push_back(bn_index);
      }
    }
    const int concat_index = private_producer(x, "Concat");
    if (concat_index >= 0) {
      const Node& concat = st.nodes[concat_index];
      const int64_t axis = concat.GetInt("axis", 0);
      bool parts_ok = (axis == 1 || axis == -3) && concat.inputs.size() >= 2 &&
                      static_cast<int>(concat.inputs.size()) <= kMaxInputParts;
      for (int v : concat.inputs) parts_ok = parts_ok && nhwc_f32(v) && st.values[v].shape[1] >= 1;
      if (parts_ok) {
        std::vector<int64_t> channels;
        for (int v : concat.inputs) channels.push_back(st.values[v].shape[1]);
        fused.inputs.resize(InputPartIndex(static_cast<int>(channels.size()) - 1) + 1, -1);
        for (size_t i = 0; i < channels.size(); ++i)
          fused.inputs[InputPartIndex(static_cast<int>(i))] = concat.inputs[i];
        fused.attrs["_input_parts"] = Attribute::Ints(std::move(channels));
        x = -1;
        absorbed.push_back(concat_index);
      }
    }
    if (absorbed.empty()) continue;
    if (x >= 0) fused.inputs[0] = x;
    if (!fast_kernel_takes(fused)) continue;
    st.nodes[j] = std::move(fused);
    for (int n : absorbed) dead[n] = 1;
    changed = true;
  }
  if (changed) DropDeadAfterLayouts(st, dead);
}

// After AssignLayouts: a Conv whose output only a 2-D MaxPool (dilation 1, no Indices) reads -> one Conv with the pool
// fused (ops/fused_pool.h), where `fast_kernel_takes` the fused node (osprey's first-layer kernel, an image of 1-4
// channels, plain or channels-last, into channels-last output, applies and, when tuning, times faster than the unfused
// pair: CpuConvFusesPool), which pools the convolution's rows in the cache.
// ResNet, DenseNet, GoogLeNet, ShuffleNet and SqueezeNet start so; SqueezeNet's first convolution writes 36 MB at batch
// 8 that its pool read back (docs/performance.md, "Forty-second session").
void FuseConvMaxPool(CompileState& st, const std::function<bool(const Node&)>& fast_kernel_takes) {
  const Uses u = CountUses(st);
  const std::vector<int> producer = Producers(st);
  std::vector<char> dead(st.nodes.size(), 0);
  bool changed = false;
  for (size_t j = 0; j < st.nodes.size(); ++j) {
    const Node& pool = st.nodes[j];
    if (pool.op_type != "MaxPool" || !pool.domain.empty() || pool.inputs.size() != 1 || pool.outputs.size() != 1 ||
        pool.outputs[0] < 0)
      continue;
    const int y = pool.inputs[0];
    if (y < 0 || !Private(st, u, y) || producer[y] < 0 || dead[producer[y]]) continue;
    const int ci = producer[y];
    const Node& conv = st.nodes[ci];
    const Shape& mid = st.values[y].shape;
    if (conv.op_type != "Conv" || !conv.domain.empty() || conv.outputs.size() != 1 || HasFusedPool(conv) ||
        CarriesAnotherFusedPart(conv) || st.values[y].dtype != DType::kF32 || mid.size() != 4 ||
        st.layouts[y] != Layout::kNhwc || st.layouts[pool.outputs[0]] != Layout::kNhwc)
      continue;
    const std::vector<int64_t> kernel = pool.GetInts("kernel_shape", {});
    if (kernel.size() != 2) continue;
    ConvWindow win;
    try {
      win = ResolveConvWindow(pool, mid, kernel, pool.GetInt("ceil_mode", 0) != 0);
    } catch (const Error&) {
      continue;  // the shape rule would have refused it; leave the pool to say so
    }
    if (win.dilations != std::vector<int64_t>{1, 1}) continue;
    Node fused = FusePoolInto(conv, pool, {win.pad_begin[0], win.pad_begin[1], win.pad_end[0], win.pad_end[1]});
    if (!fast_kernel_takes(fused)) continue;
    st.nodes[ci] = std::move(fused);
    dead[j] = 1;
    changed = true;
  }
  if (changed) DropDeadAfterLayouts(st, dead);
}

// The step a unary node computes, if it can join a chain (ops/activation.h UnaryStep): an activation the fusion pass
// reads (constant Clip bounds), or a fake quantisation (a Round with `_quant_scale`, fusion_qdq.cc).
bool StepOfNode(const CompileState& st, const Node& n, UnaryStep* step) {
  if (!n.domain.empty() || n.outputs.size() != 1 || n.Has("_then") || n.inputs.empty()) return false;
  if (n.op_type == "Round") {
    if (!n.Has("_quant_scale")) return false;
    step->fake_quantize = true;
    step->scale = n.GetFloat("_quant_scale", 1.f);
    step->lo = n.GetFloat("_quant_lo", 0.f);
    step->hi = n.GetFloat("_quant_hi", 0.f);
    return true;
  }
  step->fake_quantize = false;
  return FusableActivationOf(st, n, &step->act);
}

// An elementwise node (ops/activation.h CarriesFusedSteps) whose output only a unary activation or fake quantisation
// reads takes it as a fused step (`_then`), and so on along the chain: one pass over the data instead of one per op.
// Full-integer TFLite models converted by tf2onnx are chains of them (Add -> Relu -> QuantizeLinear ->
// DequantizeLinear after every residual add; Sigmoid -> Q -> DQ and Mul -> Q -> DQ for each SiLU).
void FuseElementwiseChains(CompileState& st) {
  const Uses u = CountUses(st);
  std::vector<char> dead(st.nodes.size(), 0);
  bool changed = false;
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    Node& carrier = st.nodes[i];
    if (dead[i] || !carrier.domain.empty() || !CarriesFusedSteps(carrier.op_type) || carrier.outputs.size() != 1 ||
        carrier.Has("_then"))
      continue;
    std::vector<UnaryStep> steps;
    while (steps.size() < UnaryStep::kMaxSteps) {
      const int y = carrier.outputs[0];
      if (y < 0 || st.values[y].dtype != DType::kF32 || !Private(st, u, y)) break;
      const int j = u.consumers[y][0];
      const Node& next = st.nodes[j];
      UnaryStep step;
      if (dead[j] || next.inputs[0] != y || !StepOfNode(st, next, &step) ||
          st.values[next.outputs[0]].dtype != DType::kF32 || st.values[next.outputs[0]].shape != st.values[y].shape)
        break;
      steps.push_back(step);
      carrier.outputs[0] = next.outputs[0];
      dead[j] = 1;
    }
    if (steps.empty()) continue;
    WriteFusedSteps(carrier, steps);
    changed = true;
  }
  if (!changed) return;
  DropDead(st, dead);
}

namespace {

// Conv/Gemm/MatMul followed by a unary activation (or x * Sigmoid(x)) -> one node with _activation.
void FuseActivation(CompileState& st) {
  Uses u = CountUses(st);
  std::vector<char> dead(st.nodes.size(), 0);
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    Node& n = st.nodes[i];
    if (dead[i] || !Fusable(n) || st.values[n.outputs[0]].dtype != DType::kF32) continue;
    int y = n.outputs[0];
    if (st.is_graph_output[y]) continue;
    const auto& cons = u.consumers[y];
    if (cons.size() == 1) {
      // Also through data movement: Act(Transpose(y)) = Transpose(Act(y)) for an elementwise activation, and so
      // through a Reshape (the blocks whose residual FuseResidualAdd fused through the Transpose; a convolution on
      // tokens, SwapTokenImageTransposes: Conv -> Transpose -> Reshape -> Gelu).
      int ai = cons[0], last = -1, moved = y;
      for (int hops = 0; hops < 2; ++hops) {
        const Node& t = st.nodes[ai];
        const bool movement = t.op_type == "Transpose" || OpRegistry::TraitsOf(t.op_type).same_bytes;
        if (!movement || !t.domain.empty() || t.inputs.empty() || t.inputs[0] != moved || t.outputs.size() != 1 ||
            t.outputs[0] < 0 || !Private(st, u, t.outputs[0]))
          break;
        last = ai;
        moved = t.outputs[0];
        ai = u.consumers[moved][0];
      }
      const Node& a = st.nodes[ai];
      Activation act;
      if (dead[ai] || a.inputs.empty() || a.inputs[0] != moved || !FusableActivationOf(st, a, &act)) continue;
      act.WriteTo(n);
      (last >= 0 ? st.nodes[last] : n).outputs[0] = a.outputs[0];
      dead[ai] = 1;
    } else if (cons.size() == 2) {
      // SiLU as exported by PyTorch: Mul(y, Sigmoid(y)).
      int si = -1, mi = -1;
      for (int c : cons) {
        if (st.nodes[c].op_type == "Sigmoid") si = c;
        if (st.nodes[c].op_type == "Mul") mi = c;
      }
      if (si < 0 || mi < 0) continue;
      int s_out = st.nodes[si].outputs[0];
      const Node& mul = st.nodes[mi];
      if (!Private(st, u, s_out) || u.consumers[s_out][0] != mi) continue;
      if (!((mul.inputs[0] == y && mul.inputs[1] == s_out) || (mul.inputs[1] == y && mul.inputs[0] == s_out))) continue;
      Activation{ActivationKind::kSilu, 1.f, 0.f}.WriteTo(n);
      n.outputs[0] = mul.outputs[0];
      dead[si] = dead[mi] = 1;
    }
  }
  DropDead(st, dead);
}

// ResizeImage -> CropImage (osprey domain) -> one ResizeImage computing only the cropped window (roi_* attributes,
// docs/image-ops.md), composed with the resize's own roi if it has one. Bit-identical: the same taps, fewer pixels.
void FuseResizeCrop(CompileState& st) {
  Uses u = CountUses(st);
  std::vector<char> dead(st.nodes.size(), 0);
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    Node& resize = st.nodes[i];
    if (dead[i] || resize.op_type != "ResizeImage" || resize.domain != "osprey" || resize.outputs.size() != 1) continue;
    const int y = resize.outputs[0];
    if (!Private(st, u, y)) continue;
    const int j = u.consumers[y][0];
    const Node& crop = st.nodes[j];
    if (crop.op_type != "CropImage" || crop.domain != "osprey" || crop.inputs.size() != 1 || crop.inputs[0] != y ||
        crop.outputs.size() != 1)
      continue;
    const int64_t height = resize.GetInt("height", 0), width = resize.GetInt("width", 0);
    const int64_t rt = resize.GetInt("roi_top", 0), rl = resize.GetInt("roi_left", 0);
    const int64_t rh = resize.GetInt("roi_height", height - rt), rw = resize.GetInt("roi_width", width - rl);
    const int64_t ct = crop.GetInt("top", -1), cl = crop.GetInt("left", -1);
    const int64_t ch = crop.GetInt("height", 0), cw = crop.GetInt("width", 0);
    if (ct < 0 || cl < 0 || ch < 1 || cw < 1 || ct > rh - ch || cl > rw - cw) continue;  // inference rejected it
    resize.attrs["roi_top"] = Attribute::Int(rt + ct);
    resize.attrs["roi_left"] = Attribute::Int(rl + cl);
    resize.attrs["roi_height"] = Attribute::Int(ch);
    resize.attrs["roi_width"] = Attribute::Int(cw);
    // The resize now produces the crop's output; it stays at its position (its only input is earlier).
    resize.outputs[0] = crop.outputs[0];
    dead[j] = 1;
  }
  DropDead(st, dead);
}

bool IsIdentityNode(const Node& n) {
  return n.op_type == "Identity" || (n.op_type == "Dropout" && n.outputs.size() == 1);
}

// Identity, inference Dropout and all-zero Pad copy their input: consumers read the input instead. One naming a graph
// output stays, unless the node writing its input (read by nothing else) can write the output itself: PaddleOCR's
// exports end in such an Identity (a 12.7 MB copy, 3% of PP-OCRv2 recognition at batch 6).
void EliminateIdentities(CompileState& st) {
  std::vector<int> alias(st.values.size());
  for (size_t v = 0; v < alias.size(); ++v) alias[v] = static_cast<int>(v);
  std::vector<Node> kept;
  for (Node& n : st.nodes) {
    for (int& v : n.inputs)
      if (v >= 0) v = alias[v];
    bool identity = IsIdentityNode(n);
    if (n.op_type == "Pad" && n.GetString("mode", "constant") == "constant") {
      std::vector<int64_t> pads;
      if (st.opset < 11) {
        pads = n.GetInts("pads");
      } else if (n.inputs.size() > 1 && n.inputs[1] >= 0 && st.values[n.inputs[1]].known) {
        pads = st.values[n.inputs[1]].value.ToInt64Vector();
      } else {
        pads = {1};
      }
      identity = std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; });
    }
    int out = n.outputs.empty() ? -1 : n.outputs[0];
    if (identity && out >= 0 && !st.is_graph_output[out] && n.inputs[0] >= 0 &&
        st.values[n.inputs[0]].dtype == st.values[out].dtype && st.values[n.inputs[0]].shape == st.values[out].shape) {
      alias[out] = n.inputs[0];
      continue;
    }
    kept.push_back(std::move(n));
  }
  st.nodes = std::move(kept);

  const Uses u = CountUses(st);
  const std::vector<int> producer = Producers(st);
  std::vector<char> dead(st.nodes.size(), 0);
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    const Node& n = st.nodes[i];
    if (!IsIdentityNode(n) || n.inputs.empty()) continue;
    const int in = n.inputs[0], out = n.outputs[0];
    if (in < 0 || out < 0 || !st.is_graph_output[out] || !Private(st, u, in) || producer[in] < 0 ||
        st.values[in].known || st.values[out].known || st.values[in].dtype != st.values[out].dtype ||
        st.values[in].shape != st.values[out].shape)
      continue;
    for (int& o : st.nodes[static_cast<size_t>(producer[in])].outputs)
      if (o == in) o = out;
    dead[i] = 1;
  }
  DropDead(st, dead);
}

// Pad(x) -> Transpose(perm), the Pad's output read by the Transpose alone -> Transpose(x) -> Pad(pads permuted).
// tf2onnx writes "same" padding of a strided convolution as a Pad on the NHWC tensor, then the Transpose to NCHW, then
// the Conv, when its transpose optimiser gives up (MobileNetV3); moved behind the Transpose, the Pad meets the Conv
// and FoldZeroPadIntoConsumer folds it. Constant mode with constant pads and no axes input only.
void SwapPadTranspose(CompileState& st) {
  Uses u = CountUses(st);
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    const Node& pad = st.nodes[i];
    if (pad.op_type != "Pad" || pad.outputs.size() != 1 || pad.GetString("mode", "constant") != "constant") continue;
    const int x = pad.inputs[0], y = pad.outputs[0];
    if (x < 0 || !Private(st, u, y)) continue;
    const size_t ti = static_cast<size_t>(u.consumers[y][0]);
    if (ti <= i) continue;
    const Node& tr = st.nodes[ti];
    if (tr.op_type != "Transpose" || tr.inputs.size() != 1 || tr.inputs[0] != y || tr.outputs.size() != 1) continue;
    const Shape& xs = st.values[x].shape;
    const size_t rank = xs.size();
    std::vector<int64_t> pads;
    if (st.opset < 11) {
      pads = pad.GetInts("pads");
    } else {
      if (pad.inputs.size() < 2 || pad.inputs[1] < 0 || !st.values[pad.inputs[1]].known) continue;
      if (pad.inputs.size() > 3 && pad.inputs[3] >= 0) continue;
      pads = st.values[pad.inputs[1]].value.ToInt64Vector();
    }
    const std::vector<int64_t> perm = TransposePerm(tr, rank);
    if (pads.size() != 2 * rank || perm.size() != rank) continue;
    std::vector<int64_t> new_pads(2 * rank);
    Shape moved(rank);
    bool ok = true;
    for (size_t d = 0; d < rank; ++d) {
      if (perm[d] < 0 || perm[d] >= static_cast<int64_t>(rank)) ok = false;
      if (!ok) break;
      new_pads[d] = pads[perm[d]];
      new_pads[rank + d] = pads[rank + perm[d]];
      moved[d] = xs[perm[d]];
    }
    if (!ok) continue;
    const int mid = st.AddValue(st.values[x].dtype, moved);
    u.consumers.resize(st.values.size());
    Node new_tr = tr;  // Transpose(x) -> mid, at the Pad's position
    new_tr.inputs[0] = x;
    new_tr.outputs[0] = mid;
    Node new_pad = pad;  // Pad(mid) -> the Transpose's output, at the Transpose's position
    new_pad.inputs[0] = mid;
    new_pad.outputs[0] = tr.outputs[0];
    if (st.opset < 11) {
      new_pad.attrs["pads"] = Attribute::Ints(new_pads);
    } else {
      new_pad.inputs[1] = st.AddConstant(Tensor::FromVector<int64_t>({static_cast<int64_t>(2 * rank)}, new_pads));
      u.consumers.resize(st.values.size());
    }
    st.nodes[i] = std::move(new_tr);
    st.nodes[ti] = std::move(new_pad);
    u = CountUses(st);
  }
}

// Tokens [B, N, C] as an image [B, C, H, W] and back, as transformers write it around convolutions on tokens
// (SegFormer/PVTv2's Mix-FFN and spatial reduction, patch embeddings: x.transpose(1, 2).view(B, C, H, W), then
// y.flatten(2).transpose(1, 2)):
//   Transpose(x [B, N, C], perm 0,2,1) -> Reshape [B, C, H, W]    becomes  Reshape [B, H, W, C] -> Transpose 0,3,1,2
//   Reshape(y [B, C, H, W]) -> [B, C, N] -> Transpose(perm 0,2,1)  becomes  Transpose 0,2,3,1 -> Reshape [B, N, C]
// the same values, with the Transposes now between plain [B, H, W, C] and channels-last [B, C, H, W]: the layout pass
// makes them views (layout.cc ChannelTranspose), where before both moved every element and the image went through a
// reorder to plain for the Reshape. The middle value must be read by the second node alone.
void SwapTokenImageTransposes(CompileState& st) {
  Uses u = CountUses(st);
  auto reshape_to = [&](const Node& like, int in, const Shape& to, int out) {
    Node r = like;
    r.inputs = {in, st.AddConstant(Tensor::FromVector<int64_t>({static_cast<int64_t>(to.size())}, to))};
    r.outputs = {out};
    r.attrs.erase("allowzero");
    return r;
  };
  auto transpose_of = [](const Node& like, int in, std::vector<int64_t> perm, int out) {
    Node t = like;
    t.inputs = {in};
    t.outputs = {out};
    t.attrs["perm"] = Attribute::Ints(std::move(perm));
    return t;
  };
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    const Node& first = st.nodes[i];
    if (first.outputs.size() != 1 || first.inputs.empty() || first.inputs[0] < 0 || first.outputs[0] < 0 ||
        !first.domain.empty() || (first.op_type != "Transpose" && first.op_type != "Reshape"))
      continue;
    const int x = first.inputs[0], mid = first.outputs[0];
    if (!Private(st, u, mid) || st.values[x].known || st.values[x].dtype != DType::kF32) continue;
    const size_t si = static_cast<size_t>(u.consumers[mid][0]);
    if (si <= i) continue;
    const Node& second = st.nodes[si];
    if (second.outputs.size() != 1 || second.outputs[0] < 0 || second.inputs.empty() || second.inputs[0] != mid ||
        !second.domain.empty())
      continue;
    const Shape &xs = st.values[x].shape, &ys = st.values[second.outputs[0]].shape;
    const std::vector<int64_t> swap_last{0, 2, 1};
    Node a, b;
    if (first.op_type == "Transpose" && second.op_type == "Reshape" && xs.size() == 3 &&
        TransposePerm(first, 3) == swap_last && ys.size() == 4 && ys[0] == xs[0] && ys[1] == xs[2] &&
        ys[2] * ys[3] == xs[1]) {
      const Shape nhwc{ys[0], ys[2], ys[3], ys[1]};
      const int tmp = st.AddValue(DType::kF32, nhwc);
      a = reshape_to(second, x, nhwc, tmp);
      b = transpose_of(first, tmp, {0, 3, 1, 2}, second.outputs[0]);
    } else if (first.op_type == "Reshape" && second.op_type == "Transpose" && xs.size() == 4 &&
               st.values[mid].shape.size() == 3 && TransposePerm(second, 3) == swap_last && ys.size() == 3 &&
               ys[0] == xs[0] && ys[2] == xs[1] && ys[1] == xs[2] * xs[3]) {
      const Shape nhwc{xs[0], xs[2], xs[3], xs[1]};
      const int tmp = st.AddValue(DType::kF32, nhwc);
      a = transpose_of(second, x, {0, 2, 3, 1}, tmp);
      b = reshape_to(first, tmp, ys, second.outputs[0]);
    } else {
      continue;
    }
    st.nodes[i] = std::move(a);
    st.nodes[si] = std::move(b);
    u = CountUses(st);
  }
}

// Pad(x, zeros on H/W) -> Conv or AveragePool without padding: the consumer pads instead (zero padding is what Conv
// does, and an average over explicit zeros is AveragePool with count_include_pad = 1). Exporters write this pattern for
// AvgPool2d(padding=p), and the reference Pad would otherwise copy the whole activation.
void FoldZeroPadIntoConsumer(CompileState& st) {
  Uses u = CountUses(st);
  std::vector<char> dead(st.nodes.size(), 0);
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    const Node& pad = st.nodes[i];
    if (pad.op_type != "Pad" || pad.outputs.size() != 1 || pad.GetString("mode", "constant") != "constant") continue;
    const int x = pad.inputs[0], y = pad.outputs[0];
    if (x < 0 || !Private(st, u, y) || st.values[x].dtype != DType::kF32 || st.values[x].shape.size() != 4) continue;
    std::vector<int64_t> pads;
    if (st.opset < 11) {
      pads = pad.GetInts("pads");
      if (pad.GetFloat("value", 0.f) != 0.f) continue;
    } else {
      if (pad.inputs.size() < 2 || pad.inputs[1] < 0 || !st.values[pad.inputs[1]].known) continue;
      if (pad.inputs.size() > 3 && pad.inputs[3] >= 0) continue;  // explicit axes: keep it simple
      if (pad.inputs.size() > 2 && pad.inputs[2] >= 0) {
        const CompileValue& cv = st.values[pad.inputs[2]];
        if (!cv.known || cv.value.numel() != 1 || cv.value.GetAsDouble(0) != 0.0) continue;
      }
      pads = st.values[pad.inputs[1]].value.ToInt64Vector();
    }
    if (pads.size() != 8 || pads[0] || pads[1] || pads[4] || pads[5]) continue;
    if (std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p < 0; })) continue;
    Node& c = st.nodes[u.consumers[y][0]];
    if (c.inputs.empty() || c.inputs[0] != y || c.GetString("auto_pad", "NOTSET") != "NOTSET") continue;
    const std::vector<int64_t> old = c.GetInts("pads", {0, 0, 0, 0});
    if (old.size() != 4 || std::any_of(old.begin(), old.end(), [](int64_t p) { return p != 0; })) continue;
    if (c.op_type == "AveragePool") {
      if (c.GetInt("ceil_mode", 0) != 0) continue;
      c.attrs["count_include_pad"] = Attribute::Int(1);
    } else if (c.op_type == "MaxPool") {
      // Max over zeros equals max over padding (ignored) when the input is a Relu's output (>= 0) and every window
      // keeps a real element (pads smaller than the kernel). Keras ResNets pad before their first MaxPool this way.
      const Node* producer = nullptr;
      for (size_t p = 0; p < i; ++p)
        if (!st.nodes[p].outputs.empty() && st.nodes[p].outputs[0] == x) producer = &st.nodes[p];
      const std::vector<int64_t> kernel = c.GetInts("kernel_shape", {});
      if (!producer || producer->op_type != "Relu" || kernel.size() != 2 || c.GetInt("ceil_mode", 0) != 0 ||
          c.outputs.size() != 1 || c.GetInts("dilations", {1, 1}) != std::vector<int64_t>{1, 1})
        continue;
      if (pads[2] >= kernel[0] || pads[6] >= kernel[0] || pads[3] >= kernel[1] || pads[7] >= kernel[1]) continue;
    } else if (c.op_type != "Conv") {
      continue;
    }
    c.attrs["pads"] = Attribute::Ints({pads[2], pads[3], pads[6], pads[7]});
    c.inputs[0] = x;
    dead[i] = 1;
  }
  DropDead(st, dead);
}

}  // namespace

bool FusableActivationOf(const CompileState& st, const Node& n, Activation* act) {
  if (!OpRegistry::TraitsOf(n.op_type).fusable_activation) return false;
  std::vector<const Tensor*> values(n.inputs.size(), nullptr);
  for (size_t k = 0; k < n.inputs.size(); ++k)
    if (IsF32Known(st, n.inputs[k])) values[k] = &st.values[n.inputs[k]].value;
  return ActivationOfNode(n, st.opset, values, act);
}

void RunFusionPasses(CompileState& state) {
  FuseQuantizeDequantizePairs(state);
  FuseResizeCrop(state);
  EliminateIdentities(state);
  SwapPadTranspose(state);
  SwapTokenImageTransposes(state);
  FuseTfExportPatterns(state);
  FoldZeroPadIntoConsumer(state);
  FuseTransformerPatterns(state);
  FuseDataMovementPatterns(state);
  FoldBatchNorm(state);
  FoldBatchNormIntoMatMul(state);
  FoldMatMulScale(state);
  FoldConvAffine(state);
  AffineToBatchNorm(state);
  FuseResidualAdd(state);
  FuseActivation(state);
}

}  // namespace osprey
