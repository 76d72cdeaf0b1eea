#pragma once
// Dtype dispatch shared by the reference kernels: calls f(T{}) with the tensor's element type.
#include <cstdint>

#include "osprey/graph.h"

namespace osprey {

[[noreturn]] inline void UnsupportedDType(const Node& node, DType dtype) {
  throw Error(ErrorCode::kUnsupported,
              node.Describe() + ": the reference kernel does not support dtype " + DTypeName(dtype));
}

/// float32, int32, int64, int8, uint8.
template <class F>
void DispatchNumeric(const Node& node, DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: f(float{}); return;
    case DType::kI32: f(int32_t{}); return;
    case DType::kI64: f(int64_t{}); return;
    case DType::kI8: f(int8_t{}); return;
    case DType::kU8: f(uint8_t{}); return;
    default: UnsupportedDType(node, dtype);
  }
}

/// float32, int32, int64: the dtypes arithmetic reductions and contractions take.
template <class F>
void DispatchArithmetic(const Node& node, DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      f(float{});
      return;
    case DType::kI32:
      f(int32_t{});
      return;
    case DType::kI64:
      f(int64_t{});
      return;
    default:
      UnsupportedDType(node, dtype);
  }
}

/// float32, int32, int64, int8: the signed dtypes (Neg, Abs, Sign, Relu, PRelu).
template <class F>
void DispatchSigned(const Node& node, DType dtype, F&& f) {
  if (dtype == DType::kI8)
    f(int8_t{});
  else
    DispatchArithmetic(node, dtype, f);
}

}  // namespace osprey
