#pragma once
// Einsum's equation, read once against the input shapes: for the schema (output shape, size limits), the reference
// kernel (a loop over every label) and the compiler's lowering of two-input contractions to MatMul (runtime).
#include <string>
#include <vector>

#include "osprey/tensor.h"

namespace osprey {

/// Labels are numbered 0..sizes.size()-1: letters in order of first appearance, then one label per dim an ellipsis
/// stands for (right-aligned across the inputs, as numpy broadcasts them).
struct EinsumSpec {
  std::vector<std::vector<int>> inputs;  // per input, the label of each dim (a label twice: that diagonal)
  std::vector<int> output;               // the label of each output dim (distinct)
  std::vector<int64_t> sizes;            // per label
  /// Per input and label, how many elements one step of the label moves in that input (0: broadcast or absent; a
  /// label twice in an input: the sum of both strides).
  std::vector<std::vector<int64_t>> strides;
  Shape OutputShape() const;
  /// Multiply-adds of the direct evaluation: the product of every label's size (saturates at INT64_MAX).
  int64_t Work() const;
};

/// Reads `equation` ("ij,jk->ik", implicit output, "...", spaces allowed) for inputs of `shapes`; throws
/// Error(kInvalidArgument) naming what is wrong (`where` starts the message).
EinsumSpec ParseEinsum(const std::string& equation, const std::vector<Shape>& shapes, const std::string& where);

/// The most multiply-adds an Einsum that is not lowered to MatMul may take (the reference loop runs them one by one):
/// a few seconds. Larger ones are refused when the model is compiled instead of holding a CPU for minutes.
constexpr int64_t kMaxEinsumWork = int64_t{1} << 32;

}  // namespace osprey
