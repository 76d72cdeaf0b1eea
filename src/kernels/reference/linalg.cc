// Reference kernel of Det (ops/linalg.cc): Gaussian elimination with partial pivoting in double precision; a zero
// pivot column gives 0.
#include <cmath>
#include <utility>
#include <vector>

#include "kernels/reference/reference.h"

namespace osprey {
namespace {

void DetKernel(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  Tensor& out = ctx.Out(0);
  const int64_t m = x.dim(x.rank() - 1), count = out.numel();
  const float* in = x.data<float>();
  float* o = out.data<float>();
  std::vector<double> a(static_cast<size_t>(m * m));
  for (int64_t b = 0; b < count; ++b) {
    for (int64_t i = 0; i < m * m; ++i) a[i] = in[b * m * m + i];
    double det = 1;
    for (int64_t col = 0; col < m && det != 0; ++col) {
      int64_t pivot = col;
      for (int64_t r = col + 1; r < m; ++r)
        if (std::abs(a[r * m + col]) > std::abs(a[pivot * m + col])) pivot = r;
      if (a[pivot * m + col] == 0) {
        det = 0;
        break;
      }
      if (pivot != col) {
        for (int64_t c = 0; c < m; ++c) std::swap(a[pivot * m + c], a[col * m + c]);
        det = -det;
      }
      det *= a[col * m + col];
      for (int64_t r = col + 1; r < m; ++r) {
        const double f = a[r * m + col] / a[col * m + col];
        for (int64_t c = col; c < m; ++c) a[r * m + c] -= f * a[col * m + c];
      }
    }
    o[b] = static_cast<float>(det);
  }
}

}  // namespace

void AddLinalgReferenceKernels(ReferenceKernelTable& t) { t.Add("Det", DetKernel); }

}  // namespace osprey
