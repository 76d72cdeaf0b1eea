// Half-precision models computed in float32 (runtime/promote_half.h): the graph's half inputs and declared half
// outputs keep their types and names; an output given twice is cast once; a half input given back is itself; an
// undeclared output comes back as float32. Values checked by hand.
#include "runtime/promote_half.h"

#include <gtest/gtest.h>

#include "osprey/runtime.h"

namespace osprey {
namespace {

Tensor Half(Shape shape, const std::vector<float>& v) {
  Tensor t(DType::kF16, std::move(shape));
  for (size_t i = 0; i < v.size(); ++i) t.data<uint16_t>()[i] = FloatToHalf(v[i]);
  return t;
}

std::vector<float> Floats(const Tensor& t) {
  std::vector<float> v;
  for (int64_t i = 0; i < t.numel(); ++i)
    v.push_back(t.dtype() == DType::kF16 ? HalfToFloat(t.data<uint16_t>()[i]) : t.data<float>()[i]);
  return v;
}

Graph HalfGraph() {
  GraphBuilder b("half");
  auto x = b.Input("x", DType::kF16, {3});
  auto c = b.Constant(Half({3}, {0.5f, -1.f, 2.f}));
  auto y = b.Op("Mul", {b.Op("Add", {x, c}), b.Constant(Half({}, {2.f}))});
  auto z = b.Op("Cast", {y}, {{"to", Attribute::Int(1)}});  // float32, undeclared
  b.Output(y, "y");
  b.Output(y, "y");
  b.Output(x, "x");
  b.Output(z, "z");
  Graph g = b.Finish();
  for (int k : {0, 1, 2}) {
    g.output_infos[k].dtype = DType::kF16;
    g.output_infos[k].has_dtype = true;
  }
  return g;
}

TEST(PromoteHalf, InputsAndOutputsKeepTheirTypesAndNames) {
  Graph g = HalfGraph();
  ASSERT_TRUE(PromoteHalfFloats(g));
  for (const auto& [id, t] : g.constants) EXPECT_EQ(t.dtype(), DType::kF32);
  int casts = 0;
  for (const Node& n : g.nodes) casts += n.op_type == "Cast";
  EXPECT_EQ(casts, 3);  // after x, before y (once for its two outputs), and the model's own
  EXPECT_EQ(g.value_names[g.outputs[0]], "y");
  EXPECT_EQ(g.outputs[0], g.outputs[1]);
  EXPECT_EQ(g.value_names[g.outputs[2]], "x");
  EXPECT_EQ(g.outputs[2], g.inputs[0]);
  EXPECT_FALSE(PromoteHalfFloats(g));  // nothing left to promote

  Model model(HalfGraph());
  auto out = model.Run({{"x", Half({3}, {1.f, 2.f, -3.f})}});
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].first, "y");
  EXPECT_EQ(out[0].second.dtype(), DType::kF16);
  EXPECT_EQ(Floats(out[0].second), (std::vector<float>{3.f, 2.f, -2.f}));
  EXPECT_EQ(Floats(out[1].second), (std::vector<float>{3.f, 2.f, -2.f}));
  EXPECT_EQ(out[2].second.dtype(), DType::kF16);
  EXPECT_EQ(Floats(out[2].second), (std::vector<float>{1.f, 2.f, -3.f}));
  EXPECT_EQ(out[3].second.dtype(), DType::kF32);
  EXPECT_EQ(Floats(out[3].second), (std::vector<float>{3.f, 2.f, -2.f}));
}

TEST(PromoteHalf, AttributesAndSubgraphs) {
  GraphBuilder branch_builder("then");
  auto k = branch_builder.Constant(Half({1}, {1.5f}));
  branch_builder.Output(branch_builder.Op("Identity", {k}), "k");
  auto branch = std::make_shared<Graph>(branch_builder.Finish());
  branch->output_infos[0].dtype = DType::kF16;
  branch->output_infos[0].has_dtype = true;

  GraphBuilder b("attrs");
  auto x = b.Input("x", DType::kF32, {2});
  auto h = b.Op("Cast", {x}, {{"to", Attribute::Int(10)}});
  auto fill = b.Op("ConstantOfShape", {b.Constant(Tensor::FromVector<int64_t>({1}, {2}))},
                   {{"value", Attribute::TensorValue(Half({1}, {0.25f}))}});
  b.Output(b.Op("Add", {h, fill}), "y");
  auto cond = b.Constant(Tensor::Scalar<bool>(true));
  b.Output(b.Op("If", {cond},
                {{"then_branch", Attribute::GraphValue(branch)}, {"else_branch", Attribute::GraphValue(branch)}}),
           "k");
  Graph g = b.Finish();
  ASSERT_TRUE(PromoteHalfFloats(g));
  for (const Node& n : g.nodes) {
    if (n.op_type == "Cast") {
      EXPECT_EQ(n.attrs.at("to").i, 1);
    }
    if (n.op_type == "ConstantOfShape") {
      EXPECT_EQ(n.attrs.at("value").t.dtype(), DType::kF32);
    }
    if (n.op_type == "If") {
      const Graph& then = *n.attrs.at("then_branch").g;
      EXPECT_EQ(then.output_infos[0].dtype, DType::kF32);
      for (const auto& [id, t] : then.constants) EXPECT_EQ(t.dtype(), DType::kF32);
    }
  }
  EXPECT_EQ(branch->output_infos[0].dtype, DType::kF16);  // the shared original is left as it was
}

}  // namespace
}  // namespace osprey
