// Reduce*'s fast kernel (kernels/cpu/reduce_kernel.cc) against the reference kernel: every op over the reduced-axis
// blocks it takes (trailing, middle, leading, all, nothing with noop_with_empty_axes), keepdims 0 and 1, negative
// axes, axes as an attribute (opset 13) and as an input (opset 18, ReduceSum from 13), NaN propagation of Max/Min,
// and the axis sets it leaves to the reference (two separate blocks, axes computed at run time).
#include <limits>

#include "kernel_test_util.h"

namespace osprey::testing {
namespace {

Node ReduceNode(const std::string& op, int opset, const std::vector<int64_t>& axes, int64_t keepdims,
                std::vector<Tensor>* inputs) {
  AttributeMap attrs{{"keepdims", Attribute::Int(keepdims)}};
  const bool as_input = opset >= (op == "ReduceSum" ? 13 : 18);
  if (as_input) {
    inputs->push_back(Tensor::FromVector<int64_t>({static_cast<int64_t>(axes.size())}, axes));
  } else {
    attrs["axes"] = Attribute::Ints(axes);
  }
  return MakeNode(op, as_input ? 2 : 1, 1, std::move(attrs));
}

const char* const kOps[] = {"ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceMax",
                            "ReduceMin"};

TEST(ReduceKernel, EveryOpOverOneBlockOfAxes) {
  struct Case {
    Shape x;
    std::vector<int64_t> axes;
  };
  const Case cases[] = {{{4, 6, 300}, {2}},          {{4, 6, 300}, {-1}},       {{3, 50, 70}, {1}},
                        {{2, 5, 7, 1200}, {1, 2}},   {{64, 3, 9}, {0}},         {{2, 1, 8, 9}, {1, 2}},
                        {{5, 6, 7}, {0, 1, 2}},      {{1, 2048, 64}, {1}},      {{300, 129}, {1}}};
  for (const char* op : kOps)
    for (int opset : {13, 18})
      for (int64_t keepdims : {0, 1})
        for (const Case& c : cases) {
          SCOPED_TRACE(std::string(op) + " opset " + std::to_string(opset) + " keepdims " + std::to_string(keepdims) +
                       " x " + ShapeToString(c.x) + " axes " + ShapeToString(c.axes));
          std::vector<Tensor> in{RandomTensor(c.x, 3, -2.f, 3.f)};
          Node node = ReduceNode(op, opset, c.axes, keepdims, &in);
          std::vector<bool> constant(in.size(), true);
          constant[0] = false;
          ExpectFastMatchesReference(node, in, constant, "ReduceF32", opset, nullptr, 1e-4f);
        }
}

TEST(ReduceKernel, NoopWithEmptyAxesAndNanPropagation) {
  Node noop = MakeNode("ReduceSum", 1, 1, {{"noop_with_empty_axes", Attribute::Int(1)}});
  ExpectFastMatchesReference(noop, {RandomTensor({3, 4}, 1)}, {false}, "ReduceF32", 13);
  for (const char* op : {"ReduceMax", "ReduceMin"}) {
    SCOPED_TRACE(op);
    for (const std::vector<int64_t>& axes : {std::vector<int64_t>{1}, std::vector<int64_t>{0}}) {
      std::vector<Tensor> in{RandomTensor({4, 40}, 2)};
      in[0].data<float>()[1 * 40 + 7] = std::numeric_limits<float>::quiet_NaN();  // row 1, column 7
      Node node = ReduceNode(op, 13, axes, 1, &in);
      std::vector<Tensor> outputs;
      std::unique_ptr<Kernel> kernel = CreateCpuKernel(MakeBuildContext(node, in, {false}, outputs, 13));
      ASSERT_NE(kernel, nullptr);
      RunKernel(*kernel, node, in, outputs, 13);
      const std::vector<Tensor> want = RunReferenceNode(node, in, 13);
      ExpectTensorNear(outputs[0], want[0]);
      const int64_t nan_at = axes[0] == 1 ? 1 : 7;
      for (int64_t i = 0; i < outputs[0].numel(); ++i)
        EXPECT_EQ(std::isnan(outputs[0].data<float>()[i]), i == nan_at) << i;
    }
  }
}

TEST(ReduceKernel, DeclinedWhereTheReferenceRuns) {
  std::vector<Tensor> in{RandomTensor({2, 3, 4, 5}, 4)};
  Node split = ReduceNode("ReduceMean", 13, {1, 3}, 1, &in);  // two separate blocks
  EXPECT_TRUE(FastKernelDeclines(split, in, {false}, 13));
  std::vector<Tensor> runtime{RandomTensor({2, 3, 4, 5}, 4)};
  Node axes_input = ReduceNode("ReduceSum", 13, {1}, 1, &runtime);
  EXPECT_TRUE(FastKernelDeclines(axes_input, runtime, {false, false}, 13));  // axes known only at run time
}

}  // namespace
}  // namespace osprey::testing
