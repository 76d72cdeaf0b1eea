// The importer's wire-level split (onnx_wire.h): protobuf parses the model without its initializers' raw_data, and
// the importer copies each initializer from the model bytes. Oracles: protobuf's own serialization of the same model
// with the raw_data emptied, and the values written into the model.
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

#include "onnx/onnx_wire.h"
#include "osprey/onnx.h"
#include "osprey/runtime.h"

namespace osprey {
namespace {

using onnx_wire::RawSpan;
using onnx_wire::StripInitializerData;

std::string Raw(const std::vector<float>& v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4); }

// y = Reshape(x + a + b + c, shape): initializers as raw float (a), float_data (b) and raw int64 (shape), and a
// Constant node whose tensor attribute (c) keeps its raw_data inside the parsed message.
onnx::ModelProto TestModel(int64_t n) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("wire-test");
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("g");
  auto* x = g->add_input();
  x->set_name("x");
  x->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto_DataType_FLOAT);
  x->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(n);
  std::vector<float> a(n), b(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = 0.5f * static_cast<float>(i);
    b[i] = -1.f - static_cast<float>(i % 7);
  }
  auto* ta = g->add_initializer();  // raw_data
  ta->set_name("a");
  ta->set_data_type(onnx::TensorProto_DataType_FLOAT);
  ta->add_dims(n);
  ta->set_raw_data(Raw(a));
  auto* tb = g->add_initializer();  // float_data
  tb->set_name("b");
  tb->set_data_type(onnx::TensorProto_DataType_FLOAT);
  tb->add_dims(n);
  for (float v : b) tb->add_float_data(v);
  auto* ts = g->add_initializer();  // raw int64
  ts->set_name("shape");
  ts->set_data_type(onnx::TensorProto_DataType_INT64);
  ts->add_dims(1);
  const int64_t shape_value = n;
  ts->set_raw_data(std::string(reinterpret_cast<const char*>(&shape_value), 8));
  auto* c = g->add_node();
  c->set_op_type("Constant");
  c->add_output("c");
  auto* attr = c->add_attribute();
  attr->set_name("value");
  attr->set_type(onnx::AttributeProto_AttributeType_TENSOR);
  auto* tc = attr->mutable_t();
  tc->set_data_type(onnx::TensorProto_DataType_FLOAT);
  tc->add_dims(1);
  tc->set_raw_data(Raw({2.f}));
  auto add = [&](const std::string& l, const std::string& r, const std::string& out) {
    auto* node = g->add_node();
    node->set_op_type("Add");
    node->add_input(l);
    node->add_input(r);
    node->add_output(out);
  };
  add("x", "a", "s1");
  add("s1", "b", "s2");
  add("s2", "c", "s3");
  auto* reshape = g->add_node();
  reshape->set_op_type("Reshape");
  reshape->add_input("s3");
  reshape->add_input("shape");
  reshape->add_output("y");
  auto* y = g->add_output();
  y->set_name("y");
  y->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto_DataType_FLOAT);
  return m;
}

std::vector<float> Expected(int64_t n, const std::vector<float>& x) {
  std::vector<float> y(n);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] + 0.5f * static_cast<float>(i) + (-1.f - static_cast<float>(i % 7)) + 2.f;
  return y;
}

TEST(OnnxWire, StrippedModelIsProtobufsOwnSerializationWithoutRawData) {
  onnx::ModelProto m = TestModel(1000);
  const std::string bytes = m.SerializeAsString();
  std::string stripped;
  std::vector<RawSpan> spans;
  ASSERT_TRUE(StripInitializerData(bytes.data(), bytes.size(), &stripped, &spans));
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_TRUE(spans[0].present);
  EXPECT_FALSE(spans[1].present);  // float_data
  EXPECT_TRUE(spans[2].present);
  EXPECT_EQ(std::string(spans[0].data, spans[0].size), m.graph().initializer(0).raw_data());
  EXPECT_EQ(std::string(spans[2].data, spans[2].size), m.graph().initializer(2).raw_data());
  EXPECT_GE(spans[0].data, bytes.data());
  EXPECT_LE(spans[0].data + spans[0].size, bytes.data() + bytes.size());
  // Oracle: protobuf serializing the same model with the initializers' raw_data emptied (the Constant node's tensor
  // attribute keeps its bytes: only initializers are split).
  onnx::ModelProto emptied = m;
  emptied.mutable_graph()->mutable_initializer(0)->set_raw_data("");
  emptied.mutable_graph()->mutable_initializer(2)->set_raw_data("");
  EXPECT_EQ(stripped, emptied.SerializeAsString());
  EXPECT_LE(stripped.size() + spans[0].size + spans[2].size, bytes.size());
}

TEST(OnnxWire, ImportedModelComputesTheWrittenValues) {
  const int64_t n = 100000;  // 400 KB: a weight the Allocator maps
  const std::string bytes = TestModel(n).SerializeAsString();
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 13) - 6.f;
  const std::vector<float> want = Expected(n, x);
  auto check = [&](Graph graph) {
    Model model(std::move(graph));
    auto out = model.Run({{"x", Tensor::FromVector<float>({n}, x)}});
    ASSERT_EQ(out.size(), 1u);
    const float* y = out[0].second.data<float>();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], want[i]) << i;
  };
  check(ParseOnnxModel(bytes.data(), bytes.size(), ""));
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("osprey_wire_" + std::to_string(getpid()) + ".onnx");
  std::ofstream(path, std::ios::binary) << bytes;
  check(LoadOnnxModel(path.string()));
  std::filesystem::remove(path);
}

TEST(OnnxWire, LastRawDataWinsAsInProtobuf) {
  // A TensorProto carrying raw_data twice: protobuf keeps the last; so must the split.
  onnx::ModelProto m = TestModel(4);
  std::string first = Raw({100.f, 100.f, 100.f, 100.f});
  onnx::TensorProto extra;
  extra.set_raw_data(Raw({0.f, 0.5f, 1.f, 1.5f}));  // the values TestModel wrote, appended after a decoy
  m.mutable_graph()->mutable_initializer(0)->set_raw_data(first);
  std::string bytes;
  {
    // Re-serialize the graph by hand so initializer 0's bytes end with a second raw_data field.
    onnx::GraphProto g = m.graph();
    onnx::TensorProto t0 = g.initializer(0);
    g.mutable_initializer()->DeleteSubrange(0, 1);
    std::string t0_bytes = t0.SerializeAsString() + extra.SerializeAsString();
    std::string graph_bytes;
    // field 5 (initializer), wire type 2
    graph_bytes.push_back(static_cast<char>((5 << 3) | 2));
    graph_bytes.push_back(static_cast<char>(t0_bytes.size()));  // < 128 bytes
    ASSERT_LT(t0_bytes.size(), 128u);
    graph_bytes += t0_bytes + g.SerializeAsString();
    onnx::ModelProto without_graph = m;
    without_graph.clear_graph();
    bytes = without_graph.SerializeAsString();
    bytes.push_back(static_cast<char>((7 << 3) | 2));
    uint64_t len = graph_bytes.size();
    while (len >= 0x80) {
      bytes.push_back(static_cast<char>((len & 0x7f) | 0x80));
      len >>= 7;
    }
    bytes.push_back(static_cast<char>(len));
    bytes += graph_bytes;
  }
  onnx::ModelProto reference;
  ASSERT_TRUE(reference.ParseFromString(bytes));
  ASSERT_EQ(reference.graph().initializer(0).raw_data(), extra.raw_data());  // protobuf's rule
  Graph graph = ParseOnnxModel(bytes.data(), bytes.size(), "");
  Model model(std::move(graph));
  auto out = model.Run({{"x", Tensor::FromVector<float>({4}, {0.f, 0.f, 0.f, 0.f})}});
  const std::vector<float> want = Expected(4, {0.f, 0.f, 0.f, 0.f});
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[0].second.data<float>()[i], want[i]);
}

TEST(OnnxWire, MalformedBytesAreLeftToProtobuf) {
  const std::string bytes = TestModel(64).SerializeAsString();
  std::string stripped;
  std::vector<RawSpan> spans;
  // Truncated inside an initializer's raw_data, and a group wire type (3) at the top level.
  EXPECT_FALSE(StripInitializerData(bytes.data(), bytes.size() - 1, &stripped, &spans));
  const size_t cut = bytes.find(TestModel(64).graph().initializer(0).raw_data()) + 10;
  EXPECT_FALSE(StripInitializerData(bytes.data(), cut, &stripped, &spans));
  EXPECT_TRUE(stripped.empty());
  EXPECT_TRUE(spans.empty());
  const std::string group = std::string(1, static_cast<char>((20 << 3) | 3)) + bytes;
  EXPECT_FALSE(StripInitializerData(group.data(), group.size(), &stripped, &spans));
  // The importer then parses the bytes whole and reports protobuf's verdict, as before the split.
  try {
    ParseOnnxModel(bytes.data(), cut, "");
    FAIL() << "truncated model imported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("not a valid ONNX model"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(StripInitializerData(bytes.data(), 0, &stripped, &spans));  // an empty message is valid protobuf
  EXPECT_TRUE(spans.empty());
}

TEST(OnnxWire, MutatedModelsSplitExactlyAsProtobufParses) {
  // Property over mutated bytes: whenever the split succeeds, protobuf parses the whole bytes too, to the same model
  // with the same raw_data per initializer; when the split declines, the importer falls back to that whole parse.
  const std::string original = TestModel(24).SerializeAsString();
  uint64_t rng = 12345;
  auto next = [&] {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };
  int split = 0, declined = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string bytes = original;
    const int edits = 1 + static_cast<int>(next() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = next() % bytes.size();
      switch (next() % 3) {
        case 0:
          bytes[at] = static_cast<char>(next());
          break;
        case 1:
          bytes.erase(at, 1 + next() % 8);
          break;
        default:
          bytes.insert(at, 1, static_cast<char>(next()));
          break;
      }
      if (bytes.empty()) bytes = original;
    }
    std::string stripped;
    std::vector<RawSpan> spans;
    onnx::ModelProto parts;
    const bool ok = StripInitializerData(bytes.data(), bytes.size(), &stripped, &spans) &&
                    parts.ParseFromString(stripped) &&
                    static_cast<size_t>(parts.graph().initializer_size()) == spans.size();
    onnx::ModelProto whole;
    const bool whole_ok = whole.ParseFromString(bytes);
    if (!ok) {
      ++declined;
      continue;
    }
    ++split;
    ASSERT_TRUE(whole_ok) << "iteration " << iter << ": the split accepted bytes protobuf rejects";
    ASSERT_EQ(whole.graph().initializer_size(), parts.graph().initializer_size()) << iter;
    for (int i = 0; i < whole.graph().initializer_size(); ++i) {
      if (!spans[i].present) continue;
      ASSERT_EQ(whole.graph().initializer(i).raw_data(), std::string(spans[i].data, spans[i].size)) << iter;
      ASSERT_TRUE(parts.graph().initializer(i).has_raw_data()) << iter;
      ASSERT_TRUE(parts.graph().initializer(i).raw_data().empty()) << iter;
      whole.mutable_graph()->mutable_initializer(i)->set_raw_data("");
    }
    ASSERT_EQ(whole.SerializeAsString(), parts.SerializeAsString()) << iter;
  }
  EXPECT_GT(split, 100);
  EXPECT_GT(declined, 100);
}

}  // namespace
}  // namespace osprey
