#pragma once
// An inference BatchNormalization as y = x * a + b per channel: the one float expression for a and b that its
// reference kernel, its fast kernel (kernels/cpu/batchnorm.cc) and the fusion taking it into a Conv's input
// (runtime/fusion.cc FuseConvInputs) compute, so that all of them agree bit for bit.
#include <cmath>

namespace osprey {

/// a = scale / sqrt(var + epsilon), b = shift - mean * a.
inline void BatchNormFactors(float scale, float shift, float mean, float var, float epsilon, float* a, float* b) {
  *a = scale / std::sqrt(var + epsilon);
  *b = shift - mean * *a;
}

}  // namespace osprey
