// CLI subcommands called as library functions. Oracle: values computed by hand for a tiny Add+Relu model.
#ifndef ONNX_ML
#define ONNX_ML 1
#endif
#ifndef ONNX_NAMESPACE
#define ONNX_NAMESPACE onnx
#endif
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/common.h"
#include "osprey/npy.h"

namespace osprey::cli {
namespace {

namespace fs = std::filesystem;

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("osprey_cli_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // y = relu(x + [1, -2, 0.5]) with x: float32 [N, 3]; output named "out/y:0" to exercise file-name sanitising.
  std::string WriteModel(const std::string& extra_op = "") {
    onnx::ModelProto m;
    m.set_ir_version(8);
    m.add_opset_import()->set_version(17);
    auto* g = m.mutable_graph();
    g->set_name("addrelu");
    auto* x = g->add_input();
    x->set_name("x");
    auto* tt = x->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto_DataType_FLOAT);
    tt->mutable_shape()->add_dim()->set_dim_param("N");
    tt->mutable_shape()->add_dim()->set_dim_value(3);
    auto* w = g->add_initializer();
    w->set_name("W");
    w->set_data_type(onnx::TensorProto_DataType_FLOAT);
    w->add_dims(3);
    for (float v : {1.f, -2.f, 0.5f}) w->add_float_data(v);
    auto* add = g->add_node();
    add->set_op_type("Add");
    add->set_name("add");
    add->add_input("x");
    add->add_input("W");
    add->add_output("s");
    auto* relu = g->add_node();
    relu->set_op_type(extra_op.empty() ? "Relu" : extra_op);
    relu->set_name("act");
    relu->add_input("s");
    relu->add_output("out/y:0");
    g->add_output()->set_name("out/y:0");
    std::string path = (dir_ / "model.onnx").string();
    std::ofstream(path, std::ios::binary) << m.SerializeAsString();
    return path;
  }

  fs::path dir_;
};

TEST(CliHelpers, SanitizeFileName) {
  EXPECT_EQ(SanitizeFileName("logits"), "logits");
  EXPECT_EQ(SanitizeFileName("out/y:0"), "out_y_0");
  EXPECT_EQ(SanitizeFileName("../../etc/passwd"), ".._.._etc_passwd");
  EXPECT_EQ(SanitizeFileName(".."), "_..");
  EXPECT_EQ(SanitizeFileName(""), "_");
  EXPECT_EQ(SanitizeFileName("a b\\c"), "a_b_c");
}

TEST(CliHelpers, DimOverridesAndShapes) {
  auto dims = ParseDimOverrides({"N=4", "seq=0"});
  EXPECT_EQ(dims.at("N"), 4);
  EXPECT_EQ(dims.at("seq"), 0);
  EXPECT_THROW(ParseDimOverrides({"N"}), Error);
  EXPECT_THROW(ParseDimOverrides({"N=-1"}), Error);
  EXPECT_THROW(ParseDimOverrides({"N=4x"}), Error);
  ValueInfo info;
  info.name = "x";
  info.has_shape = true;
  info.dims = {{-1, "N"}, {3, ""}, {-1, "?"}};
  EXPECT_EQ(ConcreteInputShape(info, dims), (Shape{4, 3, 1}));
  info.has_shape = false;
  EXPECT_THROW(ConcreteInputShape(info, dims), Error);
  uint64_t state = 7;
  Tensor r = RandomInput(DType::kF32, {13}, &state);
  for (float v : r.ToFloatVector()) {
    EXPECT_GE(v, 0.f);
    EXPECT_LT(v, 1.f);
  }
  EXPECT_EQ(RandomInput(DType::kI64, {3}, &state).ToInt64Vector(), (std::vector<int64_t>{0, 0, 0}));
}

TEST_F(CliTest, RunWritesSanitisedOutputs) {
  std::string model = WriteModel();
  std::string x = (dir_ / "x.npy").string();
  WriteNpy(x, Tensor::FromVector<float>({2, 3}, {0, 0, 0, 1, 1, -1}));
  RunOptions options;
  options.model = model;
  options.inputs = {"x=" + x};
  options.output_dir = (dir_ / "out").string();
  options.threads = 1;
  std::ostringstream out;
  EXPECT_EQ(RunRun(options, out), 0);
  EXPECT_NE(out.str().find("out/y:0  float32  [2, 3]"), std::string::npos) << out.str();
  Tensor y = ReadNpy((dir_ / "out" / "out_y_0.npy").string());
  EXPECT_EQ(y.ToFloatVector(), (std::vector<float>{1, 0, 0.5f, 2, 0, 0}));

  options.reference = true;
  options.inputs.clear();
  options.random_inputs = true;
  options.dims = {"N=5"};
  std::ostringstream out2;
  EXPECT_EQ(RunRun(options, out2), 0);
  EXPECT_EQ(ReadNpy((dir_ / "out" / "out_y_0.npy").string()).shape(), (Shape{5, 3}));
}

TEST_F(CliTest, RunReportsInputMistakes) {
  std::string model = WriteModel();
  RunOptions options;
  options.model = model;
  options.output_dir = (dir_ / "out").string();
  std::ostringstream out;
  try {
    options.inputs = {"nope=" + (dir_ / "x.npy").string()};
    RunRun(options, out);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'x' (float32 [N, 3])"), std::string::npos) << e.what();
  }
  try {
    options.inputs.clear();
    RunRun(options, out);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing input"), std::string::npos) << e.what();
  }
  // Wrong rank: the runtime's message comes through.
  std::string x = (dir_ / "x.npy").string();
  WriteNpy(x, Tensor::FromVector<float>({3}, {1, 2, 3}));
  options.inputs = {"x=" + x};
  EXPECT_THROW(RunRun(options, out), Error);
}

TEST_F(CliTest, InspectListsUnsupportedOps) {
  std::ostringstream out;
  InspectOptions options;
  options.model = WriteModel();
  EXPECT_EQ(RunInspect(options, out), 0);
  EXPECT_NE(out.str().find("[N, 3]"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("parameters: 3 (12 B)"), std::string::npos) << out.str();

  options.model = WriteModel("NoSuchOp");
  options.json = true;
  std::ostringstream json_out;
  EXPECT_EQ(RunInspect(options, json_out), 1);
  auto j = nlohmann::json::parse(json_out.str());
  EXPECT_EQ(j["unsupported_ops"][0], "NoSuchOp (node 'act')");
  EXPECT_EQ(j["ops"]["Add"], 1);
  EXPECT_EQ(j["inputs"][0]["dims"][0], "N");
  EXPECT_EQ(j["parameters"], 3);
}

TEST_F(CliTest, BenchJson) {
  BenchOptions options;
  options.model = WriteModel("Abs");  // two steps (a Relu would become the Add's fused step)
  options.batch = 4;
  options.iters = 3;
  options.warmup = 0;
  options.threads = 1;
  options.json = true;
  options.profile = true;
  std::ostringstream out;
  EXPECT_EQ(RunBench(options, out), 0);
  auto j = nlohmann::json::parse(out.str());
  for (const char* key : {"median_ms", "p90_ms", "min_ms", "mean_ms", "first_run_ms", "images_per_s"})
    EXPECT_TRUE(j.contains(key) && j[key].is_number()) << key;
  EXPECT_EQ(j["batch"], 4);
  EXPECT_EQ(j["threads"], 1);
  EXPECT_LE(j["min_ms"].get<double>(), j["median_ms"].get<double>());
  EXPECT_LE(j["median_ms"].get<double>(), j["p90_ms"].get<double>());
  EXPECT_TRUE(j["profile"]["op_types"].is_array());
  // --top: the slowest N nodes, 0 for all of them.
  const size_t all = j["profile"]["top_nodes"].size();
  ASSERT_GE(all, 2u);
  for (const int top : {1, 0}) {
    options.top = top;
    std::ostringstream listed;
    EXPECT_EQ(RunBench(options, listed), 0);
    EXPECT_EQ(nlohmann::json::parse(listed.str())["profile"]["top_nodes"].size(), top == 0 ? all : 1u) << top;
  }
}

}  // namespace
}  // namespace osprey::cli
