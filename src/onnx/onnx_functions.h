#pragma once
// Model-local functions (ModelProto.functions): a node whose domain and op_type (and overload) name one of them is
// replaced by the function's body, as ONNX Runtime inlines them. Internal to src/onnx.
#include <onnx/onnx_pb.h>

namespace osprey {

/// Most nodes all function calls of one model may expand to, and how deep calls may nest (hostile files: a function
/// calling itself, or each calling the next twice).
inline constexpr long kMaxInlinedNodes = 1 << 20;
inline constexpr int kMaxFunctionDepth = 32;

/// Replaces every call of a model-local function in the model's graph (and in If/Loop/Scan bodies) by the function's
/// nodes: formal inputs and outputs renamed to the call's, the body's own values to "<call>/<name>", attributes
/// given by reference (`ref_attr_name`) taken from the call or the function's defaults. The functions themselves are
/// dropped. Throws kInvalidArgument for malformed functions, kUnsupported for what is not inlined (a body whose
/// default-domain opset differs from the model's, subgraphs inside a body).
void InlineModelFunctions(onnx::ModelProto* model, int model_opset);

}  // namespace osprey
