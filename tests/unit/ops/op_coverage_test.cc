// Op coverage (issue 11): every op osprey registers has a reference kernel (the oracle of its fast kernels) and a test
// that runs it: an ONNX backend node test the conformance suite runs, or a test source under tests/ naming it. A new op
// without either fails here, listed by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/reference/reference.h"
#include "ops/op_registry.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;

// Ops that never reach a kernel: the compiler folds them (Constant*, If, Loop and Scan when known), or replaces them
// before kernels are made. Each is covered by the compile-time tests named.
const std::set<std::string> kNoKernel = {
    "Constant",             // folded (tests/unit/runtime, conformance test_constant*)
    "ConstantOfShape",      // folded from the known shape
    "If",                   // inlined when compiled, or its branches compiled as plans run by IfAtRunTime
                            // (runtime/inline_if.cc, runtime_if.cc; tests/e2e/test_control_flow.py)
    "DynamicQuantizeLSTM",  // com.microsoft: an LSTM on dequantized weights (runtime/dynamic_quantize_lstm.cc;
                            // tests/e2e/test_recurrent.py)
    // com.microsoft, lowered to default-domain ops when compiled (runtime/contrib_ops.cc; test_contrib_ops.py)
    "FastGelu", "BiasGelu", "QuickGelu", "SkipLayerNormalization", "Attention", "MultiHeadAttention", "QLinearMul",
    "QLinearSoftmax", "QLinearConcat",
    // ONNX function ops (opsets 23-28), lowered to the ops that define them when compiled (runtime/function_ops.cc;
    // the conformance suite on the newest onnx, tests/onnx_latest); Attention is in both domains (above).
    "RMSNormalization", "RotaryEmbedding", "Swish", "SwiGLU",
    // ONNX Runtime's RMS norm in the default domain and its optimiser's com.microsoft ops (runtime/function_ops.cc,
    // contrib_ops.cc; tests/python/test_ort_optimized.py)
    "SimplifiedLayerNormalization", "FusedConv", "FusedGemm", "FusedMatMul", "TransposeMatMul", "DynamicQuantizeMatMul",
    "Loop",  // unrolled when compiled (runtime/inline_loop.cc; tests/e2e/test_control_flow.py)
    "Scan",  // unrolled when compiled (runtime/inline_loop.cc; tests/e2e/test_control_flow.py)
};

std::string Normalized(const std::string& s) {
  std::string out;
  for (char c : s)
    if (c != '_') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string Repo() {
  const char* r = std::getenv("OSPREY_REPO");
  return r ? r : "../..";
}

// Normalized names of the ONNX backend node tests in the project venvs' onnx packages: .venv's and .venv-onnx's (the
// newest onnx, whose data tools/onnx_node_data.py writes); empty when neither is installed.
std::vector<std::string> NodeTests() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const char* venv : {".venv", ".venv-onnx"}) {
  const fs::path lib = fs::path(Repo()) / venv / "lib";
  if (!fs::is_directory(lib, ec)) continue;
  for (const auto& py : fs::directory_iterator(lib, ec)) {
    const fs::path node = py.path() / "site-packages" / "onnx" / "backend" / "test" / "data" / "node";
    if (!fs::is_directory(node, ec)) continue;
    for (const auto& t : fs::directory_iterator(node, ec)) {
      const std::string n = t.path().filename().string();
      if (n.rfind("test_", 0) == 0) names.push_back(Normalized(n.substr(5)));
    }
  }
  }
  return names;
}

// The text of every C++ and Python test source.
std::string TestSources() {
  std::string all;
  std::error_code ec;
  for (const auto& f : fs::recursive_directory_iterator(fs::path(Repo()) / "tests", ec)) {
    const std::string ext = f.path().extension().string();
    if (ext != ".cc" && ext != ".py") continue;
    if (f.path().filename() == "op_coverage_test.cc") continue;  // this file names ops without testing them
    std::ifstream in(f.path());
    std::stringstream ss;
    ss << in.rdbuf();
    all += ss.str();
  }
  return all;
}

TEST(OpCoverage, EveryOpHasAReferenceKernel) {
  std::vector<std::string> missing;
  for (const std::string& op : OpRegistry::Get().Names()) {
    if (OpRegistry::TraitsOf(op).data_dependent) {
      // Sized at run time: RunDataDependentOp is their kernel (it knows the op: without inputs it asks for them).
      Node n;
      n.op_type = op;
      try {
        RunDataDependentOp(n, 13, {});
        missing.push_back(op);
      } catch (const Error& e) {
        if (e.code() == ErrorCode::kUnsupported) missing.push_back(op);
      }
      continue;
    }
    if (!kNoKernel.count(op) && FindReferenceKernel(op) == nullptr) missing.push_back(op);
  }
  EXPECT_TRUE(missing.empty()) << "ops without a reference kernel (src/kernels/reference), which every fast kernel "
                                  "is checked against: "
                               << ::testing::PrintToString(missing);
  for (const std::string& op : kNoKernel) EXPECT_NE(OpRegistry::Get().Find(op), nullptr) << op << " is not an op";
}

TEST(OpCoverage, EveryOpHasATest) {
  const std::vector<std::string> node_tests = NodeTests();
  if (node_tests.empty()) GTEST_SKIP() << "onnx's backend node tests not found in " << Repo() << "/.venv (make setup)";
  const std::string sources = TestSources();
  ASSERT_GT(sources.size(), 100000u) << "test sources not found under " << Repo() << "/tests (set OSPREY_REPO)";
  std::vector<std::string> untested;
  int by_node_test = 0;
  for (const std::string& op : OpRegistry::Get().Names()) {
    const std::string n = Normalized(op);
    if (std::any_of(node_tests.begin(), node_tests.end(), [&](const std::string& t) { return t.rfind(n, 0) == 0; })) {
      ++by_node_test;
      continue;
    }
    if (sources.find('"' + op + '"') == std::string::npos && sources.find('\'' + op + '\'') == std::string::npos)
      untested.push_back(op);
  }
  EXPECT_TRUE(untested.empty()) << "ops that no ONNX node test and no test under tests/ names: "
                                << ::testing::PrintToString(untested);
  EXPECT_GT(by_node_test, 100);  // the conformance suite covers most standard ops
}

}  // namespace
}  // namespace osprey
