// The fast RNN / GRU / LSTM kernel (kernels/cpu/recurrent_kernels.cc, oneDNN sgemm) against the reference kernel,
// on odd sizes (hidden 5 and 13, input 3 and 7) with every optional input, both layouts and uneven sequence lengths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "kernel_test_util.h"
#include "kernels/cpu/cpu_kernels.h"

namespace osprey {
namespace {

using testing::kFastAtol;
using testing::kFastRtol;
using testing::MakeBuildContext;
using testing::MakeNode;
using testing::RandomTensor;
using testing::RunKernel;

// The float kernel's name: with R constant (known at build) the steps run on R packed in panels (gemv_panel.h) where
// the CPU has AVX-512 (panels of 64 columns) or AVX2 + FMA (16); R known only at run time, or neither: oneDNN's sgemm.
// Without AVX-512 a tuning build times the panels against oneDNN's sgemm; OSPREY_GEMV=1 (set for these tests) keeps
// the panels, so that they are what is checked.
const bool kPanelsKept = setenv("OSPREY_GEMV", "1", 1) == 0;
std::string FloatKernel(const std::string& op, bool r_constant) {
  EXPECT_TRUE(kPanelsKept);
  const bool panels =
      __builtin_cpu_supports("avx512f") || (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
  return op + (r_constant && panels ? "F32Panels" : "F32Dnnl");
}

// Compares every output of the fast kernel with the reference kernel's, over two runs.
void ExpectAllOutputsMatch(const Node& node, const std::vector<Tensor>& inputs, const std::string& name,
                           bool r_constant = true) {
  SCOPED_TRACE(r_constant ? "R constant" : "R at run time");
  std::vector<Tensor> expected = testing::RunReferenceNode(node, inputs);
  std::vector<Tensor> outputs;
  std::vector<bool> constant(inputs.size(), true);
  constant[0] = false;
  constant[2] = r_constant;
  KernelBuildContext bc = MakeBuildContext(node, inputs, constant, outputs);
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr);
  if (name.empty())  // either of the float kernels (a timed choice)
    EXPECT_TRUE(std::string(kernel->Name()) == node.op_type + "F32Panels" ||
                std::string(kernel->Name()) == node.op_type + "F32Dnnl")
        << kernel->Name();
  else
    EXPECT_EQ(std::string(kernel->Name()), name);
  // The input projection of every step in the run's workspace (RunKernel fills it with NaNs first).
  const Shape& x = inputs[0].shape();
  EXPECT_EQ(kernel->WorkspaceBytes(), size_t(inputs[1].dim(0) * x[0] * x[1] * inputs[1].dim(1)) * sizeof(float));
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
      for (bool r_constant : {true, false})
        ExpectAllOutputsMatch(MakeNode(c.op, static_cast<int>(inputs.size()), num_outputs, attrs), inputs,
                              FloatKernel(c.op, r_constant), r_constant);
    }
  }
}

// Widths over one panel with a partial last one (hidden 40: LSTM 160 columns, GRU 80 + 40: 64-column panels with
// AVX-512, 16 with AVX2), one direction at batch 1 with a product large enough (LSTM hidden 192: 768 x 192) to be
// split over the threads, and batches of 6, 5 and 9 items taking each step together (rows through a panel eight or
// four at a time, then the rest; hidden 5 and 13 in FastMatchesReference leave a remainder of k past the AVX2
// kernel's interleaved sums).
TEST(RecurrentKernels, PackedStepsOverSeveralPanels) {
  const struct {
    const char* op;
    int gates;
    int64_t hidden, batch;
    const char* direction;
  } cases[] = {{"LSTM", 4, 40, 2, "bidirectional"}, {"GRU", 3, 40, 2, "bidirectional"},
               {"RNN", 1, 72, 1, "forward"},        {"LSTM", 4, 192, 1, "forward"},
               {"GRU", 3, 40, 1, "reverse"},        {"LSTM", 4, 40, 6, "bidirectional"},
               {"GRU", 3, 72, 5, "forward"},        {"RNN", 1, 72, 9, "bidirectional"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.op) + " hidden " + std::to_string(c.hidden) + " batch " + std::to_string(c.batch));
    const int64_t seq = 4, input = 16, dirs = std::string(c.direction) == "bidirectional" ? 2 : 1;
    AttributeMap attrs = {{"direction", Attribute::String(c.direction)}};
    if (std::string(c.op) == "GRU") attrs["linear_before_reset"] = Attribute::Int(c.batch == 1);
    std::vector<Tensor> inputs = {RandomTensor({seq, c.batch, input}, 11),
                                  RandomTensor({dirs, c.gates * c.hidden, input}, 12, -0.3f, 0.3f),
                                  RandomTensor({dirs, c.gates * c.hidden, c.hidden}, 13, -0.3f, 0.3f),
                                  RandomTensor({dirs, 2 * c.gates * c.hidden}, 14)};
    ExpectAllOutputsMatch(MakeNode(c.op, static_cast<int>(inputs.size()), 2, attrs), inputs, FloatKernel(c.op, true));
  }
}

// A direction's R larger than any core's cache (hidden 704: 7.9 MB per direction): each step's product split over
// the threads, the (direction, item) pairs one after another, every other step reading the panels last to first
// (recurrent_kernels.cc); two items, so each pack is read in both orders within a run and across runs. And the other
// way, a direction per thread (OSPREY_RECURRENT_SPLIT forces each; a tuning build times them).
TEST(RecurrentKernels, WideRecurrenceSplitsEachStep) {
  const int64_t seq = 3, batch = 2, input = 24, hidden = 704, dirs = 2;
  for (const auto& [op, gates, split] :
       {std::tuple<const char*, int64_t, const char*>{"LSTM", 4, "1"}, {"GRU", 3, "1"}, {"LSTM", 4, "0"}}) {
    SCOPED_TRACE(std::string(op) + " split " + split);
    setenv("OSPREY_RECURRENT_SPLIT", split, 1);
    std::vector<Tensor> inputs = {
        RandomTensor({seq, batch, input}, 21), RandomTensor({dirs, gates * hidden, input}, 22, -0.1f, 0.1f),
        RandomTensor({dirs, gates * hidden, hidden}, 23, -0.05f, 0.05f), RandomTensor({dirs, 2 * gates * hidden}, 24)};
    ExpectAllOutputsMatch(
        MakeNode(op, static_cast<int>(inputs.size()), 2, {{"direction", Attribute::String("bidirectional")}}), inputs,
        FloatKernel(op, true));
  }
  unsetenv("OSPREY_RECURRENT_SPLIT");
}

// Split steps run whole on the threads, each over its own hidden units (recurrent_cell.h: products, then cells, a
// barrier per step, h in two buffers), with every optional input: uneven sequence lengths (one item of none, whose
// state stays), initial states, peepholes, both layouts, reverse and both directions; LSTM, GRU with
// linear_before_reset and RNN, wide enough to be split (gates x hidden^2 >= 2^17) and of whole panels (hidden a
// multiple of 64). GRU without linear_before_reset keeps the products-only split (WideRecurrenceSplitsEachStep).
TEST(RecurrentKernels, SplitStepsRunOverEachThreadsUnits) {
  setenv("OSPREY_RECURRENT_SPLIT", "1", 1);
  const int64_t seq = 5, batch = 3;
  for (const Case& c : {Case{"LSTM", 4, "bidirectional", 1}, Case{"LSTM", 4, "reverse", 0},
                        Case{"GRU", 3, "bidirectional", 0}, Case{"RNN", 1, "forward", 1}}) {
    const int64_t hidden = c.gates == 4 ? 192 : c.gates == 3 ? 256 : 384, input = 24;
    const int64_t dirs = std::string(c.direction) == "bidirectional" ? 2 : 1;
    const bool lstm = std::string(c.op) == "LSTM";
    SCOPED_TRACE(std::string(c.op) + " " + c.direction);
    AttributeMap attrs = {{"direction", Attribute::String(c.direction)}, {"layout", Attribute::Int(c.layout)}};
    if (c.gates == 3) attrs["linear_before_reset"] = Attribute::Int(1);
    const Shape x_shape = c.layout == 0 ? Shape{seq, batch, input} : Shape{batch, seq, input};
    const Shape state = c.layout == 0 ? Shape{dirs, batch, hidden} : Shape{batch, dirs, hidden};
    std::vector<Tensor> inputs = {RandomTensor(x_shape, 41),
                                  RandomTensor({dirs, c.gates * hidden, input}, 42, -0.2f, 0.2f),
                                  RandomTensor({dirs, c.gates * hidden, hidden}, 43, -0.1f, 0.1f),
                                  RandomTensor({dirs, 2 * c.gates * hidden}, 44),
                                  Tensor::FromVector<int32_t>({batch}, {5, 2, 0}),
                                  RandomTensor(state, 45)};
    if (lstm) {
      inputs.push_back(RandomTensor(state, 46));
      inputs.push_back(RandomTensor({dirs, 3 * hidden}, 47));
    }
    ExpectAllOutputsMatch(MakeNode(c.op, static_cast<int>(inputs.size()), lstm ? 3 : 2, attrs), inputs,
                          FloatKernel(c.op, true));
  }
  unsetenv("OSPREY_RECURRENT_SPLIT");
}

// The tuning build's own choices, untold (neither OSPREY_GEMV nor OSPREY_RECURRENT_SPLIT set): without AVX-512 the
// panels or oneDNN's sgemm and, with the panels, the split or a direction per thread, each timed on the whole kernel
// (recurrent_kernels.cc; R of 768 x 192 may be split). Whichever is chosen, the outputs are the reference's, also at a
// second sequence length of the same size class (the choice remembered).
TEST(RecurrentKernels, TimedChoicesKeepTheResults) {
  setenv("OSPREY_GEMV", "", 1);
  for (int64_t seq : {33, 40}) {
    SCOPED_TRACE("seq " + std::to_string(seq));
    const int64_t batch = 3, input = 16, hidden = 192, dirs = 2;
    std::vector<Tensor> inputs = {RandomTensor({seq, batch, input}, 31),
                                  RandomTensor({dirs, 4 * hidden, input}, 32, -0.2f, 0.2f),
                                  RandomTensor({dirs, 4 * hidden, hidden}, 33, -0.1f, 0.1f),
                                  RandomTensor({dirs, 8 * hidden}, 34)};
    ExpectAllOutputsMatch(
        MakeNode("LSTM", static_cast<int>(inputs.size()), 2, {{"direction", Attribute::String("bidirectional")}}),
        inputs, "");
  }
  setenv("OSPREY_GEMV", "1", 1);
}

// An LSTM lowered from DynamicQuantizeLSTM (`_int8_weights`, inputs 8 to 11: kernels/recurrent_cell.h): the fast
// kernel's int8 products (VNNI where the CPU has it; OSPREY_INT8_PAIRING=1 forces the AVX2 ones) against the
// reference's.
// Sizes: 80 gate columns (four 16-column blocks and one more), 52 (a partial block), inputs of 10 and 13 bytes (not
// whole groups of 4). The integer products are exact in both, so only the activations' approximations differ.
TEST(RecurrentKernels, Int8WeightsMatchReference) {
  const int64_t seq = 5, batch = 2, dirs = 2;
  for (int64_t hidden : {20, 13}) {
    const int64_t input = hidden == 20 ? 10 : 13, gh = 4 * hidden;
    SCOPED_TRACE("hidden " + std::to_string(hidden));
    auto int8 = [](const Shape& shape, uint32_t seed) {
      Tensor t(DType::kI8, shape);
      uint32_t s = seed * 2654435761u + 1u;
      for (int64_t i = 0; i < t.numel(); ++i) {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        t.data<int8_t>()[i] = static_cast<int8_t>(static_cast<int>(s >> 24) - 128);
      }
      return t;
    };
    const Tensor r8 = int8({dirs, gh, hidden}, 1), w8 = int8({dirs, gh, input}, 2);
    const Tensor r_scale = RandomTensor({dirs, gh}, 3, 0.001f, 0.01f), w_scale = RandomTensor({dirs, gh}, 4, 0.002f, 0.02f);
    auto dequantised = [](const Tensor& q, const Tensor& scale) {
      Tensor f(DType::kF32, q.shape());
      const int64_t per_row = q.dim(2);
      for (int64_t i = 0; i < q.numel(); ++i)
        f.data<float>()[i] = q.data<int8_t>()[i] * scale.data<float>()[i / per_row];
      return f;
    };
    std::vector<Tensor> inputs = {RandomTensor({seq, batch, input}, 5, -3.f, 3.f),
                                  dequantised(w8, w_scale),
                                  dequantised(r8, r_scale),
                                  RandomTensor({dirs, 2 * gh}, 6),
                                  Tensor(),
                                  Tensor(),
                                  Tensor(),
                                  Tensor(),
                                  r8,
                                  r_scale,
                                  w8,
                                  w_scale};
    Node node = MakeNode("LSTM", 12, 3, {{"direction", Attribute::String("bidirectional")},
                                         {"_int8_weights", Attribute::Int(1)}});
    for (const char* force_loops : {"0", "1"}) {  // "1": not VNNI
      setenv("OSPREY_INT8_PAIRING", force_loops, 1);
      const bool vnni = Int8ProductsExact() && __builtin_cpu_supports("avx512vnni");
      SCOPED_TRACE(std::string("OSPREY_INT8_PAIRING=") + force_loops);
      ExpectAllOutputsMatch(node, inputs,
                            vnni ? "LSTMInt8Vnni" : __builtin_cpu_supports("avx2") ? "LSTMInt8Avx2" : "LSTMInt8");
      unsetenv("OSPREY_INT8_PAIRING");
    }
    // A NaN in X is quantised to the zero point (DynamicQuantizeLinear's rule), as the reference does: no undefined
    // float-to-integer conversion, the same outputs.
    std::vector<Tensor> with_nan = inputs;
    with_nan[0] = inputs[0].Clone();
    with_nan[0].data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
    ExpectAllOutputsMatch(node, with_nan,
                          Int8ProductsExact() && __builtin_cpu_supports("avx512vnni") ? "LSTMInt8Vnni"
                          : __builtin_cpu_supports("avx2")                           ? "LSTMInt8Avx2"
                                                                                     : "LSTMInt8");
    // The int8 products are not the float ones: without the attribute the same weights give other (close) values.
    Node plain = node;
    plain.attrs.erase("_int8_weights");
    plain.inputs.resize(8);
    std::vector<Tensor> float_inputs(inputs.begin(), inputs.begin() + 8);
    const Tensor quantised = testing::RunReferenceNode(node, inputs)[0];
    const Tensor exact = testing::RunReferenceNode(plain, float_inputs)[0];
    double max_diff = 0;
    for (int64_t i = 0; i < exact.numel(); ++i)
      max_diff = std::max<double>(max_diff, std::fabs(quantised.data<float>()[i] - exact.data<float>()[i]));
    EXPECT_GT(max_diff, 1e-6);
    EXPECT_LT(max_diff, 0.1);
  }
}

// A model that writes the internal attribute itself gets named errors, not a crash: `_int8_weights` without its
// inputs, weights of the wrong type, and the inputs without the attribute.
TEST(RecurrentKernels, Int8WeightsAreChecked) {
  const int64_t hidden = 3, input = 2, gh = 4 * hidden;
  std::vector<Tensor> base = {RandomTensor({2, 1, input}, 1), RandomTensor({1, gh, input}, 2),
                              RandomTensor({1, gh, hidden}, 3)};
  auto expect_error = [&](const std::vector<Tensor>& inputs, bool attribute, const std::string& words) {
    AttributeMap attrs;
    if (attribute) attrs["_int8_weights"] = Attribute::Int(1);
    Node node = MakeNode("LSTM", static_cast<int>(inputs.size()), 3, attrs);
    try {
      testing::RunReferenceNode(node, inputs);
      ADD_FAILURE() << "no error; expected one mentioning " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_error(base, true, "_int8_weights needs R, R's scales, W and W's scales as inputs 8 to 11");
  std::vector<Tensor> full = base;
  full.resize(8);
  full.push_back(RandomTensor({1, gh, hidden}, 4));  // float where int8 belongs
  full.push_back(RandomTensor({1, gh}, 5));
  full.push_back(Tensor::Zeros(DType::kI8, {1, gh, input}));
  full.push_back(RandomTensor({1, gh}, 6));
  expect_error(full, true, "input 8 (int8 weights) must be int8");
  full[8] = Tensor::Zeros(DType::kI8, {1, gh, hidden});
  expect_error(full, false, "need _int8_weights = 1 on an LSTM");
  full[9] = RandomTensor({1, gh + 1}, 5);
  expect_error(full, true, "_int8_weights' inputs 8 to 11 must have shapes");
}

}  // namespace
}  // namespace osprey
