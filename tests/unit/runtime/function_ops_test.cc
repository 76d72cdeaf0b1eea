// ONNX's function ops lowered when compiled (src/runtime/function_ops.cc): what onnx's node tests and
// tests/onnx_latest cannot reach through a model file with data, i.e. declared sizes no input could have.
#include <gtest/gtest.h>

#include <string>

#include "fusion_test_util.h"
#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey {
namespace {

// A causal Attention whose declared query and key counts multiply past int64 (2^40 x 2^40) is refused when compiled,
// with the bound on its mask, not built (or overflowed) first.
TEST(FunctionOps, AttentionWithHugeDeclaredDimsIsRefusedWhenCompiled) {
  for (int64_t tokens : {int64_t{1} << 13, int64_t{1} << 40}) {
    SCOPED_TRACE(tokens);
    GraphBuilder b("attention", 23);
    const Shape shape = {1, 1, tokens, 1};
    auto q = b.Input("q", DType::kF32, shape);
    auto k = b.Input("k", DType::kF32, shape);
    auto v = b.Input("v", DType::kF32, shape);
    b.Output(b.Op("Attention", {q, k, v}, {{"is_causal", Attribute::Int(1)}}), "y");
    const Graph g = b.Finish();
    try {
      Compile(g, {{DType::kF32, shape}, {DType::kF32, shape}, {DType::kF32, shape}}, testing::kOracle);
      FAIL() << "compiled";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find("too many for a masked attention"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace osprey
