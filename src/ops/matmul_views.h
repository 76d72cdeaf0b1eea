#pragma once
// _MatMulViews(A source, B source) -> Y: a batched MatMul whose operands are strided views of larger tensors, made by
// the attention fusion (runtime/fusion.cc, FuseMatMulViews) from MatMul(Transpose(Reshape(Slice(qkv))), ...) so the
// Slices, Reshapes and Transposes between a transformer's QKV projection and its attention products copy nothing.
//
// Attributes, for operand a (input 0) and b (input 1), in elements of that input: `a_offset` (int >= 0), `a_dims`
// and `a_strides` (ints, one per axis, rank 2-6, the same rank for a and b); operand a is the tensor of shape a_dims
// whose element [i0, i1, ...] is the source's flat element a_offset + sum(i_k * a_strides[k]) (every one inside the
// source; no more elements than the source has, a stride of 0 only on an axis of extent 1). The product P = a x b is
// batched over the leading axes (broadcast where one side has 1), times `scale` (float, default 1: a Div or Mul by a
// scalar folded in); `out_perm` (ints, optional) makes the output Transpose(P, out_perm), written in place of a
// separate copy. The schema (internal_ops.cc) checks all of it, so a graph may carry such a node directly.
//
// _AttentionViews(Q source, K source, V source) -> Y: Softmax(scale x q k) v, one attention over strided views, made
// by FuseAttentionViews from a _MatMulViews (or MatMul) product, the Softmax over its last axis and the product of
// that with v, on CPUs whose kernel takes it (kernels/cpu/attention_kernel.cc), so the scores stay in the cache.
// Attributes: the views `q_*` ([..., M, D]), `k_*` (k transposed: [..., D, T]) and `v_*` ([..., T, Dv]), as a
// _MatMulViews operand's, the same rank, batch axes broadcasting; `scale` and `out_perm` as _MatMulViews's (of the
// second product). Optional input 3, `bias`: float32, numpy-broadcastable to the scores' shape, added to scale q k
// before the softmax (Swin's relative position bias and shifted-window mask, an attention mask). The output is
// Transpose(softmax(scale q k + bias) v, out_perm).
#include <cstdint>
#include <string>
#include <vector>

#include "osprey/graph.h"

namespace osprey {

inline constexpr const char* kMatMulViewsOp = "_MatMulViews";
inline constexpr const char* kAttentionViewsOp = "_AttentionViews";

/// The most multiply-adds one _AttentionViews node may take (scores x (D + Dv)): its output does not bound its work as
/// a MatMul's does (a [M, 1] context can stand for M x T scores), so the schema refuses more, where the unfused graph
/// would have held a scores tensor of that size. ~1.1e12: seconds on a few cores; ViT-H's 16 heads of 4096 tokens of
/// 80 take about 2^35.
inline constexpr int64_t kMaxAttentionWork = int64_t{1} << 40;

/// A strided view of a plain tensor, in elements: element [i_0, ...] of the view is flat element
/// offset + sum(i_k * strides[k]).
struct StridedView {
  int64_t offset = 0;
  std::vector<int64_t> dims, strides;
};

/// The whole of a dense row-major tensor of `shape`.
StridedView DenseView(const Shape& shape);

/// The view permuted like Transpose(perm) permutes a tensor (perm a permutation of the view's axes).
StridedView TransposedView(const StridedView& v, const std::vector<int64_t>& perm);

/// The view of the elements [first, first + extent) per axis (a Slice with unit steps).
StridedView SlicedView(const StridedView& v, const std::vector<int64_t>& first, const Shape& extent);

/// The view reshaped to `to` (same element count) where strides can express it (each group of axes merged was
/// itself laid out as one run of a stride); false otherwise.
bool ReshapeView(const StridedView& v, const Shape& to, StridedView* out);

/// The product of a _MatMulViews node whose operands are `a` and `b` (as its schema checked them): `dims` its shape
/// (the batch axes broadcast, then M and N), `output` the node's output shape (`dims` permuted by `out_perm`) and
/// `output_strides` the stride, in that dense output, of each of the product's axes.
struct ViewProduct {
  Shape dims, output;
  std::vector<int64_t> output_strides;
};
ViewProduct ProductOf(const Node& node, const StridedView& a, const StridedView& b);

/// The two products of an _AttentionViews node with views `q`, `k`, `v`: `scores` = q k (its dims; dense), `context` =
/// softmax(scores) v, as ProductOf gives it (dims, the node's output shape and strides).
struct AttentionProducts {
  Shape scores;
  ViewProduct context;
};
AttentionProducts AttentionOf(const Node& node, const StridedView& q, const StridedView& k, const StridedView& v);

/// A tensor of shape `from` read as one of shape `to` it broadcasts to (numpy rules, `from` aligned to the right):
/// dims `to`, strides 0 on the axes it repeats. Not a view the schemas accept (it repeats elements): for reading only.
StridedView BroadcastView(const Shape& from, const Shape& to);

/// Operand `which` ("a" or "b"; "q", "k" or "v") of a _MatMulViews (_AttentionViews) node, as its attributes give it
/// (unchecked).
StridedView ReadView(const Node& node, const std::string& which);
void WriteView(Node& node, const std::string& which, const StridedView& v);

}  // namespace osprey
