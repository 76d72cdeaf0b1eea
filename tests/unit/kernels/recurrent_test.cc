// The fast RNN / GRU / LSTM kernel (kernels/cpu/recurrent_kernels.cc, oneDNN sgemm) against the reference kernel,
// on odd sizes (hidden 5 and 13, input 3 and 7) with every optional input, both layouts and uneven sequence lengths.
#include <gtest/gtest.h>

#include "kernel_test_util.h"

namespace osprey {
namespace {

using testing::kFastAtol;
using testing::kFastRtol;
using testing::MakeBuildContext;
using testing::MakeNode;
using testing::RandomTensor;
using testing::RunKernel;

// Compares every output of the fast kernel with the reference kernel's, over two runs.
void ExpectAllOutputsMatch(const Node& node, const std::vector<Tensor>& inputs, const std::string& name) {
  std::vector<Tensor> expected = testing::RunReferenceNode(node, inputs);
  std::vector<Tensor> outputs;
  std::vector<bool> constant(inputs.size(), true);
  constant[0] = false;
  KernelBuildContext bc = MakeBuildContext(node, inputs, constant, outputs);
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr);
  EXPECT_EQ(std::string(kernel->Name()), name);
  for (int run = 0; run < 2; ++run)
    for (size_t o = 0; o < outputs.size(); ++o) {
      SCOPED_TRACE("run " + std::to_string(run) + ", output " + std::to_string(o));
      RunKernel(*kernel, node, inputs, outputs);
      testing::ExpectTensorNear(outputs[o], expected[o], kFastRtol, kFastAtol);
    }
}

struct Case {
  const char* op;
  int gates;
  const char* direction;
  int64_t layout;
};

TEST(RecurrentKernels, FastMatchesReference) {
  const int64_t seq = 6, batch = 3;
  for (const Case& c :
       {Case{"LSTM", 4, "bidirectional", 0}, Case{"LSTM", 4, "reverse", 1}, Case{"GRU", 3, "bidirectional", 1},
        Case{"GRU", 3, "forward", 0}, Case{"RNN", 1, "reverse", 0}, Case{"RNN", 1, "bidirectional", 1}}) {
    for (int64_t hidden : {5, 13}) {
      const int64_t input = hidden == 5 ? 3 : 7, dirs = std::string(c.direction) == "bidirectional" ? 2 : 1;
      const bool lstm = std::string(c.op) == "LSTM";
      SCOPED_TRACE(std::string(c.op) + " " + c.direction + " layout " + std::to_string(c.layout) + " hidden " +
                   std::to_string(hidden));
      AttributeMap attrs = {{"direction", Attribute::String(c.direction)}, {"layout", Attribute::Int(c.layout)}};
      if (std::string(c.op) == "GRU") attrs["linear_before_reset"] = Attribute::Int(hidden == 13);
      const Shape x_shape = c.layout == 0 ? Shape{seq, batch, input} : Shape{batch, seq, input};
      const Shape state = c.layout == 0 ? Shape{dirs, batch, hidden} : Shape{batch, dirs, hidden};
      std::vector<Tensor> inputs = {RandomTensor(x_shape, 1),
                                    RandomTensor({dirs, c.gates * hidden, input}, 2),
                                    RandomTensor({dirs, c.gates * hidden, hidden}, 3),
                                    RandomTensor({dirs, 2 * c.gates * hidden}, 4),
                                    Tensor::FromVector<int32_t>({batch}, {6, 2, 0}),
                                    RandomTensor(state, 5)};
      if (lstm) {
        inputs.push_back(RandomTensor(state, 6));
        inputs.push_back(RandomTensor({dirs, 3 * hidden}, 7));
      }
      const int num_outputs = lstm ? 3 : 2;
      ExpectAllOutputsMatch(MakeNode(c.op, static_cast<int>(inputs.size()), num_outputs, attrs), inputs,
                            std::string(c.op) + "F32Dnnl");
    }
  }
}

}  // namespace
}  // namespace osprey
