// Strided views for _MatMulViews (matmul_views.h): how Transpose, Slice and Reshape act on one, and its attributes.
#include "ops/matmul_views.h"

#include <algorithm>

namespace osprey {

StridedView DenseView(const Shape& shape) {
  StridedView v;
  v.dims = shape;
  v.strides.assign(shape.size(), 1);
  for (int64_t a = static_cast<int64_t>(shape.size()) - 2; a >= 0; --a) v.strides[a] = v.strides[a + 1] * shape[a + 1];
  return v;
}

StridedView TransposedView(const StridedView& v, const std::vector<int64_t>& perm) {
  StridedView t;
  t.offset = v.offset;
  for (int64_t p : perm) {
    t.dims.push_back(v.dims[p]);
    t.strides.push_back(v.strides[p]);
  }
  return t;
}

StridedView SlicedView(const StridedView& v, const std::vector<int64_t>& first, const Shape& extent) {
  StridedView s = v;
  for (size_t a = 0; a < v.dims.size(); ++a) s.offset += first[a] * v.strides[a];
  s.dims = extent;
  return s;
}

bool ReshapeView(const StridedView& v, const Shape& to, StridedView* out) {
  // Axes of extent 1 carry no stride; the others are matched in groups of equal element counts, left to right. A
  // group of the view's axes must be one run of its innermost stride (each axis's stride = the next one's stride
  // times its extent); the new axes of the group then take strides inside that run.
  std::vector<int64_t> from_dims, from_strides;
  for (size_t a = 0; a < v.dims.size(); ++a)
    if (v.dims[a] != 1) from_dims.push_back(v.dims[a]), from_strides.push_back(v.strides[a]);
  std::vector<size_t> to_axes;  // the target's axes of extent > 1
  for (size_t a = 0; a < to.size(); ++a)
    if (to[a] != 1) to_axes.push_back(a);
  out->offset = v.offset;
  out->dims = to;
  out->strides.assign(to.size(), 0);
  size_t i = 0, j = 0;
  while (i < from_dims.size() || j < to_axes.size()) {
    if (i >= from_dims.size() || j >= to_axes.size()) return false;
    // The smallest groups [i, i2) and [j, j2) with equal products.
    size_t i2 = i + 1, j2 = j + 1;
    int64_t from_n = from_dims[i], to_n = to[to_axes[j]];
    while (from_n != to_n) {
      if (from_n < to_n) {
        if (i2 >= from_dims.size()) return false;
        from_n *= from_dims[i2++];
      } else {
        if (j2 >= to_axes.size()) return false;
        to_n *= to[to_axes[j2++]];
      }
    }
    for (size_t k = i; k + 1 < i2; ++k)
      if (from_strides[k] != from_strides[k + 1] * from_dims[k + 1]) return false;
    int64_t stride = from_strides[i2 - 1];
    for (size_t k = j2; k-- > j;) {
      out->strides[to_axes[k]] = stride;
      stride *= to[to_axes[k]];
    }
    i = i2;
    j = j2;
  }
  // Axes of extent 1: the stride an axis there would have in a dense layout of what follows (never multiplied).
  for (size_t a = to.size(); a-- > 0;)
    if (to[a] == 1) out->strides[a] = a + 1 < to.size() ? out->strides[a + 1] * to[a + 1] : 1;
  return true;
}

ViewProduct ProductOf(const Node& node, const StridedView& a, const StridedView& b) {
  const size_t rank = a.dims.size();
  ViewProduct p;
  for (size_t d = 0; d + 2 < rank; ++d) p.dims.push_back(std::max(a.dims[d], b.dims[d]));
  p.dims.push_back(a.dims[rank - 2]);
  p.dims.push_back(b.dims[rank - 1]);
  std::vector<int64_t> perm = node.GetInts("out_perm", {});
  if (perm.empty())
    for (size_t d = 0; d < rank; ++d) perm.push_back(static_cast<int64_t>(d));
  for (size_t d = 0; d < rank; ++d) p.output.push_back(p.dims[perm[d]]);
  const StridedView dense = DenseView(p.output);
  p.output_strides.assign(rank, 0);
  for (size_t d = 0; d < rank; ++d) p.output_strides[perm[d]] = dense.strides[d];
  return p;
}

AttentionProducts AttentionOf(const Node& node, const StridedView& q, const StridedView& k, const StridedView& v) {
  AttentionProducts p;
  p.scores = ProductOf(node, q, k).dims;  // (out_perm moves only the output)
  p.context = ProductOf(node, DenseView(p.scores), v);
  return p;
}

StridedView BroadcastView(const Shape& from, const Shape& to) {
  const StridedView dense = DenseView(from);
  StridedView v;
  v.dims = to;
  v.strides.assign(to.size(), 0);
  const size_t lead = to.size() - from.size();
  for (size_t a = 0; a < from.size(); ++a)
    if (from[a] != 1) v.strides[lead + a] = dense.strides[a];
  return v;
}

StridedView ReadView(const Node& node, const std::string& which) {
  StridedView v;
  v.offset = node.GetInt(which + "_offset", 0);
  v.dims = node.GetInts(which + "_dims", {});
  v.strides = node.GetInts(which + "_strides", {});
  return v;
}

void WriteView(Node& node, const std::string& which, const StridedView& v) {
  node.attrs[which + "_offset"] = Attribute::Int(v.offset);
  node.attrs[which + "_dims"] = Attribute::Ints(v.dims);
  node.attrs[which + "_strides"] = Attribute::Ints(v.strides);
}

}  // namespace osprey
