// ONNX's function ops of opsets 23-28 (schemas: ops/function_ops.cc) as the ops the standard defines them by, made
// when a model is compiled: each lowered node is then inferred, folded and fused like any other, so an Attention is
// the MatMul -> Softmax -> MatMul that FuseAttentionViews makes one kernel of, as when an exporter decomposes it.
//   Attention (23-25)      scaled dot-product attention: 4-D [B, N, S, h] or 3-D [B, S, N x h] (q_num_heads,
//                          kv_num_heads) inputs, grouped-query heads, past/present key and value, a boolean or additive
//                          mask (a shorter last dim padded as masked), is_causal with the past's offset, softcap,
//                          nonpad_kv_seqlen (24), local windows (25), the four qk_matmul_output modes; a row whose
//                          every key is masked gives zeros (the spec's errata), softmax_precision computed in float32.
//   RMSNormalization (23)  X / sqrt(mean(X^2 over axis..) + epsilon) * scale (and ONNX Runtime's
//                          SimplifiedLayerNormalization, which its optimiser writes in the default domain)
//   RotaryEmbedding (23)   halves or interleaved pairs rotated by the cos/sin caches (position_ids gather them)
//   Swish (24)             x * sigmoid(alpha x);  SwiGLU (28): Swish(A) * B
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/op_registry.h"
#include "runtime/lowering.h"

namespace osprey {
namespace {

int Input(const Node& n, size_t i) { return i < n.inputs.size() ? n.inputs[i] : -1; }
int Output(const Node& n, size_t i) { return i < n.outputs.size() ? n.outputs[i] : -1; }

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// The largest attention bias made as a compile-time constant (64 MiB of float32): a constant mask broadcast to
// [.., S, T], or the causal / window frontier of S queries and T keys.
constexpr int64_t kMaxBiasElements = int64_t{1} << 24;

class FunctionLowering : public NodeBuilder {
 public:
  using NodeBuilder::NodeBuilder;

  const CompileValue& Value(int v) const { return st_.values[v]; }
  void RequireF32(int v, const char* what) const {
    if (Value(v).dtype != DType::kF32)
      Fail(std::string(what) + " has dtype " + DTypeName(Value(v).dtype) + "; float32 (and float16, computed in " +
           "float32) is supported");
  }
  int Transpose(int x, std::vector<int64_t> perm, const std::string& suffix) {
    const int y = Add("Transpose", suffix, {x});
    Last().attrs["perm"] = Attribute::Ints(std::move(perm));
    return y;
  }
  int Slice(int x, int64_t begin, int64_t end, int64_t step, const std::string& suffix) {
    return Add("Slice", suffix, {x, Ints({begin}), Ints({end}), Ints({-1}), Ints({step})});
  }
  int Concat(std::vector<int> parts, int64_t axis, const std::string& suffix, int output = -1) {
    const int y = Add("Concat", suffix, std::move(parts), output);
    Last().attrs["axis"] = Attribute::Int(axis);
    return y;
  }
  int Swish(int x, float alpha, const std::string& suffix, int output = -1) {
    const int scaled = alpha == 1.f ? x : Add("Mul", suffix + "_alpha", {x, Float(alpha)});
    return Add("Mul", suffix, {x, Add("Sigmoid", suffix + "_sigmoid", {scaled})}, output);
  }
};

// ---------------------------------------------------------------------------------------------------- Attention

// The part of the attention bias known when compiling: a [.., S, T] float tensor (right-aligned broadcast against
// [B, N, S, T]), all zeros until a term is added.
struct ConstantBias {
  Shape shape;
  std::vector<float> values;
  bool nonzero = false;
};

// Broadcasts a known mask (bool -> 0 / -inf; float added as is; a last dim shorter than T padded as masked) against
// [S, T] into `bias`.
void AddKnownMask(const FunctionLowering& b, const Tensor& mask, int64_t seq, int64_t total, ConstantBias* bias) {
  Shape ms = mask.shape();
  const int64_t rank = std::max<int64_t>(static_cast<int64_t>(ms.size()), 2);
  Shape out(rank, 1);
  Shape padded = ms;
  padded.insert(padded.begin(), rank - ms.size(), 1);
  if (padded[rank - 1] > total)
    b.Fail("attn_mask's last dim " + std::to_string(padded[rank - 1]) + " exceeds the " + std::to_string(total) +
           " keys");
  for (int64_t d = 0; d < rank - 2; ++d) out[d] = padded[d];
  if (padded[rank - 2] != 1 && padded[rank - 2] != seq)
    b.Fail("attn_mask " + ShapeToString(ms) + " does not broadcast against " + std::to_string(seq) + " queries");
  out[rank - 2] = seq;
  out[rank - 1] = total;
  if (NumElements(out) > kMaxBiasElements)
    b.Fail("attn_mask broadcast to " + ShapeToString(out) + " is too large to compile (at most 2^24 elements)");
  std::vector<float> v(NumElements(out), 0.f);
  std::vector<int64_t> in_strides(rank, 0);
  for (int64_t d = rank - 1, s = 1; d >= 0; --d) {
    in_strides[d] = padded[d] == 1 ? 0 : s;
    s *= padded[d];
  }
  const bool is_bool = mask.dtype() == DType::kBool;
  std::vector<int64_t> idx(rank, 0);
  for (int64_t flat = 0; flat < static_cast<int64_t>(v.size()); ++flat) {
    if (idx[rank - 1] >= padded[rank - 1]) {
      v[flat] = kNegInf;  // past the mask's keys (a shorter mask is padded, as the reference does): masked
    } else {
      int64_t at = 0;
      for (int64_t d = 0; d < rank; ++d) at += idx[d] * in_strides[d];
      v[flat] = is_bool ? (mask.data<bool>()[at] ? 0.f : kNegInf) : mask.data<float>()[at];
    }
    for (int64_t d = rank - 1; d >= 0 && ++idx[d] == out[d]; --d) idx[d] = 0;
  }
  bias->shape = out;  // the first term (the frontier comes after)
  bias->values = std::move(v);
  bias->nonzero = true;
}

// Adds -inf where query i may not attend key j: the causal frontier j <= i + offset and the local window
// offset + i - left <= j <= offset + i + right (each bound < 0: unbounded).
void AddFrontier(bool causal, int64_t left, int64_t right, int64_t offset, int64_t seq, int64_t total,
                 ConstantBias* bias) {
  if (!causal && left < 0 && right < 0) return;
  if (bias->shape.empty()) {
    bias->shape = {seq, total};
    bias->values.assign(seq * total, 0.f);
  }
  const int64_t rows = NumElements(bias->shape) / (seq * total);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < seq; ++i)
      for (int64_t j = 0; j < total; ++j) {
        const int64_t diff = offset + i - j;  // how far key j lies before query i
        const bool allowed = (!causal || diff >= 0) && (left < 0 || diff <= left) && (right < 0 || -diff <= right);
        if (!allowed) bias->values[(r * seq + i) * total + j] = kNegInf;
      }
  bias->nonzero = true;
}

std::vector<Node> LowerAttention(CompileState& st, const Node& node) {
  FunctionLowering b(st, node);
  if (node.inputs.size() < 3 || Input(node, 0) < 0 || Input(node, 1) < 0 || Input(node, 2) < 0)
    b.Fail("inputs Q, K and V are required");
  int q = node.inputs[0], k = node.inputs[1], v = node.inputs[2];
  const int mask = Input(node, 3), past_k = Input(node, 4), past_v = Input(node, 5), nonpad = Input(node, 6);
  for (int x : {q, k, v}) b.RequireF32(x, "an input");
  const Shape qs = b.Value(q).shape, ks = b.Value(k).shape, vs = b.Value(v).shape;
  const size_t rank = qs.size();
  if ((rank != 3 && rank != 4) || ks.size() != rank || vs.size() != rank)
    b.Fail("Q, K and V must all be 4-D [batch, heads, sequence, head size] or all 3-D [batch, sequence, hidden], got " +
           ShapeToString(qs) + ", " + ShapeToString(ks) + ", " + ShapeToString(vs));
  const int64_t batch = qs[0];
  int64_t q_heads, kv_heads;
  if (rank == 3) {
    q_heads = node.GetInt("q_num_heads", 0);
    kv_heads = node.GetInt("kv_num_heads", 0);
    if (q_heads <= 0 || kv_heads <= 0 || qs[2] % q_heads != 0 || ks[2] % kv_heads != 0 || vs[2] % kv_heads != 0)
      b.Fail("3-D inputs need q_num_heads and kv_num_heads dividing the hidden sizes " + ShapeToString(qs) + ", " +
             ShapeToString(ks) + ", " + ShapeToString(vs));
    auto heads = [&](int x, const Shape& s, int64_t n, const std::string& name) {
      return b.Transpose(b.Add("Reshape", "/" + name + "_heads", {x, b.Ints({s[0], s[1], n, s[2] / n})}), {0, 2, 1, 3},
                         "/" + name + "_transpose");
    };
    q = heads(q, qs, q_heads, "q");
    k = heads(k, ks, kv_heads, "k");
    v = heads(v, vs, kv_heads, "v");
  } else {
    q_heads = qs[1];
    kv_heads = ks[1];
  }
  const int64_t seq = rank == 4 ? qs[2] : qs[1], head = rank == 4 ? qs[3] : qs[2] / q_heads;
  const int64_t keys = rank == 4 ? ks[2] : ks[1], head_k = rank == 4 ? ks[3] : ks[2] / kv_heads;
  const int64_t head_v = rank == 4 ? vs[3] : vs[2] / kv_heads;
  if (ks[0] != batch || vs[0] != batch || head_k != head || (rank == 4 ? vs[1] != kv_heads || vs[2] != keys
                                                                        : vs[1] != keys))
    b.Fail("K " + ShapeToString(ks) + " and V " + ShapeToString(vs) + " do not match Q " + ShapeToString(qs));
  if (kv_heads <= 0 || q_heads % kv_heads != 0)
    b.Fail(std::to_string(q_heads) + " query heads are not a multiple of " + std::to_string(kv_heads) + " key heads");

  // Past key and value: the present ones are them followed by K and V.
  if ((past_k >= 0) != (past_v >= 0)) b.Fail("past_key and past_value must be given together");
  if (nonpad >= 0 && past_k >= 0) b.Fail("nonpad_kv_seqlen cannot be combined with past_key / past_value");
  int64_t past = 0;
  if (past_k >= 0) {
    const Shape pk = b.Value(past_k).shape, pv = b.Value(past_v).shape;
    if (pk.size() != 4 || pv.size() != 4 || pk[0] != batch || pk[1] != kv_heads || pk[3] != head || pv[0] != batch ||
        pv[1] != kv_heads || pv[2] != pk[2] || pv[3] != head_v)
      b.Fail("past_key " + ShapeToString(pk) + " / past_value " + ShapeToString(pv) + " do not match K and V");
    past = pk[2];
    k = b.Concat({past_k, k}, 2, "/present_key", Output(node, 1));
    v = b.Concat({past_v, v}, 2, "/present_value", Output(node, 2));
  } else {
    if (Output(node, 1) >= 0) b.Add("Identity", "/present_key", {k}, Output(node, 1));
    if (Output(node, 2) >= 0) b.Add("Identity", "/present_value", {v}, Output(node, 2));
  }
  const int64_t total = past + keys;
  const int64_t group = q_heads / kv_heads;
  auto repeat_heads = [&](int x, int64_t size, const std::string& name) {  // [B, Nkv, T, h] -> [B, Nq, T, h]
    if (group == 1) return x;
    const int split = b.Add("Reshape", "/" + name + "_groups", {x, b.Ints({batch, kv_heads, 1, total, size})});
    const int wide = b.Add("Expand", "/" + name + "_repeat", {split, b.Ints({batch, kv_heads, group, total, size})});
    return b.Add("Reshape", "/" + name + "_heads", {wide, b.Ints({batch, q_heads, total, size})});
  };
  k = repeat_heads(k, head, "k");
  v = repeat_heads(v, head_v, "v");

  const float scale = node.GetFloat("scale", 1.f / std::sqrt(static_cast<float>(head)));
  const int mode = static_cast<int>(node.GetInt("qk_matmul_output_mode", 0));
  if (mode < 0 || mode > 3) b.Fail("qk_matmul_output_mode must be 0..3, got " + std::to_string(mode));
  int scores = b.Add("Mul", "/scale", {b.Add("MatMul", "/qk", {q, b.Transpose(k, {0, 1, 3, 2}, "/k_transpose")}),
                                       b.Float(scale)});
  int qk_output = scores;
  const float softcap = node.GetFloat("softcap", 0.f);
  if (softcap > 0) {
    const int capped = b.Add("Tanh", "/softcap_tanh", {b.Add("Div", "/softcap_in", {scores, b.Float(softcap)})});
    scores = b.Add("Mul", "/softcap", {capped, b.Float(softcap)});
    if (mode == 1) qk_output = scores;
  }

  // The bias: a known mask, the causal frontier and the local window as one constant; a run-time mask and
  // nonpad_kv_seqlen's terms added to it.
  const bool causal = node.GetInt("is_causal", 0) != 0;
  const int64_t left = node.GetInt("left_window_size", -1), right = node.GetInt("right_window_size", -1);
  if (left < -1 || right < -1) b.Fail("left_window_size and right_window_size must be -1 or >= 0");
  // (Declared dims may be hostile: compared by division, as seq x total could overflow.)
  if (total > 0 && seq > kMaxBiasElements / total && (causal || left >= 0 || right >= 0 || mask >= 0 || nonpad >= 0))
    b.Fail(std::to_string(seq) + " queries x " + std::to_string(total) +
           " keys are too many for a masked attention (at most 2^24 pairs)");
  ConstantBias bias;
  std::vector<int> runtime_terms;
  // No queries or no keys: an empty product (zeros when there are no keys), nothing to mask.
  const bool empty = seq == 0 || total == 0;
  if (mask >= 0 && !empty) {
    const DType mt = b.Value(mask).dtype;
    if (mt != DType::kBool && mt != DType::kF32)
      b.Fail(std::string("attn_mask must be bool or float, got ") + DTypeName(mt));
    if (b.Value(mask).known) {
      AddKnownMask(b, b.Value(mask).value, seq, total, &bias);
    } else {
      const Shape ms = b.Value(mask).shape;
      if (ms.empty() || ms.back() > total)
        b.Fail("attn_mask " + ShapeToString(ms) + " does not fit " + std::to_string(total) + " keys");
      int term = mask;
      if (mt == DType::kBool) term = b.Add("Where", "/mask_bias", {mask, b.Float(0.f), b.Float(kNegInf)});
      if (ms.back() < total) {  // keys beyond the mask: masked
        std::vector<int64_t> pads(2 * ms.size(), 0);
        pads[2 * ms.size() - 1] = total - ms.back();
        term = b.Add("Pad", "/mask_pad", {term, b.Ints(pads), b.Float(kNegInf)});
      }
      runtime_terms.push_back(term);
    }
  }
  if (nonpad >= 0 && !empty) {
    // Per batch b, the keys j < nonpad[b] are valid; causal and window frontiers are offset by nonpad[b] - S.
    const DType nt = b.Value(nonpad).dtype;
    if ((nt != DType::kI64 && nt != DType::kI32) || b.Value(nonpad).shape != Shape{batch})
      b.Fail("nonpad_kv_seqlen must be int64 [" + std::to_string(batch) + "]");
    int lengths = b.Add("Reshape", "/nonpad", {nonpad, b.Ints({batch, 1, 1})});
    if (nt == DType::kI32) {
      lengths = b.Add("Cast", "/nonpad_int64", {lengths});
      b.Last().attrs["to"] = Attribute::Int(7);  // INT64
    }
    // E[i, j] = j - i + S compared with nonpad[b]: key j valid iff j < nonpad; causal iff E <= nonpad; window iff
    // E + left >= nonpad and E - right <= nonpad.
    auto table = [&](int64_t shift, bool index_only) {
      Tensor t(DType::kI64, {seq, total});
      for (int64_t i = 0; i < seq; ++i)
        for (int64_t j = 0; j < total; ++j) t.data<int64_t>()[i * total + j] = index_only ? j : j - i + seq + shift;
      return st.AddConstant(std::move(t));
    };
    int allowed = b.Add("Less", "/nonpad_valid", {table(0, true), lengths});
    auto also = [&](const char* op, int64_t shift, const char* name) {
      const int cond = b.Add(op, std::string("/nonpad_") + name, {table(shift, false), lengths});
      allowed = b.Add("And", std::string("/nonpad_and_") + name, {allowed, cond});
    };
    if (causal) also("LessOrEqual", 0, "causal");
    if (left >= 0) also("GreaterOrEqual", left, "left");
    if (right >= 0) also("LessOrEqual", -right, "right");
    const int term = b.Add("Where", "/nonpad_bias", {allowed, b.Float(0.f), b.Float(kNegInf)});
    runtime_terms.push_back(b.Add("Reshape", "/nonpad_heads", {term, b.Ints({batch, 1, seq, total})}));
  } else if (!empty) {
    AddFrontier(causal, left, right, past, seq, total, &bias);
  }

  // Rows of the constant bias with every key masked (zeroed after the Softmax).
  bool constant_row_masked = false;
  std::vector<char> row_masked;
  if (bias.nonzero) {
    const int64_t rows = NumElements(bias.shape) / total;
    row_masked.assign(rows, 1);
    bool all_zero = true;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < total; ++j) {
        const float x = bias.values[r * total + j];
        if (x != kNegInf) row_masked[r] = 0;
        if (x != 0.f) all_zero = false;
      }
    for (char m : row_masked) constant_row_masked = constant_row_masked || m;
    bias.nonzero = !all_zero;
  }
  int bias_value = -1;
  if (bias.nonzero) {
    Tensor t(DType::kF32, bias.shape);
    std::copy(bias.values.begin(), bias.values.end(), t.data<float>());
    bias_value = st.AddConstant(std::move(t));
  }
  for (size_t i = 0; i < runtime_terms.size(); ++i)
    bias_value = bias_value < 0 ? runtime_terms[i]
                                : b.Add("Add", "/bias_" + std::to_string(i), {bias_value, runtime_terms[i]});
  if (bias_value >= 0) scores = b.Add("Add", "/bias", {scores, bias_value});
  if (mode == 2) qk_output = scores;

  int probs = b.Add("Softmax", "/softmax", {scores});
  b.Last().attrs["axis"] = Attribute::Int(-1);
  if (!runtime_terms.empty()) {
    // A row whose bias is -inf for every key gives zeros, not NaN.
    const int row_max = b.Add("ReduceMax", "/bias_row_max", {bias_value, b.Ints({-1})});
    b.Last().attrs["keepdims"] = Attribute::Int(1);
    const int masked = b.Add("IsInf", "/row_masked", {row_max});
    b.Last().attrs["detect_positive"] = Attribute::Int(0);
    probs = b.Add("Where", "/row_guard", {masked, b.Float(0.f), probs});
  } else if (constant_row_masked) {
    Shape keep_shape = bias.shape;
    keep_shape.back() = 1;
    Tensor keep(DType::kBool, keep_shape);
    for (size_t r = 0; r < row_masked.size(); ++r) keep.data<bool>()[r] = row_masked[r] == 0;
    probs = b.Add("Where", "/row_guard", {st.AddConstant(std::move(keep)), probs, b.Float(0.f)});
  }
  if (mode == 3) qk_output = probs;
  if (Output(node, 3) >= 0) b.Add("Identity", "/qk_matmul_output", {qk_output}, Output(node, 3));

  const int y = b.Add("MatMul", "/context", {probs, v}, rank == 4 ? node.outputs[0] : -1);
  if (rank == 3) {
    const int merged = b.Transpose(y, {0, 2, 1, 3}, "/merge");
    b.Add("Reshape", "", {merged, b.Ints({batch, seq, q_heads * head_v})}, node.outputs[0]);
  }
  return b.Take();
}

// ------------------------------------------------------------------------------------------- RMSNormalization

// Also ONNX Runtime's SimplifiedLayerNormalization (default domain, any opset: what its optimiser writes for an RMS
// norm, and for a decomposed LayerNorm's last steps), whose optional output 1 is 1 / rms. Pow(x, 2) as a decomposing
// exporter writes it, so a ReduceMean -> Sub before it fuses with it into LayerNormalization (FuseLayerNorm).
std::vector<Node> LowerRmsNormalization(CompileState& st, const Node& node) {
  FunctionLowering b(st, node);
  const int x = node.inputs[0], scale = Input(node, 1);
  if (scale < 0) b.Fail("input 'scale' is required");
  b.RequireF32(x, "X");
  const int64_t rank = static_cast<int64_t>(b.Value(x).shape.size());
  int64_t axis = node.GetInt("axis", -1);
  if (axis < -rank || axis >= rank)
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": axis " + std::to_string(axis) +
                                                 " is out of range for rank " + std::to_string(rank));
  if (axis < 0) axis += rank;
  std::vector<int64_t> axes;
  for (int64_t d = axis; d < rank; ++d) axes.push_back(d);
  const int square = b.Add("Pow", "/square", {x, b.Float(2.f)});
  const int mean = st.opset >= 18 ? b.Add("ReduceMean", "/mean_square", {square, b.Ints(axes)})
                                  : b.Add("ReduceMean", "/mean_square", {square});
  if (st.opset < 18) b.Last().attrs["axes"] = Attribute::Ints(axes);
  b.Last().attrs["keepdims"] = Attribute::Int(1);
  const int rms = b.Add("Sqrt", "/rms", {b.Add("Add", "/epsilon", {mean, b.Float(node.GetFloat("epsilon", 1e-5f))})});
  b.Add("Mul", "", {b.Add("Div", "/normalized", {x, rms}), scale}, node.outputs[0]);
  if (Output(node, 1) >= 0) b.Add("Reciprocal", "/inv_std_var", {rms}, Output(node, 1));
  return b.Take();
}

// -------------------------------------------------------------------------------------------- RotaryEmbedding

// X [B, N, S, h] (or [B, S, N x h] with num_heads), cos/sin [B, S, r/2] (or [max position, r/2] gathered by
// position_ids [B, S]); the first r = rotary_embedding_dim (default h) features of each head rotated.
std::vector<Node> LowerRotaryEmbedding(CompileState& st, const Node& node) {
  FunctionLowering b(st, node);
  int x = node.inputs[0], cos = Input(node, 1), sin = Input(node, 2);
  const int positions = Input(node, 3);
  if (cos < 0 || sin < 0) b.Fail("inputs cos_cache and sin_cache are required");
  b.RequireF32(x, "X");
  const Shape xs = b.Value(x).shape;
  if (xs.size() != 3 && xs.size() != 4)
    b.Fail("X must be 4-D [batch, heads, sequence, head size] or 3-D [batch, sequence, hidden], got " +
           ShapeToString(xs));
  const bool three_d = xs.size() == 3;
  const int64_t batch = xs[0], seq = three_d ? xs[1] : xs[2];
  int64_t heads = three_d ? node.GetInt("num_heads", 0) : xs[1];
  if (heads <= 0 || (three_d && xs[2] % heads != 0))
    b.Fail("3-D X needs num_heads dividing its hidden size " + std::to_string(xs[2]));
  const int64_t head = three_d ? xs[2] / heads : xs[3];
  const int64_t rot = node.GetInt("rotary_embedding_dim", 0) > 0 ? node.GetInt("rotary_embedding_dim", 0) : head;
  if (rot > head || rot % 2 != 0)
    b.Fail("rotary_embedding_dim " + std::to_string(rot) + " must be even and at most the head size " +
           std::to_string(head));
  if (three_d) x = b.Add("Reshape", "/heads", {x, b.Ints({batch, seq, heads, head})});  // [B, S, N, h]
  // cos / sin as [B, S, r/2], then unsqueezed where the heads are: [B, 1, S, r/2] (4-D) or [B, S, 1, r/2].
  if (positions >= 0 && b.Value(positions).shape != Shape{batch, seq})
    b.Fail("position_ids must be [" + std::to_string(batch) + ", " + std::to_string(seq) + "], got " +
           ShapeToString(b.Value(positions).shape));
  auto cache = [&](int c, const std::string& name) {
    b.RequireF32(c, "a cache");
    const Shape cs = b.Value(c).shape;
    if (positions >= 0) {
      if (cs.size() != 2 || cs[1] != rot / 2)
        b.Fail(name + "_cache " + ShapeToString(cs) + " must be [max position, " + std::to_string(rot / 2) +
               "] with position_ids");
      c = b.Add("Gather", "/" + name + "_positions", {c, positions});
    } else if (cs != Shape{batch, seq, rot / 2}) {
      b.Fail(name + "_cache " + ShapeToString(cs) + " must be [" + std::to_string(batch) + ", " + std::to_string(seq) +
             ", " + std::to_string(rot / 2) + "] without position_ids");
    }
    return b.Add("Reshape", "/" + name + "_heads",
                 {c, b.Ints(three_d ? std::vector<int64_t>{batch, seq, 1, rot / 2}
                                    : std::vector<int64_t>{batch, 1, seq, rot / 2})});
  };
  cos = cache(cos, "cos");
  sin = cache(sin, "sin");
  const bool interleaved = node.GetInt("interleaved", 0) != 0;
  const int x1 = interleaved ? b.Slice(x, 0, rot, 2, "/x1") : b.Slice(x, 0, rot / 2, 1, "/x1");
  const int x2 = interleaved ? b.Slice(x, 1, rot, 2, "/x2") : b.Slice(x, rot / 2, rot, 1, "/x2");
  const int real = b.Add("Sub", "/real", {b.Add("Mul", "/cos_x1", {cos, x1}), b.Add("Mul", "/sin_x2", {sin, x2})});
  const int imag = b.Add("Add", "/imag", {b.Add("Mul", "/sin_x1", {sin, x1}), b.Add("Mul", "/cos_x2", {cos, x2})});
  const int64_t outer = three_d ? seq : heads, inner = three_d ? heads : seq;  // dims 1 and 2 of the 4-D view
  int rotated;
  if (interleaved) {  // [.., r/2] pairs (real, imag) -> [.., r]
    const int pairs = b.Concat({b.Add("Unsqueeze", "/real_pair", {real, b.Ints({-1})}),
                                b.Add("Unsqueeze", "/imag_pair", {imag, b.Ints({-1})})},
                               -1, "/pairs");
    rotated = b.Add("Reshape", "/rotated", {pairs, b.Ints({batch, outer, inner, rot})});
  } else {
    rotated = b.Concat({real, imag}, -1, "/rotated");
  }
  const int out = three_d ? -1 : node.outputs[0];
  const int y = rot == head ? b.Add("Identity", "/joined", {rotated}, out)
                            : b.Concat({rotated, b.Slice(x, rot, head, 1, "/pass")}, -1, "/joined", out);
  if (three_d) b.Add("Reshape", "", {y, b.Ints({batch, seq, heads * head})}, node.outputs[0]);
  return b.Take();
}

}  // namespace

bool IsLoweredFunctionOp(const Node& node) {
  if (!node.domain.empty() && node.domain != "ai.onnx") return false;
  const std::string& op = node.op_type;
  return op == "Attention" || op == "RMSNormalization" || op == "RotaryEmbedding" || op == "Swish" || op == "SwiGLU" ||
         op == "SimplifiedLayerNormalization";
}

std::vector<Node> LowerFunctionOp(CompileState& st, const Node& node) {
  if (node.outputs.empty() || node.outputs[0] < 0 || node.inputs.empty() || node.inputs[0] < 0)
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": input 0 and output 0 are required");
  const std::string& op = node.op_type;
  if (op == "Attention") return LowerAttention(st, node);
  if (op == "RMSNormalization" || op == "SimplifiedLayerNormalization") return LowerRmsNormalization(st, node);
  if (op == "RotaryEmbedding") return LowerRotaryEmbedding(st, node);
  FunctionLowering b(st, node);
  const float alpha = node.GetFloat("alpha", 1.f);
  if (op == "Swish") {
    b.Swish(node.inputs[0], alpha, "", node.outputs[0]);
  } else {  // SwiGLU: A and B of one shape
    const int a = node.inputs[0], v = Input(node, 1);
    if (v < 0 || b.Value(a).shape != b.Value(v).shape)
      throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": A and B must have the same shape, got " +
                                                   ShapeToString(b.Value(a).shape) + " and " +
                                                   (v < 0 ? "none" : ShapeToString(b.Value(v).shape)));
    b.Add("Mul", "", {b.Swish(a, alpha, "/swish"), v}, node.outputs[0]);
  }
  return b.Take();
}

}  // namespace osprey
