// ONNX importer. Models are built here with the ONNX protobuf classes; the oracle is the values written into them.
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
#include <functional>

#include "osprey/onnx.h"
#include "osprey/runtime.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;

onnx::ModelProto NewModel(int opset = 17) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(opset);
  m.mutable_graph()->set_name("test_graph");
  return m;
}

onnx::ValueInfoProto* AddInfo(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list, const std::string& name,
                              int elem_type, const std::vector<std::string>& dims) {
  auto* vi = list->Add();
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem_type);
  auto* shape = tt->mutable_shape();
  for (const std::string& d : dims) {
    auto* dim = shape->add_dim();
    if (d.empty()) continue;  // neither value nor param
    if (d[0] >= '0' && d[0] <= '9')
      dim->set_dim_value(std::stoll(d));
    else
      dim->set_dim_param(d);
  }
  return vi;
}

onnx::NodeProto* AddNode(onnx::GraphProto* g, const std::string& op, const std::vector<std::string>& inputs,
                         const std::vector<std::string>& outputs, const std::string& name = "") {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(name);
  for (const auto& i : inputs) n->add_input(i);
  for (const auto& o : outputs) n->add_output(o);
  return n;
}

onnx::TensorProto* AddFloatInit(onnx::GraphProto* g, const std::string& name, const std::vector<int64_t>& dims,
                                const std::vector<float>& values, bool raw) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto_DataType_FLOAT);
  for (int64_t d : dims) t->add_dims(d);
  if (raw)
    t->set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  else
    for (float v : values) t->add_float_data(v);
  return t;
}

Graph Parse(const onnx::ModelProto& m, const std::string& dir = "", bool validate = true) {
  std::string bytes = m.SerializeAsString();
  OnnxImportOptions options;
  options.validate_ops = validate;
  return ParseOnnxModel(bytes.data(), bytes.size(), dir, options);
}

Error ParseFails(const onnx::ModelProto& m, const std::string& dir = "") {
  try {
    Parse(m, dir);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "import did not fail";
  return Error(ErrorCode::kInternal, "");
}

const Tensor& ConstantNamed(const Graph& g, const std::string& name) {
  int id = g.FindValue(name);
  EXPECT_GE(id, 0) << name;
  auto it = g.constants.find(id);
  if (it == g.constants.end()) throw std::runtime_error("no constant " + name);
  return it->second;
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("osprey_onnx_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_ / "model");
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path model_dir() const { return path_ / "model"; }
  fs::path root() const { return path_; }

 private:
  fs::path path_;
  static inline int counter_ = 0;
};

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// x + W -> Relu: the smallest model the runtime can run.
onnx::ModelProto AddReluModel(bool raw) {
  onnx::ModelProto m = NewModel();
  auto* g = m.mutable_graph();
  AddInfo(g->mutable_input(), "x", onnx::TensorProto_DataType_FLOAT, {"N", "3"});
  AddFloatInit(g, "W", {3}, {1.f, -2.f, 0.5f}, raw);
  AddNode(g, "Add", {"x", "W"}, {"s"}, "add");
  AddNode(g, "Relu", {"s"}, {"y"}, "relu");
  AddInfo(g->mutable_output(), "y", onnx::TensorProto_DataType_FLOAT, {"N", "3"});
  return m;
}

TEST(OnnxImport, ModelMetadataIsKeptAndSharedByCopies) {
  onnx::ModelProto m = AddReluModel(true);
  m.set_producer_name("paddle2onnx");
  m.set_model_version(7);
  m.set_doc_string("a model");
  for (const auto& [key, value] :
       {std::pair<std::string, std::string>{"character", std::string(100000, 'x')}, {"shape", "[3, 48, 320]"}}) {
    auto* p = m.add_metadata_props();
    p->set_key(key);
    p->set_value(value);
  }
  const Graph g = Parse(m);
  ASSERT_TRUE(g.metadata);
  EXPECT_EQ(g.metadata->producer_name, "paddle2onnx");
  EXPECT_EQ(g.metadata->version, 7);
  EXPECT_EQ(g.metadata->description, "a model");
  ASSERT_EQ(g.metadata->properties.size(), 2u);
  EXPECT_EQ(g.metadata->properties[0].second.size(), 100000u);
  EXPECT_EQ(g.metadata->properties[1], (std::pair<std::string, std::string>{"shape", "[3, 48, 320]"}));
  const Graph copy = g;  // the runtime copies graphs per shape and segment: the metadata is not copied with them
  EXPECT_EQ(copy.metadata.get(), g.metadata.get());
  EXPECT_EQ(copy.Fingerprint(), Parse(AddReluModel(true)).Fingerprint());  // not part of the fingerprint
}

TEST(OnnxImport, InitializerEncodingsAgree) {
  onnx::ModelProto m = AddReluModel(true);
  auto* g = m.mutable_graph();
  AddFloatInit(g, "w_float_data", {2, 2}, {1.5f, -2.f, 3.25f, 0.f}, false);
  AddFloatInit(g, "w_raw", {2, 2}, {1.5f, -2.f, 3.25f, 0.f}, true);
  auto* i64 = g->add_initializer();
  i64->set_name("i_int64_data");
  i64->set_data_type(onnx::TensorProto_DataType_INT64);
  i64->add_dims(3);
  for (int64_t v : {int64_t{-1}, int64_t{1} << 40, int64_t{7}}) i64->add_int64_data(v);
  auto* i64raw = g->add_initializer();
  *i64raw = *i64;
  i64raw->set_name("i_raw");
  i64raw->clear_int64_data();
  std::vector<int64_t> iv = {-1, int64_t{1} << 40, 7};
  i64raw->set_raw_data(std::string(reinterpret_cast<const char*>(iv.data()), 24));
  // int32_data carries the bits of float16, int8, uint8 and bool.
  auto* h = g->add_initializer();
  h->set_name("half");
  h->set_data_type(onnx::TensorProto_DataType_FLOAT16);
  h->add_dims(2);
  h->add_int32_data(0x3C00);  // 1.0
  h->add_int32_data(0xC000);  // -2.0
  auto* i8 = g->add_initializer();
  i8->set_name("i8");
  i8->set_data_type(onnx::TensorProto_DataType_INT8);
  i8->add_dims(2);
  i8->add_int32_data(-5);
  i8->add_int32_data(100);
  auto* b = g->add_initializer();
  b->set_name("flags");
  b->set_data_type(onnx::TensorProto_DataType_BOOL);
  b->add_dims(3);
  for (int v : {1, 0, 1}) b->add_int32_data(v);

  Graph graph = Parse(m);
  const Tensor& wf = ConstantNamed(graph, "w_float_data");
  const Tensor& wr = ConstantNamed(graph, "w_raw");
  ASSERT_EQ(wf.dtype(), DType::kF32);
  ASSERT_EQ(wf.shape(), (Shape{2, 2}));
  ASSERT_EQ(wr.shape(), (Shape{2, 2}));
  std::vector<float> expected = {1.5f, -2.f, 3.25f, 0.f};
  EXPECT_EQ(wf.ToFloatVector(), expected);
  EXPECT_EQ(wr.ToFloatVector(), expected);
  EXPECT_EQ(ConstantNamed(graph, "i_int64_data").ToInt64Vector(), iv);
  EXPECT_EQ(ConstantNamed(graph, "i_raw").ToInt64Vector(), iv);
  EXPECT_EQ(ConstantNamed(graph, "half").dtype(), DType::kF16);
  EXPECT_EQ(ConstantNamed(graph, "half").ToFloatVector(), (std::vector<float>{1.f, -2.f}));
  EXPECT_EQ(ConstantNamed(graph, "i8").ToInt64Vector(), (std::vector<int64_t>{-5, 100}));
  EXPECT_EQ(ConstantNamed(graph, "flags").ToInt64Vector(), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(ConstantNamed(graph, "W").ToFloatVector(), (std::vector<float>{1.f, -2.f, 0.5f}));
}

TEST(OnnxImport, ImportedModelRuns) {
  // Oracle: relu(x + W) by hand.
  for (bool raw : {true, false}) {
    Model model(Parse(AddReluModel(raw)));
    auto outputs = model.Run({{"x", Tensor::FromVector<float>({2, 3}, {0, 0, 0, 1, 1, -1})}});
    ASSERT_EQ(outputs.size(), 1u);
    EXPECT_EQ(outputs[0].first, "y");
    EXPECT_EQ(outputs[0].second.ToFloatVector(), (std::vector<float>{1, 0, 0.5f, 2, 0, 0}));
  }
}

TEST(OnnxImport, ExternalDataFile) {
  TempDir dir;
  std::vector<float> values = {0.25f, -4.f, 8.5f};
  std::string blob(16, '\x7f');  // junk before the tensor, so the offset matters
  blob += std::string(reinterpret_cast<const char*>(values.data()), 12);
  WriteFile(dir.model_dir() / "weights.bin", blob);

  onnx::ModelProto m = AddReluModel(true);
  auto* w = m.mutable_graph()->mutable_initializer(0);
  w->clear_raw_data();
  w->set_data_location(onnx::TensorProto_DataLocation_EXTERNAL);
  auto kv = [&](const std::string& k, const std::string& v) {
    auto* e = w->add_external_data();
    e->set_key(k);
    e->set_value(v);
  };
  kv("location", "weights.bin");
  kv("offset", "16");
  kv("length", "12");
  WriteFile(dir.model_dir() / "model.onnx", m.SerializeAsString());
  Graph graph = LoadOnnxModel((dir.model_dir() / "model.onnx").string());
  EXPECT_EQ(ConstantNamed(graph, "W").ToFloatVector(), values);

  // A length past the end of the file.
  w->mutable_external_data(2)->set_value("13");
  Error e = ParseFails(m, dir.model_dir().string());
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  // An offset past the end of the file.
  w->mutable_external_data(2)->set_value("12");
  w->mutable_external_data(1)->set_value("100");
  e = ParseFails(m, dir.model_dir().string());
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  // Bytes that do not match the shape.
  w->mutable_external_data(1)->set_value("0");
  w->mutable_external_data(2)->set_value("8");
  e = ParseFails(m, dir.model_dir().string());
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  // A missing file.
  w->mutable_external_data(0)->set_value("nothere.bin");
  e = ParseFails(m, dir.model_dir().string());
  EXPECT_EQ(e.code(), ErrorCode::kNotFound) << e.what();
}

TEST(OnnxImport, ExternalDataMayNotLeaveTheModelDirectory) {
  TempDir dir;
  std::vector<float> values = {1, 2, 3};
  WriteFile(dir.root() / "secret.bin", std::string(reinterpret_cast<const char*>(values.data()), 12));
  for (std::string location :
       {std::string("../secret.bin"), std::string("sub/../../secret.bin"), (dir.root() / "secret.bin").string()}) {
    onnx::ModelProto m = AddReluModel(true);
    auto* w = m.mutable_graph()->mutable_initializer(0);
    w->clear_raw_data();
    w->set_data_location(onnx::TensorProto_DataLocation_EXTERNAL);
    auto* e = w->add_external_data();
    e->set_key("location");
    e->set_value(location);
    Error err = ParseFails(m, dir.model_dir().string());
    EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument) << location << ": " << err.what();
  }
}

TEST(OnnxImport, SymbolicDimsAndValueInfos) {
  onnx::ModelProto m = AddReluModel(true);
  auto* in = m.mutable_graph()->mutable_input(0);
  auto* shape = in->mutable_type()->mutable_tensor_type()->mutable_shape();
  shape->add_dim();  // no value, no param
  m.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  Graph g = Parse(m, "", /*validate=*/false);
  ASSERT_EQ(g.input_infos.size(), 1u);
  const ValueInfo& x = g.input_infos[0];
  EXPECT_EQ(x.name, "x");
  EXPECT_EQ(x.dtype, DType::kF32);
  ASSERT_TRUE(x.has_shape);
  ASSERT_EQ(x.dims.size(), 3u);
  EXPECT_EQ(x.dims[0].value, -1);
  EXPECT_EQ(x.dims[0].symbol, "N");
  EXPECT_EQ(x.dims[1].value, 3);
  EXPECT_EQ(x.dims[2].value, -1);
  EXPECT_EQ(x.dims[2].symbol, "?");
  EXPECT_EQ(x.ShapeString(), "[N, 3, ?]");
  ASSERT_EQ(g.output_infos.size(), 1u);
  EXPECT_EQ(g.output_infos[0].name, "y");
  EXPECT_FALSE(g.output_infos[0].has_shape);
  EXPECT_EQ(g.opset, 17);
  EXPECT_EQ(g.name, "test_graph");
}

TEST(OnnxImport, InitializerListedAsInputIsAConstant) {
  onnx::ModelProto m = AddReluModel(true);
  AddInfo(m.mutable_graph()->mutable_input(), "W", onnx::TensorProto_DataType_FLOAT, {"3"});
  Graph g = Parse(m);
  ASSERT_EQ(g.inputs.size(), 1u);
  EXPECT_EQ(g.value_names[g.inputs[0]], "x");
  EXPECT_EQ(ConstantNamed(g, "W").numel(), 3);
}

TEST(OnnxImport, UnsortedNodesAreSortedAndNamed) {
  onnx::ModelProto m = NewModel();
  auto* g = m.mutable_graph();
  AddInfo(g->mutable_input(), "x", onnx::TensorProto_DataType_FLOAT, {"2"});
  AddNode(g, "Relu", {"b"}, {"c"});        // file index 0, needs b
  AddNode(g, "Neg", {"a"}, {"b"}, "neg");  // needs a
  AddNode(g, "Relu", {"x"}, {"a"});        // file index 2
  AddInfo(g->mutable_output(), "c", onnx::TensorProto_DataType_FLOAT, {"2"});
  Graph graph = Parse(m);
  ASSERT_EQ(graph.nodes.size(), 3u);
  EXPECT_EQ(graph.nodes[0].name, "Relu_2");
  EXPECT_EQ(graph.nodes[1].name, "neg");
  EXPECT_EQ(graph.nodes[2].name, "Relu_0");
  EXPECT_EQ(graph.value_names[graph.nodes[2].outputs[0]], "c");
}

TEST(OnnxImport, CycleIsAnError) {
  onnx::ModelProto m = NewModel();
  auto* g = m.mutable_graph();
  AddInfo(g->mutable_input(), "x", onnx::TensorProto_DataType_FLOAT, {"2"});
  AddNode(g, "Add", {"x", "b"}, {"a"}, "first");
  AddNode(g, "Relu", {"a"}, {"b"}, "second");
  AddInfo(g->mutable_output(), "b", onnx::TensorProto_DataType_FLOAT, {"2"});
  Error e = ParseFails(m);
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("cycle"), std::string::npos) << e.what();
}

TEST(OnnxImport, TruncatedOrGarbageBytesAreInvalidArgument) {
  onnx::ModelProto m = AddReluModel(true);
  AddFloatInit(m.mutable_graph(), "big", {64}, std::vector<float>(64, 1.f), true);
  std::string bytes = m.SerializeAsString();
  for (size_t cut : {bytes.size() / 2, bytes.size() - 1, size_t{3}}) {
    try {
      ParseOnnxModel(bytes.data(), cut, "");
      ADD_FAILURE() << "cut at " << cut << " parsed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    }
  }
  std::string garbage = "\xff\xff\xff\xff\xff\xff\xff\xff this is not protobuf";
  try {
    ParseOnnxModel(garbage.data(), garbage.size(), "");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("is not a valid ONNX model (protobuf parse failed)"), std::string::npos)
        << e.what();
  }
  // Empty bytes are a valid empty ModelProto, which has no graph.
  EXPECT_THROW(ParseOnnxModel("", 0, ""), Error);
}

TEST(OnnxImport, UnknownOpsAreListedTogether) {
  onnx::ModelProto m = NewModel();
  auto* g = m.mutable_graph();
  AddInfo(g->mutable_input(), "x", onnx::TensorProto_DataType_FLOAT, {"2"});
  AddNode(g, "FooOp", {"x"}, {"a"}, "foo_node");
  AddNode(g, "Relu", {"a"}, {"b"}, "relu");
  AddNode(g, "BarOp", {"b"}, {"c"}, "bar_node");
  auto* custom = AddNode(g, "Baz", {"c"}, {"d"}, "baz_node");
  custom->set_domain("com.example");
  AddInfo(g->mutable_output(), "d", onnx::TensorProto_DataType_FLOAT, {"2"});
  Error e = ParseFails(m);
  EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  std::string msg = e.what();
  for (const char* part : {"FooOp", "foo_node", "BarOp", "bar_node", "com.example.Baz", "baz_node"})
    EXPECT_NE(msg.find(part), std::string::npos) << part << " missing from: " << msg;
  EXPECT_EQ(msg.find("relu"), std::string::npos) << msg;
  // Without validation the graph comes back whole.
  Graph graph = Parse(m, "", /*validate=*/false);
  EXPECT_EQ(graph.nodes.size(), 4u);
  EXPECT_EQ(graph.nodes[3].domain, "com.example");
}

TEST(OnnxImport, OpsetRange) {
  for (int opset : {6, 29}) {
    onnx::ModelProto m = AddReluModel(true);
    m.mutable_opset_import(0)->set_version(opset);
    Error e = ParseFails(m);
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("opset " + std::to_string(opset)), std::string::npos) << e.what();
  }
  for (int opset : {7, 13, 21, 28}) {
    onnx::ModelProto m = AddReluModel(true);
    m.mutable_opset_import(0)->set_domain("ai.onnx");
    m.mutable_opset_import(0)->set_version(opset);
    EXPECT_EQ(Parse(m).opset, opset);
  }
  onnx::ModelProto none = AddReluModel(true);
  none.clear_opset_import();
  EXPECT_EQ(ParseFails(none).code(), ErrorCode::kInvalidArgument);
}

TEST(OnnxImport, AttributesOfEveryKind) {
  onnx::ModelProto m = NewModel();
  auto* g = m.mutable_graph();
  AddInfo(g->mutable_input(), "x", onnx::TensorProto_DataType_FLOAT, {"2"});
  auto* n = AddNode(g, "Custom", {"x", "", "x"}, {"y"}, "custom");
  auto attr = [&](const std::string& name, onnx::AttributeProto_AttributeType type) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(type);
    return a;
  };
  attr("f", onnx::AttributeProto_AttributeType_FLOAT)->set_f(0.25f);
  attr("i", onnx::AttributeProto_AttributeType_INT)->set_i(-7);
  attr("s", onnx::AttributeProto_AttributeType_STRING)->set_s("same_upper");
  auto* t = attr("t", onnx::AttributeProto_AttributeType_TENSOR)->mutable_t();
  t->set_data_type(onnx::TensorProto_DataType_INT32);
  t->add_dims(2);
  t->add_int32_data(4);
  t->add_int32_data(-4);
  auto* fs_attr = attr("fs", onnx::AttributeProto_AttributeType_FLOATS);
  fs_attr->add_floats(1.5f);
  fs_attr->add_floats(2.5f);
  auto* is_attr = attr("is", onnx::AttributeProto_AttributeType_INTS);
  for (int64_t v : {1, 2, 3}) is_attr->add_ints(v);
  auto* ss_attr = attr("ss", onnx::AttributeProto_AttributeType_STRINGS);
  ss_attr->add_strings("a");
  ss_attr->add_strings("bc");
  auto* untyped = n->add_attribute();  // old exporters leave `type` unset
  untyped->set_name("legacy");
  untyped->set_i(5);
  AddInfo(g->mutable_output(), "y", onnx::TensorProto_DataType_FLOAT, {"2"});
  Graph graph = Parse(m, "", /*validate=*/false);
  ASSERT_EQ(graph.nodes.size(), 1u);
  const Node& node = graph.nodes[0];
  EXPECT_EQ(node.inputs.size(), 3u);
  EXPECT_GE(node.inputs[0], 0);
  EXPECT_EQ(node.inputs[1], -1);
  EXPECT_EQ(node.GetFloat("f", 0), 0.25f);
  EXPECT_EQ(node.GetInt("i", 0), -7);
  EXPECT_EQ(node.GetString("s", ""), "same_upper");
  EXPECT_EQ(node.attrs.at("t").t.ToInt64Vector(), (std::vector<int64_t>{4, -4}));
  EXPECT_EQ(node.GetFloats("fs"), (std::vector<float>{1.5f, 2.5f}));
  EXPECT_EQ(node.GetInts("is"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(node.attrs.at("ss").strings, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(node.GetInt("legacy", 0), 5);
}

TEST(OnnxImport, SubgraphAttributeIsUnsupportedNamingTheNode) {
  onnx::ModelProto m = AddReluModel(true);
  auto* relu = m.mutable_graph()->mutable_node(1);
  auto* a = relu->add_attribute();
  a->set_name("body");
  a->set_type(onnx::AttributeProto_AttributeType_GRAPH);
  a->mutable_g()->set_name("sub");
  Error e = ParseFails(m);
  EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  EXPECT_NE(std::string(e.what()).find("'relu'"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("subgraph"), std::string::npos) << e.what();
}

TEST(OnnxImport, ConstantNodesBecomeConstants) {
  onnx::ModelProto m = NewModel();
  auto* g = m.mutable_graph();
  AddInfo(g->mutable_input(), "x", onnx::TensorProto_DataType_FLOAT, {"3"});
  auto* c = AddNode(g, "Constant", {}, {"k"}, "const");
  auto* a = c->add_attribute();
  a->set_name("value_floats");
  a->set_type(onnx::AttributeProto_AttributeType_FLOATS);
  for (float v : {1.f, 2.f, 3.f}) a->add_floats(v);
  auto* ci = AddNode(g, "Constant", {}, {"axis"});
  auto* ai = ci->add_attribute();
  ai->set_name("value_int");
  ai->set_type(onnx::AttributeProto_AttributeType_INT);
  ai->set_i(4);
  AddNode(g, "Add", {"x", "k"}, {"y"});
  AddInfo(g->mutable_output(), "y", onnx::TensorProto_DataType_FLOAT, {"3"});
  Graph graph = Parse(m);
  ASSERT_EQ(graph.nodes.size(), 1u);
  EXPECT_EQ(ConstantNamed(graph, "k").ToFloatVector(), (std::vector<float>{1, 2, 3}));
  const Tensor& axis = ConstantNamed(graph, "axis");
  EXPECT_EQ(axis.dtype(), DType::kI64);
  EXPECT_EQ(axis.rank(), 0);
  EXPECT_EQ(axis.GetAsInt(0), 4);
}

TEST(OnnxImport, BadTensorsAreErrorsNotCrashes) {
  auto fails_with = [](const std::function<void(onnx::TensorProto*)>& edit) {
    onnx::ModelProto m = AddReluModel(true);
    edit(m.mutable_graph()->mutable_initializer(0));
    return ParseFails(m).code();
  };
  // raw_data shorter / longer than the shape needs.
  EXPECT_EQ(fails_with([](onnx::TensorProto* t) { t->set_raw_data("abc"); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(fails_with([](onnx::TensorProto* t) { t->set_raw_data(std::string(16, 'x')); }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(fails_with([](onnx::TensorProto* t) { t->set_dims(0, -3); }), ErrorCode::kInvalidArgument);
  // A dims product that overflows must fail before any allocation.
  EXPECT_EQ(fails_with([](onnx::TensorProto* t) {
              t->set_dims(0, int64_t{1} << 40);
              t->add_dims(int64_t{1} << 40);
            }),
            ErrorCode::kInvalidArgument);
  // Huge but representable: raw_data is 12 bytes, not 2^40 * 4.
  EXPECT_EQ(fails_with([](onnx::TensorProto* t) { t->set_dims(0, int64_t{1} << 40); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(fails_with([](onnx::TensorProto* t) {
              t->clear_raw_data();
              t->add_float_data(1.f);
            }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(fails_with([](onnx::TensorProto* t) { t->clear_raw_data(); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(fails_with([](onnx::TensorProto* t) { t->set_data_type(onnx::TensorProto_DataType_UINT16); }),
            ErrorCode::kUnsupported);
  // DOUBLE is read as float64 (then kept as float32): 12 bytes are not 3 of them.
  EXPECT_EQ(fails_with([](onnx::TensorProto* t) { t->set_data_type(onnx::TensorProto_DataType_DOUBLE); }),
            ErrorCode::kInvalidArgument);
  // External data with no model directory.
  EXPECT_EQ(fails_with([](onnx::TensorProto* t) {
              t->set_data_location(onnx::TensorProto_DataLocation_EXTERNAL);
              auto* e = t->add_external_data();
              e->set_key("location");
              e->set_value("w.bin");
            }),
            ErrorCode::kInvalidArgument);
}

TEST(OnnxImport, StructuralErrors) {
  onnx::ModelProto missing_output = AddReluModel(true);
  missing_output.mutable_graph()->mutable_output(0)->set_name("nope");
  EXPECT_EQ(ParseFails(missing_output).code(), ErrorCode::kInvalidArgument);
  onnx::ModelProto dangling = AddReluModel(true);
  dangling.mutable_graph()->mutable_node(0)->set_input(1, "undefined_value");
  EXPECT_EQ(ParseFails(dangling).code(), ErrorCode::kInvalidArgument);
  onnx::ModelProto two_producers = AddReluModel(true);
  two_producers.mutable_graph()->mutable_node(1)->set_output(0, "s");
  EXPECT_EQ(ParseFails(two_producers).code(), ErrorCode::kInvalidArgument);
  onnx::ModelProto no_graph = NewModel();
  no_graph.clear_graph();
  EXPECT_EQ(ParseFails(no_graph).code(), ErrorCode::kInvalidArgument);
}

TEST(OnnxImport, TensorFromOnnxBytesAndDTypes) {
  onnx::TensorProto t;
  t.set_name("t");
  t.set_data_type(onnx::TensorProto_DataType_INT32);
  t.add_dims(1);
  t.add_dims(3);
  for (int v : {5, -6, 7}) t.add_int32_data(v);
  std::string bytes = t.SerializeAsString();
  Tensor out = TensorFromOnnxBytes(bytes.data(), bytes.size());
  EXPECT_EQ(out.dtype(), DType::kI32);
  EXPECT_EQ(out.shape(), (Shape{1, 3}));
  EXPECT_EQ(out.ToInt64Vector(), (std::vector<int64_t>{5, -6, 7}));
  EXPECT_THROW(TensorFromOnnxBytes("\xff\xff\xff", 3), Error);

  EXPECT_EQ(DTypeFromOnnx(onnx::TensorProto_DataType_FLOAT), DType::kF32);
  EXPECT_EQ(DTypeFromOnnx(onnx::TensorProto_DataType_BFLOAT16), DType::kBF16);
  EXPECT_EQ(DTypeFromOnnx(onnx::TensorProto_DataType_UINT8), DType::kU8);
  try {
    DTypeFromOnnx(onnx::TensorProto_DataType_UINT16);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("UINT16"), std::string::npos);
  }
  EXPECT_THROW(DTypeFromOnnx(99), Error);

  // float64 is computed as float32: DOUBLE tensors become float32, rounded to nearest, from double_data or raw_data.
  EXPECT_EQ(DTypeFromOnnx(onnx::TensorProto_DataType_DOUBLE), DType::kF32);
  const std::vector<double> values = {0.1, -2.5, 1e300, 3.0000001};
  onnx::TensorProto d;
  d.set_data_type(onnx::TensorProto_DataType_DOUBLE);
  d.add_dims(4);
  for (double v : values) d.add_double_data(v);
  onnx::TensorProto raw = d;
  raw.clear_double_data();
  raw.set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double)));
  for (const onnx::TensorProto* proto : {&d, &raw}) {
    bytes = proto->SerializeAsString();
    Tensor f = TensorFromOnnxBytes(bytes.data(), bytes.size());
    ASSERT_EQ(f.dtype(), DType::kF32);
    ASSERT_EQ(f.shape(), (Shape{4}));
    const std::vector<float> want = {0.1f, -2.5f, std::numeric_limits<float>::infinity(), 3.0000001f};
    for (int i = 0; i < 4; ++i) EXPECT_EQ(f.data<float>()[i], want[i]) << i;
  }
  d.add_double_data(1.0);  // five values for four elements
  bytes = d.SerializeAsString();
  EXPECT_THROW(TensorFromOnnxBytes(bytes.data(), bytes.size()), Error);
}

TEST(OnnxImport, MinusOneDimIsDynamicOtherNegativeDimsAreRefused) {
  // ONNX Runtime reads dim_value -1 as a dynamic dim; osprey binds it at run time like an empty dim_param.
  onnx::ModelProto m = AddReluModel(true);
  auto* shape = m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
  shape->mutable_dim(0)->set_dim_value(-1);
  m.mutable_graph()
      ->mutable_output(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(0)
      ->set_dim_value(-1);
  Graph g = Parse(m);
  EXPECT_EQ(g.input_infos[0].dims[0].value, -1);
  EXPECT_EQ(g.input_infos[0].dims[0].symbol, "?");
  EXPECT_EQ(g.output_infos[0].dims[0].symbol, "?");
  Model model(std::move(g));
  for (int64_t batch : {1, 3}) {
    auto outputs = model.Run({{"x", Tensor::FromVector<float>({batch, 3}, std::vector<float>(batch * 3, 1.f))}});
    EXPECT_EQ(outputs[0].second.shape(), (Shape{batch, 3}));
  }
  shape->mutable_dim(0)->set_dim_value(-2);
  Error e = ParseFails(m);
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("graph input 'x' has dim -2"), std::string::npos) << e.what();
}

// If(N == 1) where N = Shape(x)[0], as exporters write batch-dependent code: then y = x * two (a branch
// initializer), else y = x (an outer value as the branch output).
onnx::ModelProto IfOnBatchModel() {
  onnx::ModelProto m = NewModel(13);
  auto* g = m.mutable_graph();
  AddInfo(g->mutable_input(), "x", onnx::TensorProto_DataType_FLOAT, {"N", "2"});
  AddNode(g, "Shape", {"x"}, {"shape"}, "shape");
  auto* zero = g->add_initializer();
  zero->set_name("zero");
  zero->set_data_type(onnx::TensorProto_DataType_INT64);
  zero->add_int64_data(0);
  auto* one = g->add_initializer();
  one->set_name("one");
  one->set_data_type(onnx::TensorProto_DataType_INT64);
  one->add_int64_data(1);
  AddNode(g, "Gather", {"shape", "zero"}, {"n"}, "gather");
  AddNode(g, "Equal", {"n", "one"}, {"cond"}, "equal");
  auto* node = AddNode(g, "If", {"cond"}, {"y"}, "if_batch_1");
  auto* then_attr = node->add_attribute();
  then_attr->set_name("then_branch");
  then_attr->set_type(onnx::AttributeProto_AttributeType_GRAPH);
  auto* then_g = then_attr->mutable_g();
  AddFloatInit(then_g, "two", {1}, {2.f}, true);
  AddNode(then_g, "Mul", {"x", "two"}, {"then_y"}, "double");
  AddInfo(then_g->mutable_output(), "then_y", onnx::TensorProto_DataType_FLOAT, {});
  auto* else_attr = node->add_attribute();
  else_attr->set_name("else_branch");
  else_attr->set_type(onnx::AttributeProto_AttributeType_GRAPH);
  AddInfo(else_attr->mutable_g()->mutable_output(), "x", onnx::TensorProto_DataType_FLOAT, {});
  AddInfo(g->mutable_output(), "y", onnx::TensorProto_DataType_FLOAT, {});
  return m;
}

TEST(OnnxImport, IfWithAShapeConditionFoldsWhenCompiled) {
  // Oracle: the branch ONNX's If semantics pick, by hand.
  Graph g = Parse(IfOnBatchModel());
  const Node& node = g.nodes.back();
  ASSERT_EQ(node.op_type, "If");
  ASSERT_EQ(node.inputs.size(), 2u);  // cond, then the outer value 'x' the branches read
  EXPECT_EQ(g.value_names[node.inputs[1]], "x");
  Model model(std::move(g));
  auto one = model.Run({{"x", Tensor::FromVector<float>({1, 2}, {1, -3})}});
  EXPECT_EQ(one[0].second.ToFloatVector(), (std::vector<float>{2, -6}));
  auto two = model.Run({{"x", Tensor::FromVector<float>({2, 2}, {1, -3, 4, 5})}});
  EXPECT_EQ(two[0].second.ToFloatVector(), (std::vector<float>{1, -3, 4, 5}));
}

TEST(OnnxImport, IfOnInputDataRunsTheBranchItsConditionPicks) {
  // Oracle: ONNX's If semantics by hand: sum(x) > 0 ? x * 2 : x. Both branches are compiled; one plan serves both.
  onnx::ModelProto m = IfOnBatchModel();
  auto* g = m.mutable_graph();
  // cond now compares a value of x, not its shape.
  AddNode(g, "ReduceSum", {"x"}, {"sum"}, "sum")->add_attribute()->set_name("keepdims");
  g->mutable_node(g->node_size() - 1)->mutable_attribute(0)->set_type(onnx::AttributeProto_AttributeType_INT);
  g->mutable_node(g->node_size() - 1)->mutable_attribute(0)->set_i(0);
  AddFloatInit(g, "zero_f", {}, {0.f}, true);
  AddNode(g, "Greater", {"sum", "zero_f"}, {"data_cond"}, "greater");
  g->mutable_node(3)->set_input(0, "data_cond");
  Model model(Parse(m));
  auto positive = model.Run({{"x", Tensor::FromVector<float>({1, 2}, {1, 2})}});
  EXPECT_EQ(positive[0].second.ToFloatVector(), (std::vector<float>{2, 4}));
  auto negative = model.Run({{"x", Tensor::FromVector<float>({1, 2}, {1, -3})}});
  EXPECT_EQ(negative[0].second.ToFloatVector(), (std::vector<float>{1, -3}));
  auto again = model.Run({{"x", Tensor::FromVector<float>({1, 2}, {5, -3})}});
  EXPECT_EQ(again[0].second.ToFloatVector(), (std::vector<float>{10, -6}));
}

TEST(OnnxImport, IfBranchesNestedTooDeepAreRefused) {
  onnx::ModelProto m = IfOnBatchModel();
  // Wrap the then branch in If nodes, each taking the previous graph as its then and else branch, 9 deep.
  onnx::GraphProto inner = m.graph().node(3).attribute(0).g();
  for (int level = 0; level < 9; ++level) {
    onnx::GraphProto outer;
    auto* n = AddNode(&outer, "If", {"cond"}, {"nested_y_" + std::to_string(level)}, "nest_" + std::to_string(level));
    for (const char* key : {"then_branch", "else_branch"}) {
      auto* a = n->add_attribute();
      a->set_name(key);
      a->set_type(onnx::AttributeProto_AttributeType_GRAPH);
      *a->mutable_g() = inner;
    }
    AddInfo(outer.mutable_output(), "nested_y_" + std::to_string(level), onnx::TensorProto_DataType_FLOAT, {});
    inner = outer;
  }
  *m.mutable_graph()->mutable_node(3)->mutable_attribute(0)->mutable_g() = inner;
  Error e = ParseFails(m);
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("nested more than 8 deep"), std::string::npos) << e.what();
}

TEST(OnnxImport, IfBranchWithInputsOrWrongOutputCountIsAnError) {
  onnx::ModelProto m = IfOnBatchModel();
  AddInfo(m.mutable_graph()->mutable_node(3)->mutable_attribute(0)->mutable_g()->mutable_input(), "b",
          onnx::TensorProto_DataType_FLOAT, {});
  EXPECT_NE(std::string(ParseFails(m).what()).find("If branches take none"), std::string::npos);
  m = IfOnBatchModel();
  AddInfo(m.mutable_graph()->mutable_node(3)->mutable_attribute(1)->mutable_g()->mutable_output(), "x",
          onnx::TensorProto_DataType_FLOAT, {});
  Error e = ParseFails(m);
  EXPECT_NE(std::string(e.what()).find("else_branch has 2 outputs, expected 1"), std::string::npos) << e.what();
}

}  // namespace
}  // namespace osprey
