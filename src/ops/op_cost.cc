#include "ops/op_cost.h"

#include <algorithm>
#include <limits>
#include <string>

#include "ops/fused_pool.h"
#include "ops/matmul_views.h"
#include "osprey/error.h"

namespace osprey {
namespace {

constexpr int64_t kCap = std::numeric_limits<int64_t>::max() / 4;

int64_t Mul(int64_t a, int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  return a > kCap / b ? kCap : a * b;
}

int64_t Elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d <= 0) return 0;
    n = Mul(n, d);
  }
  return n;
}

int64_t Product(const Shape& s, size_t from) {
  int64_t n = 1;
  for (size_t i = from; i < s.size(); ++i) n = Mul(n, s[i]);
  return n;
}

}  // namespace

int64_t EstimatedWork(const Node& node, const std::vector<Shape>& in, const std::vector<Shape>& out) {
  const std::string& op = node.op_type;
  const bool conv = op == "Conv" || op == "ConvInteger" || op == "ConvTranspose";
  const size_t w_index = op == "QLinearConv" ? 3 : 1;
  if ((conv || op == "QLinearConv") && !out.empty() && in.size() > w_index && in[w_index].size() >= 3) {
    // W is [C_out, C_in / group, k...] for Conv: every output element sums C_in / group x k products. For
    // ConvTranspose W is [C_in, C_out / group, k...]: every input element feeds C_out / group x k outputs.
    const Shape& w = in[w_index];
    if (HasFusedPool(node) && in[0].size() == 4 && w.size() == 4) {  // the convolution's output, before its pool
      try {
        return Mul(2, Mul(Elements(FusedConvOutputShape(node, in[0], w)), Product(w, 1)));
      } catch (const Error&) {
        return 0;  // the shape rule refuses it
      }
    }
    return Mul(2, Mul(Elements(op == "ConvTranspose" ? in[0] : out[0]), Product(w, 1)));
  }
  if ((op == "Gemm" || op == "MatMul" || op == "MatMulInteger" || op == "QLinearMatMul") && !out.empty() &&
      !in.empty() && !in[0].empty()) {
    const bool trans_a = op == "Gemm" && node.GetInt("transA", 0) != 0;
    const Shape& a = in[0];
    const int64_t k = trans_a && a.size() >= 2 ? a[a.size() - 2] : a.back();
    return Mul(2, Mul(Elements(out[0]), k));
  }
  if (op == kMatMulViewsOp && !out.empty()) {  // operands are views: K is the last of a_dims
    const std::vector<int64_t> a_dims = node.GetInts("a_dims", {});
    return a_dims.empty() ? 0 : Mul(2, Mul(Elements(out[0]), a_dims.back()));
  }
  if (op == kAttentionViewsOp && !out.empty()) {  // M x T scores of D products, then M x Dv outputs of T products
    const std::vector<int64_t> q = node.GetInts("q_dims", {}), k = node.GetInts("k_dims", {}),
                               v = node.GetInts("v_dims", {});
    if (q.empty() || k.empty() || v.empty() || v.back() < 1) return 0;
    const int64_t rows = Elements(out[0]) / v.back();  // context rows, one row of T scores each
    return Mul(2, Mul(rows, Mul(k.back(), std::min(kCap, q.back() + v.back()))));
  }
  if ((op == "LSTM" || op == "GRU" || op == "RNN") && in.size() >= 3 && in[0].size() == 3 && in[2].size() == 3) {
    // X [seq, batch, I] (or batch-first: the product is the same), R [dirs, gates x H, H].
    const int64_t inputs = in[0][2], hidden_rows = in[2][1], hidden = in[2][2], dirs = in[2][0];
    return Mul(2, Mul(Mul(in[0][0], in[0][1]), Mul(Mul(dirs, hidden_rows), inputs + hidden)));
  }
  int64_t n = 0;
  for (const auto* shapes : {&in, &out})
    for (const Shape& s : *shapes) n = std::min(kCap, n + Elements(s));
  return n;
}

}  // namespace osprey
