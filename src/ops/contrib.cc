// ONNX Runtime's contrib (com.microsoft) domain: which of its ops osprey reads. Its quantiser writes QLinearAdd,
// QLinearGlobalAveragePool, QGemm, DynamicQuantizeLSTM and its own QuantizeLinear / DequantizeLinear (schemas:
// quantize.cc), and QLinearMul, QLinearSoftmax, QLinearConcat (lowered when compiled, below); its transformer optimiser
// (`onnxruntime.transformers.optimizer`, Optimum's ORTOptimizer) writes Gelu (the default domain's, exact), FastGelu
// (the tanh form, with an optional bias added first), BiasGelu, QuickGelu (x * sigmoid(alpha x)),
// SkipLayerNormalization (LayerNormalization of input + skip [+ bias] over the last axis) Attention (self-attention
// with merged Q/K/V weights) and MultiHeadAttention (Q, K, V projected apart). The last four are lowered to
// default-domain ops when a model is compiled (runtime/contrib_ops.cc), so their schemas here only give arities for
// ValidateOps; inference runs on the lowered nodes. A model ONNX Runtime saved after optimising it
// (SessionOptions.optimized_model_filepath at ORT_ENABLE_EXTENDED, ORT's documented offline mode) holds FusedConv
// (Conv [+ Z] + activation), FusedGemm, FusedMatMul (TransposeMatMul, its older name) and DynamicQuantizeMatMul,
// lowered the same way. Its NCHWc ops (com.microsoft.nchwc, saved at ORT_ENABLE_ALL) are hardware-specific and refused
// with that advice (ValidateOps).
#include <string>

#include "ops/op_registry.h"

namespace osprey {

bool IsContribOnlyOp(const std::string& op_type) {
  return op_type == "QLinearAdd" || op_type == "QLinearGlobalAveragePool" || op_type == "QGemm" ||
         op_type == "DynamicQuantizeLSTM" || op_type == "FastGelu" || op_type == "BiasGelu" || op_type == "QuickGelu" ||
         op_type == "SkipLayerNormalization" || op_type == "MultiHeadAttention" || op_type == "QLinearMul" ||
         op_type == "QLinearSoftmax" || op_type == "QLinearConcat" || op_type == "FusedConv" ||
         op_type == "FusedGemm" || op_type == "FusedMatMul" || op_type == "TransposeMatMul" ||
         op_type == "DynamicQuantizeMatMul";
}

bool IsMicrosoftDomainOp(const std::string& op_type) {
  return IsContribOnlyOp(op_type) || op_type == "QuantizeLinear" || op_type == "DequantizeLinear" ||
         op_type == "Gelu" || op_type == "Attention";
}

void RegisterContribOps(OpRegistry& r) {
  r.Add(OpSchema{"FastGelu", 1, 2, 1, 1, LoweredWhenCompiled, {}});
  r.Add(OpSchema{"BiasGelu", 2, 2, 1, 1, LoweredWhenCompiled, {}});
  r.Add(OpSchema{"QuickGelu", 1, 1, 1, 1, LoweredWhenCompiled, {}});
  // (input, skip, gamma, beta?, bias?) -> (output, mean?, inv_std_var?, input_skip_bias_sum?)
  r.Add(OpSchema{"SkipLayerNormalization", 3, 5, 1, 4, LoweredWhenCompiled, {}});
  // (input, weights, bias?, mask_index?, past?, attention_bias?, past_sequence_length?) -> (output, present?); the
  // arities also admit ONNX's Attention (opset 23: ops/function_ops.cc), each domain's checked where it is lowered.
  r.Add(OpSchema{"Attention", 2, 7, 1, 4, LoweredWhenCompiled, {}});
  // (query, key?, value?, bias?, key_padding_mask?, attention_bias?, past_key?, past_value?, past_sequence_length?,
  //  cache_indirection?) -> (output, present_key?, present_value?, qk?)
  r.Add(OpSchema{"MultiHeadAttention", 1, 10, 1, 4, LoweredWhenCompiled, {}});
  // The quantiser's QOperator forms, lowered to DequantizeLinear -> op -> QuantizeLinear.
  r.Add(OpSchema{"QLinearMul", 7, 8, 1, 1, LoweredWhenCompiled, {}});
  r.Add(OpSchema{"QLinearSoftmax", 5, 5, 1, 1, LoweredWhenCompiled, {}});
  r.Add(OpSchema{"QLinearConcat", 5, 2 + 3 * 4096, 1, 1, LoweredWhenCompiled, {}});
  // ORT's saved optimised models: (X, W, B?, Z?), (A, B, C?), (A, B), (A, B), (A, B, b_scale, b_zero_point?, bias?).
  r.Add(OpSchema{"FusedConv", 2, 4, 1, 1, LoweredWhenCompiled, {}});
  r.Add(OpSchema{"FusedGemm", 2, 3, 1, 1, LoweredWhenCompiled, {}});
  r.Add(OpSchema{"FusedMatMul", 2, 2, 1, 1, LoweredWhenCompiled, {}});
  r.Add(OpSchema{"TransposeMatMul", 2, 2, 1, 1, LoweredWhenCompiled, {}});
  r.Add(OpSchema{"DynamicQuantizeMatMul", 3, 5, 1, 1, LoweredWhenCompiled, {}});
}

}  // namespace osprey
