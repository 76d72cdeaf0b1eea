// Multinomial logistic regression by L-BFGS: sklearn's LogisticRegression objective (lbfgs solver), in double.
#include <algorithm>
#include <cmath>
#include <deque>

#include "osprey/error.h"
#include "osprey/heads.h"

namespace osprey::heads {
namespace {

struct Problem {
  const std::vector<float>& x;
  int64_t n, d, k;
  const std::vector<int>& y;
  double inv_c;

  // Loss and gradient at theta = [W (k x d) row-major, b (k)].
  double Eval(const std::vector<double>& theta, std::vector<double>* grad) const {
    const double* w = theta.data();
    const double* b = theta.data() + k * d;
    grad->assign(theta.size(), 0.0);
    double* gw = grad->data();
    double* gb = grad->data() + k * d;
    double loss = 0;
    std::vector<double> z(k);
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x.data() + i * d;
      double zmax = -INFINITY;
      for (int64_t c = 0; c < k; ++c) {
        const double* wc = w + c * d;
        double s = b[c];
        for (int64_t j = 0; j < d; ++j) s += wc[j] * xi[j];
        z[c] = s;
        zmax = std::max(zmax, s);
      }
      double sum = 0;
      for (int64_t c = 0; c < k; ++c) sum += std::exp(z[c] - zmax);
      const double lse = zmax + std::log(sum);
      loss += lse - z[y[i]];
      for (int64_t c = 0; c < k; ++c) {
        const double r = std::exp(z[c] - lse) - (c == y[i] ? 1.0 : 0.0);
        gb[c] += r;
        double* gwc = gw + c * d;
        for (int64_t j = 0; j < d; ++j) gwc[j] += r * xi[j];
      }
    }
    for (int64_t j = 0; j < k * d; ++j) {
      loss += 0.5 * inv_c * w[j] * w[j];
      gw[j] += inv_c * w[j];
    }
    return loss;
  }
};

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double MaxAbs(const std::vector<double>& a) {
  double m = 0;
  for (double v : a) m = std::max(m, std::abs(v));
  return m;
}

}  // namespace

SoftmaxFit FitSoftmax(const std::vector<float>& x, int64_t n, int64_t dim, const std::vector<int>& y, int64_t classes,
                      double c, int max_iter, double tol) {
  if (n < 1 || dim < 1 || classes < 2)
    throw Error(ErrorCode::kInvalidArgument, "training a head needs at least one image and two classes (got " +
                                                 std::to_string(n) + " images, " + std::to_string(classes) + " classes)");
  if (static_cast<int64_t>(x.size()) != n * dim || static_cast<int64_t>(y.size()) != n)
    throw Error(ErrorCode::kInvalidArgument, "FitSoftmax: x must hold n * dim values and y n labels");
  if (!(c > 0)) throw Error(ErrorCode::kInvalidArgument, "the inverse regularisation strength C must be > 0");
  for (int label : y)
    if (label < 0 || label >= classes) throw Error(ErrorCode::kInvalidArgument, "FitSoftmax: label out of range");
  Problem p{x, n, dim, classes, y, 1.0 / c};
  const size_t size = static_cast<size_t>(classes * dim + classes);
  std::vector<double> theta(size, 0.0), grad, next(size), next_grad, dir(size);
  double f = p.Eval(theta, &grad);
  const int kHistory = 10;
  std::deque<std::vector<double>> s_hist, y_hist;
  std::deque<double> rho_hist;
  SoftmaxFit fit;
  fit.classes = classes, fit.dim = dim;
  const double gtol = tol * std::max<double>(1.0, static_cast<double>(n));
  int it = 0;
  for (; it < max_iter; ++it) {
    if (MaxAbs(grad) <= gtol) {
      fit.converged = true;
      break;
    }
    // Two-loop recursion: dir = -H * grad.
    std::vector<double> q = grad;
    std::vector<double> alpha(s_hist.size());
    for (int h = static_cast<int>(s_hist.size()) - 1; h >= 0; --h) {
      alpha[h] = rho_hist[h] * Dot(s_hist[h], q);
      for (size_t i = 0; i < size; ++i) q[i] -= alpha[h] * y_hist[h][i];
    }
    double gamma = s_hist.empty() ? 1.0 / std::max(1.0, std::sqrt(Dot(grad, grad)))
                                  : Dot(s_hist.back(), y_hist.back()) / Dot(y_hist.back(), y_hist.back());
    for (size_t i = 0; i < size; ++i) q[i] *= gamma;
    for (size_t h = 0; h < s_hist.size(); ++h) {
      const double beta = rho_hist[h] * Dot(y_hist[h], q);
      for (size_t i = 0; i < size; ++i) q[i] += s_hist[h][i] * (alpha[h] - beta);
    }
    for (size_t i = 0; i < size; ++i) dir[i] = -q[i];
    double slope = Dot(grad, dir);
    if (slope >= 0) {  // not a descent direction (numerical trouble): restart from steepest descent
      s_hist.clear(), y_hist.clear(), rho_hist.clear();
      for (size_t i = 0; i < size; ++i) dir[i] = -grad[i] / std::max(1.0, std::sqrt(Dot(grad, grad)));
      slope = Dot(grad, dir);
    }
    // Backtracking line search (Armijo).
    double step = 1.0, f_next = 0;
    bool accepted = false;
    for (int ls = 0; ls < 40; ++ls) {
      for (size_t i = 0; i < size; ++i) next[i] = theta[i] + step * dir[i];
      f_next = p.Eval(next, &next_grad);
      if (f_next <= f + 1e-4 * step * slope) {
        accepted = true;
        break;
      }
      step *= 0.5;
    }
    if (!accepted) break;  // no progress possible at double precision: at the optimum
    std::vector<double> s(size), yv(size);
    for (size_t i = 0; i < size; ++i) s[i] = next[i] - theta[i], yv[i] = next_grad[i] - grad[i];
    const double sy = Dot(s, yv);
    if (sy > 1e-12) {
      s_hist.push_back(std::move(s)), y_hist.push_back(std::move(yv)), rho_hist.push_back(1.0 / sy);
      if (static_cast<int>(s_hist.size()) > kHistory) s_hist.pop_front(), y_hist.pop_front(), rho_hist.pop_front();
    }
    const double change = std::abs(f - f_next) / std::max({std::abs(f), std::abs(f_next), 1.0});
    theta.swap(next), grad.swap(next_grad), f = f_next;
    if (change < 1e-12) {
      fit.converged = true;
      ++it;
      break;
    }
  }
  fit.iterations = it;
  fit.loss = f;
  fit.weight.assign(theta.begin(), theta.begin() + classes * dim);
  fit.bias.assign(theta.begin() + classes * dim, theta.end());
  return fit;
}

}  // namespace osprey::heads
