// Fusion passes for what TensorFlow exporters (tf2onnx) write (docs/architecture.md, compile pipeline):
// - hard-swish and hard-sigmoid as Keras spells them, x * (Clip(x + 3, 0, 6) * (1/6)) and Clip(x + 3, 0, 6) * (1/6)
//   (or / 6), and hard-swish as PaddlePaddle does, (x * Clip(x + 3, 0, 6)) / 6, become one HardSwish /
//   HardSigmoid(alpha 1/6, beta 0.5) node, which the fast kernels run in one pass and FuseActivation can put into the
//   producing Conv;
// - NCHW -> NHWC Transposes (perm 0, 2, 3, 1) sink below the elementwise ops that follow them (unary ops, those whose
//   schema has OpTraits::layout_transparent, and binary ops with a constant that varies along the channels only,
//   re-shaped to [C, 1, 1]), and a sunk Transpose that meets its inverse (perm 0, 3, 1, 2) cancels with it. When
//   tf2onnx's own transpose optimiser gives up (MobileNetV3) every convolution sits between such a pair, with its
//   batch normalisation and activation inside; sunk, those meet the Conv and fold into it (FoldConvAffine,
//   FuseActivation) and the pair disappears. A ReduceMean over H and W (keepdims) behind such a Transpose (a
//   squeeze-excite block) becomes a GlobalAveragePool in front of it;
// - a chain of Transposes and unit-dim Reshapes with elementwise ops between that ends with x's elements in x's order
//   becomes the ops on x and at most one Reshape (CollapseMovementChains: Keras Conv1D blocks);
// - a one-hot embedding, MatMul(Cast(Equal(idx, arange(D))), W[D, K]) as JAX and Keras write it (integer idx whose last
//   dim is 1, dropped by a Reshape of the indices) or MatMul([Cast](OneHot(idx, D, [0, 1])), W) as PyTorch and
//   tf.one_hot do, becomes Gather(W, idx), with zero rows for indices the one-hot product sends nowhere (attribute
//   kGatherZeroOutside: outside [0, D) for Equal; OneHot wraps a negative index once first): magika's [2048, 257]
//   one-hot product took 1.2 ms of ~6.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "ops/activation.h"
#include "ops/op_registry.h"
#include "runtime/plan_impl.h"

namespace osprey {
namespace {

std::vector<std::vector<int>> Consumers(const CompileState& st) {
  std::vector<std::vector<int>> c(st.values.size());
  for (size_t i = 0; i < st.nodes.size(); ++i)
    for (int v : st.nodes[i].inputs)
      if (v >= 0) c[v].push_back(static_cast<int>(i));
  return c;
}

bool PrivateValue(const CompileState& st, const std::vector<std::vector<int>>& c, int v) {
  return v >= 0 && c[v].size() == 1 && !st.is_graph_output[v];
}

// The single float value of a known float32 constant with one element, or NaN.
float ScalarOf(const CompileState& st, int v) {
  if (v < 0 || !st.values[v].known || st.values[v].dtype != DType::kF32 || st.values[v].value.numel() != 1) return NAN;
  return st.values[v].value.data<float>()[0];
}

// The other input of binary node n when one input is v, or -1.
int OtherInput(const Node& n, int v) {
  if (n.inputs.size() != 2) return -1;
  if (n.inputs[0] == v && n.inputs[1] != v) return n.inputs[1];
  if (n.inputs[1] == v && n.inputs[0] != v) return n.inputs[0];
  return -1;
}

void DropDead(CompileState& st, const std::vector<char>& dead) {
  std::vector<Node> kept;
  for (size_t i = 0; i < st.nodes.size(); ++i)
    if (!dead[i]) kept.push_back(std::move(st.nodes[i]));
  st.nodes = std::move(kept);
}

void FuseHardActivations(CompileState& st) {
  const auto c = Consumers(st);
  std::vector<char> dead(st.nodes.size(), 0);
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    const Node& add = st.nodes[i];
    if (dead[i] || add.op_type != "Add" || add.outputs.size() != 1) continue;
    int x = -1;
    for (int k = 0; k < 2 && add.inputs.size() == 2; ++k)
      if (ScalarOf(st, add.inputs[1 - k]) == 3.f) x = add.inputs[k];
    if (x < 0 || st.values[x].dtype != DType::kF32 || st.values[add.outputs[0]].shape != st.values[x].shape) continue;
    const int a = add.outputs[0];
    if (!PrivateValue(st, c, a)) continue;
    const int ci = c[a][0];
    const Node& clip = st.nodes[ci];
    Activation clip6;  // Clip(a, 0, 6), its bounds attributes or constant inputs
    if (dead[ci] || clip.op_type != "Clip" || clip.inputs[0] != a || !FusableActivationOf(st, clip, &clip6) ||
        clip6.alpha != 0.f || clip6.beta != 6.f)
      continue;
    const int cl = clip.outputs[0];
    if (!PrivateValue(st, c, cl)) continue;
    const int si = c[cl][0];
    const Node& scale = st.nodes[si];
    // `n` computes v / 6 or v * (1/6); replacing node `n` by HardSwish(x) keeps its outputs.
    auto sixth_of = [&](const Node& n, int v) {
      if (n.op_type == "Mul") return std::fabs(ScalarOf(st, OtherInput(n, v)) - 1.f / 6.f) <= 1e-7f;
      return n.op_type == "Div" && n.inputs.size() == 2 && n.inputs[0] == v && ScalarOf(st, n.inputs[1]) == 6.f;
    };
    auto hard_swish = [&](Node& n) {
      Node hs;
      hs.op_type = "HardSwish";
      hs.name = n.name;
      hs.inputs = {x};
      hs.outputs = n.outputs;
      n = std::move(hs);
      dead[i] = dead[ci] = dead[si] = 1;
    };
    // PaddlePaddle's order (paddle2onnx): (x * Clip(x + 3, 0, 6)) / 6 (or * (1/6)) -> HardSwish(x).
    if (!dead[si] && scale.op_type == "Mul" && scale.outputs.size() == 1 && OtherInput(scale, cl) == x &&
        PrivateValue(st, c, scale.outputs[0])) {
      const int m = scale.outputs[0];
      const int di = c[m][0];
      Node& div = st.nodes[di];
      if (!dead[di] && sixth_of(div, m) && div.outputs.size() == 1 &&
          st.values[div.outputs[0]].shape == st.values[x].shape) {
        hard_swish(div);
        continue;
      }
    }
    if (dead[si] || !sixth_of(scale, cl) || scale.outputs.size() != 1) continue;
    const int s = scale.outputs[0];
    if (st.values[s].shape != st.values[x].shape) continue;
    // x * s -> HardSwish(x) when s feeds only that Mul; else s = HardSigmoid(x).
    if (PrivateValue(st, c, s)) {
      const int mi = c[s][0];
      Node& mul = st.nodes[mi];
      if (!dead[mi] && mul.op_type == "Mul" && OtherInput(mul, s) == x) {
        hard_swish(mul);
        continue;
      }
    }
    Node hsig;
    hsig.op_type = "HardSigmoid";
    hsig.name = st.nodes[si].name;
    hsig.inputs = {x};
    hsig.outputs = {s};
    hsig.attrs["alpha"] = Attribute::Float(1.f / 6.f);
    hsig.attrs["beta"] = Attribute::Float(0.5f);
    st.nodes[si] = std::move(hsig);
    dead[i] = dead[ci] = 1;
  }
  DropDead(st, dead);
}

bool IsPerm(const Node& n, const std::vector<int64_t>& perm) {
  return n.op_type == "Transpose" && n.inputs.size() == 1 && n.outputs.size() == 1 &&
         n.GetInts("perm", {}) == perm;
}

// A known float32 constant that, right-aligned to rank 4, varies along the last axis only: returned as [C, 1, 1]
// (or as is when it has one element). Empty tensor when it does not qualify.
Tensor ChannelConstantForNchw(const CompileState& st, int v, int64_t channels) {
  if (v < 0 || !st.values[v].known || st.values[v].dtype != DType::kF32) return Tensor();
  const Tensor& t = st.values[v].value;
  if (t.numel() == 1) return t;
  const Shape& s = t.shape();
  if (s.size() > 4 || s.empty() || s.back() != channels || t.numel() != channels) return Tensor();
  return t.Reshaped({channels, 1, 1});
}

// When v is the private output of a Transpose with `perm` of a rank-4 float32 value, that value; else -1.
int TransposedFrom(const CompileState& st, const std::vector<std::vector<int>>& c, int v,
                   const std::vector<int64_t>& perm) {
  if (!PrivateValue(st, c, v)) return -1;
  for (const Node& n : st.nodes) {
    if (n.outputs.empty() || n.outputs[0] != v) continue;
    if (!IsPerm(n, perm) || n.inputs[0] < 0) return -1;
    const CompileValue& in = st.values[n.inputs[0]];
    return in.shape.size() == 4 && in.dtype == DType::kF32 ? n.inputs[0] : -1;
  }
  return -1;
}

void SinkChannelTransposes(CompileState& st) {
  const std::vector<int64_t> to_nhwc{0, 2, 3, 1}, to_nchw{0, 3, 1, 2};
  // One change per round (consumer lists are recounted): enough rounds for every Transpose to sink past every node.
  const size_t max_rounds = 8 * st.nodes.size() + 8;
  for (size_t round = 0; round < max_rounds; ++round) {
    bool changed = false;
    auto c = Consumers(st);
    std::vector<char> dead(st.nodes.size(), 0);
    for (size_t i = 0; i < st.nodes.size(); ++i) {
      if (dead[i] || !IsPerm(st.nodes[i], to_nhwc)) continue;
      const int x = st.nodes[i].inputs[0], y = st.nodes[i].outputs[0];
      if (x < 0 || st.values[x].shape.size() != 4 || st.values[x].dtype != DType::kF32) continue;
      // A ReduceMean over H and W (keepdims) of the NHWC view, whoever else reads it: GlobalAveragePool of x, then
      // the (now 1x1) Transpose.
      int reduce = -1;
      for (int k : c[y]) {
        const Node& e = st.nodes[k];
        const std::vector<int64_t> axes = e.GetInts("axes", {});
        if (e.op_type == "ReduceMean" && e.inputs.size() == 1 && e.outputs.size() == 1 &&
            e.GetInt("keepdims", 1) == 1 && (axes == std::vector<int64_t>{1, 2} || axes == std::vector<int64_t>{-3, -2}))
          reduce = k;
      }
      if (reduce >= 0) {
        const Shape& xs = st.values[x].shape;
        const int m = st.AddValue(DType::kF32, {xs[0], xs[1], 1, 1});
        Node gap;
        gap.op_type = "GlobalAveragePool";
        gap.name = st.nodes[reduce].name;
        gap.inputs = {x};
        gap.outputs = {m};
        Node tr = st.nodes[i];
        tr.inputs[0] = m;
        tr.outputs[0] = st.nodes[reduce].outputs[0];
        st.nodes[reduce] = std::move(tr);
        st.nodes.insert(st.nodes.begin() + reduce, std::move(gap));
        dead.insert(dead.begin() + reduce, 0);
        changed = true;
        break;
      }
      if (!PrivateValue(st, c, y)) continue;
      const int j = c[y][0];
      if (dead[j]) continue;
      Node& e = st.nodes[j];
      if (IsPerm(e, to_nchw)) {  // the pair cancels: readers of its output read x
        const int z = e.outputs[0];
        if (st.is_graph_output[z]) continue;
        for (Node& n : st.nodes)
          for (int& v : n.inputs)
            if (v == z) v = x;
        dead[i] = dead[j] = 1;
        changed = true;
        break;  // consumer lists changed
      }
      if (e.outputs.size() != 1 || st.values[e.outputs[0]].shape != st.values[y].shape) continue;
      Node moved = e;
      if (OpRegistry::TraitsOf(e.op_type).layout_transparent && e.inputs[0] == y) {
        bool constant_rest = true;
        for (size_t k = 1; k < e.inputs.size(); ++k)
          constant_rest = constant_rest && (e.inputs[k] < 0 || st.values[e.inputs[k]].known);
        if (!constant_rest) continue;
        moved.inputs[0] = x;
      } else if ((e.op_type == "Add" || e.op_type == "Sub" || e.op_type == "Mul" || e.op_type == "Div") &&
                 TransposedFrom(st, c, OtherInput(e, y), to_nhwc) >= 0) {
        // Both operands are the same Transpose of rank-4 values (a squeeze-excite gate): op(x, w), then the Transpose.
        const int other = OtherInput(e, y);
        const int w = TransposedFrom(st, c, other, to_nhwc);
        for (int& v : moved.inputs) v = v == y ? x : w;
        int producer = -1;
        for (size_t k = 0; k < st.nodes.size(); ++k)
          if (!st.nodes[k].outputs.empty() && st.nodes[k].outputs[0] == other) producer = static_cast<int>(k);
        dead[producer] = 1;
      } else if (e.op_type == "Add" || e.op_type == "Sub" || e.op_type == "Mul" || e.op_type == "Div") {
        const int other = OtherInput(e, y);
        Tensor k = ChannelConstantForNchw(st, other, st.values[x].shape[1]);
        if (k.buffer() == nullptr) continue;
        const int kid = k.shape() == st.values[other].shape ? other : st.AddConstant(std::move(k));
        c.resize(st.values.size());
        for (int& v : moved.inputs) v = v == y ? x : kid;
      } else {
        continue;
      }
      const int m = st.AddValue(DType::kF32, st.values[x].shape);
      c.resize(st.values.size());
      Node tr = st.nodes[i];
      moved.outputs[0] = m;
      tr.inputs[0] = m;
      tr.outputs[0] = e.outputs[0];
      // The moved op takes the old op's position (its other operand may be produced after the Transpose), the
      // Transpose follows it.
      dead[i] = 1;
      st.nodes[j] = std::move(moved);
      st.nodes.insert(st.nodes.begin() + j + 1, std::move(tr));
      dead.insert(dead.begin() + j + 1, 0);
      changed = true;
      break;  // consumer lists changed
    }
    DropDead(st, dead);
    if (!changed) break;
  }
}

// Labels name the non-unit axes of the value a movement chain starts from (x) by their axis there; -1 marks a unit dim.
using AxisLabels = std::vector<int>;

// The labels of a movement node's output from those of its input 0: a Transpose, or a same-bytes op (Reshape,
// Squeeze, Unsqueeze, Flatten, Identity) that only adds or drops unit dims. False for anything else.
bool MovedLabels(const CompileState& st, const Node& n, const AxisLabels& in, AxisLabels* out) {
  if (!n.domain.empty() || n.inputs.empty() || n.inputs[0] < 0 || n.outputs.size() != 1 || n.outputs[0] < 0)
    return false;
  const Shape& is = st.values[n.inputs[0]].shape;
  const Shape& os = st.values[n.outputs[0]].shape;
  if (is.size() != in.size() || !ConcreteShape(os)) return false;
  out->clear();
  if (n.op_type == "Transpose") {
    std::vector<int64_t> perm = n.GetInts("perm", {});
    if (perm.empty())
      for (size_t a = is.size(); a-- > 0;) perm.push_back(static_cast<int64_t>(a));
    if (n.inputs.size() != 1 || perm.size() != is.size()) return false;
    for (int64_t p : perm) {
      if (p < 0 || p >= static_cast<int64_t>(is.size())) return false;
      out->push_back(in[p]);
    }
    return true;
  }
  if (!OpRegistry::TraitsOf(n.op_type).same_bytes) return false;
  std::vector<int64_t> in_dims, out_dims;  // the non-unit dims in order: must be the same
  AxisLabels kept;
  for (size_t a = 0; a < is.size(); ++a)
    if (is[a] != 1) in_dims.push_back(is[a]), kept.push_back(in[a]);
  for (int64_t d : os)
    if (d != 1) out_dims.push_back(d);
  if (in_dims != out_dims) return false;
  size_t next = 0;
  for (int64_t d : os) out->push_back(d == 1 ? -1 : kept[next++]);
  return true;
}

// Whether the labels list x's non-unit axes in x's order (the elements are in x's order: a reshape of x).
bool InXOrder(const AxisLabels& labels) {
  int last = -1;
  for (int l : labels) {
    if (l < 0) continue;
    if (l <= last) return false;
    last = l;
  }
  return true;
}

// A known constant operand k of an elementwise op on a value of shape `s` with `labels`, as a constant broadcasting
// the same way over x's shape `xs` (its non-unit dims moved to the axes of x they label); -1 when it has none: a dim
// the op broadcasts it over that x does not have, or non-unit dims in another order than x's. With `make` false only
// checks (returns k or -1).
int ConstantInX(CompileState& st, int k, const Shape& s, const AxisLabels& labels, const Shape& xs, bool make) {
  if (k < 0 || !st.values[k].known) return -1;
  const Tensor& t = st.values[k].value;
  if (t.numel() == 1) return k;
  const Shape& ks = t.shape();
  if (ks.size() > s.size()) return -1;
  Shape moved(xs.size(), 1);
  int last = -1;
  for (size_t b = 0; b < ks.size(); ++b) {
    const size_t a = s.size() - ks.size() + b;
    if (ks[b] == 1) continue;
    if (ks[b] != s[a] || labels[a] <= last) return -1;
    last = labels[a];
    moved[last] = ks[b];
  }
  if (!make) return k;
  return moved == ks ? k : st.AddConstant(t.Reshaped(moved));
}

// Elementwise nodes a movement chain may carry: output the shape of its operands from the chain, every other operand
// a constant ConstantInX can move (a layout-transparent op's are scalar parameters).
bool ElementwiseOnChain(CompileState& st, const Node& n, const std::map<int, AxisLabels>& labels, const Shape& xs,
                        AxisLabels* out) {
  if (!n.domain.empty() || n.outputs.size() != 1 || n.outputs[0] < 0) return false;
  const OpTraits traits = OpRegistry::TraitsOf(n.op_type);
  if (!traits.layout_transparent && !traits.layout_transparent_broadcast) return false;
  const Shape& os = st.values[n.outputs[0]].shape;
  const AxisLabels* chain = nullptr;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const int v = n.inputs[k];
    const auto it = v < 0 ? labels.end() : labels.find(v);
    if (it != labels.end()) {
      if (st.values[v].shape != os || (chain != nullptr && *chain != it->second)) return false;
      if (traits.layout_transparent && k != 0) return false;
      chain = &it->second;
    }
  }
  if (chain == nullptr) return false;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const int v = n.inputs[k];
    if (v < 0 || labels.count(v)) continue;
    if (ConstantInX(st, v, os, *chain, xs, false) < 0) return false;  // a layout-transparent op's: scalars
  }
  *out = *chain;
  return true;
}

// Collapses a chain of data movement (Transposes, and Reshapes/Squeezes/Unsqueezes of unit dims) with elementwise ops
// between, from x to a value whose elements are in x's order again, into the elementwise ops on x (constants moved to
// x's axes) and at most one Reshape. tf2onnx writes every Keras Conv1D as Unsqueeze -> Transpose -> Conv -> Squeeze
// and the layer's batch norm and activation after a Transpose back to [N, W, C]: Conv -> Squeeze -> Mul(k[C, 1]) ->
// Transpose(0, 2, 1) -> Sigmoid, Mul -> Unsqueeze(1) -> Transpose(0, 3, 1, 2) -> Conv becomes Conv -> Mul(k[C, 1, 1])
// -> Sigmoid, Mul -> Conv, which folds into the Conv (FoldConvAffine, FuseActivation). The chain's inner values must
// be read by the chain only; its elementwise ops may branch and join (x * Sigmoid(x)).
void CollapseMovementChains(CompileState& st) {
  constexpr size_t kMaxChain = 64;
  const size_t max_rounds = st.nodes.size() + 2;
  // One rewrite per round (consumer lists are recounted); a rewrite changes only nodes from its chain's start on, so
  // the next round resumes there, and a last round from the first node confirms that nothing is left.
  size_t begin = 0;
  for (size_t round = 0; round < max_rounds; ++round) {
    const auto c = Consumers(st);
    bool changed = false;
    for (size_t start = begin; start < st.nodes.size() && !changed; ++start) {
      const Node& first = st.nodes[start];
      if (first.inputs.empty() || first.inputs[0] < 0) continue;
      const int x = first.inputs[0];
      const Shape xs = st.values[x].shape;
      if (!ConcreteShape(xs)) continue;
      AxisLabels xl(xs.size());
      for (size_t a = 0; a < xs.size(); ++a) xl[a] = xs[a] == 1 ? -1 : static_cast<int>(a);
      AxisLabels moved;
      if (!MovedLabels(st, first, xl, &moved)) continue;
      // Grow the chain in execution order over the readers of its values.
      std::map<int, AxisLabels> labels{{first.outputs[0], moved}};
      std::map<int, int> producer{{first.outputs[0], static_cast<int>(start)}};
      std::vector<int> chain{static_cast<int>(start)};
      std::set<int> elementwise;  // the chain's nodes that are not movement
      std::set<int> pending(c[first.outputs[0]].begin(), c[first.outputs[0]].end());
      while (!pending.empty() && chain.size() < kMaxChain) {
        const int j = *pending.begin();
        pending.erase(pending.begin());
        const Node& n = st.nodes[j];
        AxisLabels out;
        const auto in = n.inputs.empty() ? labels.end() : labels.find(n.inputs[0]);
        const bool movement = in != labels.end() && MovedLabels(st, n, in->second, &out);
        if (!movement && !ElementwiseOnChain(st, n, labels, xs, &out)) continue;
        if (!movement) elementwise.insert(j);
        labels[n.outputs[0]] = out;
        producer[n.outputs[0]] = j;
        chain.push_back(j);
        pending.insert(c[n.outputs[0]].begin(), c[n.outputs[0]].end());
      }
      // The last value in x's order whose making reads nothing else of the chain's and is read only by it.
      for (size_t e = chain.size(); e-- > 0 && !changed;) {
        const int v = st.nodes[chain[e]].outputs[0];
        if (!InXOrder(labels[v])) continue;
        std::set<int> part;  // chain nodes v depends on
        std::vector<int> todo{chain[e]};
        while (!todo.empty()) {
          const int k = todo.back();
          todo.pop_back();
          if (!part.insert(k).second) continue;
          for (int u : st.nodes[k].inputs)
            if (producer.count(u)) todo.push_back(producer[u]);
        }
        bool closed = true;
        int movements = 0, transposes = 0;
        for (int k : part) {
          const Node& n = st.nodes[k];
          movements += !elementwise.count(k);
          transposes += n.op_type == "Transpose";
          if (n.outputs[0] == v) continue;
          closed = closed && !st.is_graph_output[n.outputs[0]];
          for (int r : c[n.outputs[0]]) closed = closed && part.count(r);
        }
        if (!closed || (movements < 2 && transposes == 0)) continue;
        // Rewrite: the part's elementwise ops on x's shape, then v as a Reshape of the last (if its shape differs).
        std::map<int, int> in_x;  // chain value -> the value holding its elements in x's shape
        std::vector<Node> nodes;
        const int v_producer = chain[e];
        const std::string v_name = st.nodes[v_producer].name;
        // The chain value whose elements v holds: made by the last elementwise op before it, or x itself. Of v's
        // shape already (x's), that op writes v; x is read in v's place.
        int source = v;
        while (producer.count(source) && !elementwise.count(producer[source]))
          source = st.nodes[producer[source]].inputs[0];
        const bool same_shape = st.values[v].shape == xs;
        if (same_shape && source == x && st.is_graph_output[v]) continue;  // would need a copy
        for (size_t k = 0; k < st.nodes.size(); ++k) {
          if (!part.count(static_cast<int>(k))) {
            nodes.push_back(std::move(st.nodes[k]));
            continue;
          }
          Node n = std::move(st.nodes[k]);
          const int out = n.outputs[0];
          if (!elementwise.count(static_cast<int>(k))) {
            in_x[out] = k == start ? x : in_x.at(n.inputs[0]);
          } else {
            const AxisLabels& ol = labels[out];
            const Shape os = st.values[out].shape;
            for (int& u : n.inputs)
              if (u >= 0) u = in_x.count(u) ? in_x[u] : ConstantInX(st, u, os, ol, xs, true);
            n.outputs[0] = same_shape && out == source ? v : st.AddValue(st.values[out].dtype, xs);
            in_x[out] = n.outputs[0];
            nodes.push_back(std::move(n));
          }
          if (static_cast<int>(k) == v_producer && !same_shape) {
            const Shape& vs = st.values[v].shape;
            const int shape = st.AddConstant(Tensor::FromVector<int64_t>({static_cast<int64_t>(vs.size())}, vs));
            nodes.push_back(MakeNode("Reshape", v_name + "/in_order", {in_x[v], shape}, {v}));
          }
        }
        st.nodes = std::move(nodes);
        if (same_shape && source == x)
          for (Node& n : st.nodes)
            for (int& u : n.inputs)
              if (u == v) u = x;
        changed = true;
        begin = start;
      }
    }
    if (!changed) {
      if (begin == 0) break;
      begin = 0;
    }
  }
}

// Whether v is a known integer constant of shape [1, ..., 1, depth] holding 0, 1, ..., depth - 1.
bool IsArange(const CompileState& st, int v, int64_t depth) {
  if (v < 0 || !st.values[v].known) return false;
  const Tensor& t = st.values[v].value;
  if ((t.dtype() != DType::kI32 && t.dtype() != DType::kI64) || t.numel() != depth || t.rank() == 0 ||
      t.shape().back() != depth)
    return false;
  const std::vector<int64_t> values = t.ToInt64Vector();
  for (int64_t k = 0; k < depth; ++k)
    if (values[static_cast<size_t>(k)] != k) return false;
  return true;
}

void OneHotMatMulToGather(CompileState& st) {
  const auto c = Consumers(st);
  std::vector<char> dead(st.nodes.size(), 0);
  std::vector<int> producer(st.values.size(), -1);
  for (size_t i = 0; i < st.nodes.size(); ++i)
    for (int v : st.nodes[i].outputs)
      if (v >= 0) producer[v] = static_cast<int>(i);
  std::map<size_t, Node> before;  // node index -> a node to insert before it (the Equal form's indices Reshape)
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    Node& matmul = st.nodes[i];
    if (matmul.op_type != "MatMul" || matmul.inputs.size() != 2 || matmul.outputs.size() != 1) continue;
    const int hot = matmul.inputs[0], w = matmul.inputs[1], y = matmul.outputs[0];
    if (hot < 0 || w < 0 || !st.values[w].known || st.values[w].value.rank() != 2 || !PrivateValue(st, c, hot) ||
        producer[hot] < 0)
      continue;
    const DType dtype = st.values[w].value.dtype();
    const int64_t depth = st.values[w].value.dim(0), width = st.values[w].value.dim(1);
    if (st.values[hot].dtype != dtype) continue;
    const int made_by = producer[hot];
    int idx = -1, mode = 1;  // mode: kGatherZeroOutside's value
    std::vector<int> gone;   // the nodes that made the one-hot tensor
    Shape hot_shape;
    // OneHot, or OneHot -> Cast (PyTorch: F.one_hot gives int64, `.float()` casts it).
    int one_hot_at = made_by;
    const Node& last = st.nodes[made_by];
    if (last.op_type == "Cast" && last.inputs.size() == 1 && PrivateValue(st, c, last.inputs[0]) &&
        producer[last.inputs[0]] >= 0 && st.nodes[producer[last.inputs[0]]].op_type == "OneHot") {
      gone.push_back(made_by);
      one_hot_at = producer[last.inputs[0]];
    }
    if (st.nodes[one_hot_at].op_type == "OneHot") {
      // OneHot(idx, D, [0, 1]) along the innermost axis: negative indices wrap once, as OneHot's do.
      const Node& one_hot = st.nodes[one_hot_at];
      if (one_hot.inputs.size() != 3 || one_hot.inputs[1] < 0 || one_hot.inputs[2] < 0) continue;
      const CompileValue& values = st.values[one_hot.inputs[2]];
      if (!values.known || values.value.numel() != 2 || values.value.GetAsDouble(0) != 0.0 ||
          values.value.GetAsDouble(1) != 1.0)
        continue;
      idx = one_hot.inputs[0];
      if (idx < 0) continue;
      const int64_t rank = static_cast<int64_t>(st.values[idx].shape.size());
      const int64_t axis = one_hot.GetInt("axis", -1);
      if (axis != -1 && axis != rank) continue;
      hot_shape = st.values[idx].shape;
      hot_shape.push_back(depth);
      mode = 2;
      gone.push_back(one_hot_at);
    } else {
      const Node& cast = st.nodes[made_by];
      if (cast.op_type != "Cast" || cast.inputs.size() != 1 || !PrivateValue(st, c, cast.inputs[0]) ||
          producer[cast.inputs[0]] < 0)
        continue;
      const Node& equal = st.nodes[producer[cast.inputs[0]]];
      if (equal.op_type != "Equal" || equal.inputs.size() != 2) continue;
      for (int k = 0; k < 2; ++k)
        if (IsArange(st, equal.inputs[1 - k], depth)) idx = equal.inputs[k];
      if (idx < 0 || st.values[idx].shape.empty() || st.values[idx].shape.back() != 1) continue;
      // The one-hot tensor is idx's shape with the 1 replaced by depth (no other broadcasting).
      hot_shape = st.values[idx].shape;
      hot_shape.back() = depth;
      gone = {made_by, producer[cast.inputs[0]]};
    }
    const Shape idx_shape = st.values[idx].shape;
    const DType idx_dtype = st.values[idx].dtype;
    if (st.values[idx].known || (idx_dtype != DType::kI32 && idx_dtype != DType::kI64) ||
        st.values[hot].shape != hot_shape)
      continue;
    // The Gather writes y: its indices are idx without the trailing 1 (the Equal form; a Reshape of a few integers
    // in front) or idx itself (OneHot).
    Shape indices_shape = idx_shape;
    if (mode == 1) indices_shape.pop_back();
    Shape gathered = indices_shape;
    gathered.push_back(width);
    if (st.values[y].shape != gathered) continue;
    int indices = idx;
    if (mode == 1) {
      Node reshape;
      reshape.op_type = "Reshape";
      reshape.name = matmul.name + "/one_hot_indices";
      reshape.inputs = {idx, st.AddConstant(Tensor::FromVector<int64_t>(
                                 {static_cast<int64_t>(indices_shape.size())}, indices_shape))};
      indices = st.AddValue(idx_dtype, indices_shape);
      reshape.outputs = {indices};
      before[i] = std::move(reshape);
    }
    Node gather;
    gather.op_type = "Gather";
    gather.name = matmul.name;
    gather.inputs = {w, indices};
    gather.outputs = {y};
    gather.attrs["axis"] = Attribute::Int(0);
    gather.attrs[kGatherZeroOutside] = Attribute::Int(mode);
    for (int node : gone) dead[node] = 1;
    matmul = std::move(gather);
  }
  if (before.empty() && std::find(dead.begin(), dead.end(), 1) == dead.end()) return;
  // Equal, Cast and OneHot are gone; each indices Reshape goes right before its Gather (the MatMul's place).
  std::vector<Node> nodes;
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    if (dead[i]) continue;
    if (auto it = before.find(i); it != before.end()) nodes.push_back(std::move(it->second));
    nodes.push_back(std::move(st.nodes[i]));
  }
  st.nodes = std::move(nodes);
}

}  // namespace

void FuseTfExportPatterns(CompileState& st) {
  FuseHardActivations(st);
  SinkChannelTransposes(st);
  CollapseMovementChains(st);
  OneHotMatMulToGather(st);
}

}  // namespace osprey
