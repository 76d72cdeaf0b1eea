// ONNX ops the standard defines as functions of other ops, added after opset 21: Attention (23; its schema is shared
// with com.microsoft's, ops/contrib.cc), RMSNormalization (23), RotaryEmbedding (23), Swish (24), SwiGLU (28). They are
// lowered to those ops when a model is compiled (runtime/function_ops.cc), so their schemas here only give arities
// for ValidateOps.
#include "ops/op_registry.h"

namespace osprey {

void RegisterFunctionOps(OpRegistry& r) {
  r.Add(OpSchema{"RMSNormalization", 2, 2, 1, 1, LoweredWhenCompiled, {}});      // (X, scale) -> Y
  // ONNX Runtime's RMS norm, which its optimiser writes in the default domain: (X, scale) -> (Y, inv_std_var?)
  r.Add(OpSchema{"SimplifiedLayerNormalization", 2, 2, 1, 2, LoweredWhenCompiled, {}});
  r.Add(OpSchema{"RotaryEmbedding", 3, 4, 1, 1, LoweredWhenCompiled, {}});       // (X, cos, sin, position_ids?)
  r.Add(OpSchema{"Swish", 1, 1, 1, 1, LoweredWhenCompiled, {}});                 // x * sigmoid(alpha x)
  r.Add(OpSchema{"SwiGLU", 2, 2, 1, 1, LoweredWhenCompiled, {}});                // Swish(A) * B
}

}  // namespace osprey
