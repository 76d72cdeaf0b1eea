// GridSample's CPU kernel (kernels/cpu/grid_sample_kernel.cc: each point's taps shared by every channel, rows over
// two threads) against the reference kernel, for every mode, padding mode and align_corners, with grid points well
// outside [-1, 1], and a NaN grid point. The taps themselves are checked against ONNX Runtime and PyTorch in
// tests/e2e/test_grid_sample.py and the ONNX backend tests.
#include <cmath>
#include <string>

#include "kernel_test_util.h"

namespace osprey::testing {
namespace {

TEST(GridSampleCpu, MatchesReferenceForEveryModeAndPadding) {
  const Tensor x = RandomTensor({2, 5, 9, 11}, 1);
  Tensor grid = RandomTensor({2, 7, 40, 2}, 2, -1.8f, 1.8f);
  grid.data<float>()[6] = NAN;
  for (const char* mode : {"bilinear", "nearest", "bicubic", "linear", "cubic"})
    for (const char* padding : {"zeros", "border", "reflection"})
      for (int align : {0, 1}) {
        SCOPED_TRACE(std::string(mode) + " " + padding + " align_corners=" + std::to_string(align));
        Node node = MakeNode("GridSample", 2, 1,
                             {{"mode", Attribute::String(mode)}, {"padding_mode", Attribute::String(padding)},
                              {"align_corners", Attribute::Int(align)}});
        ExpectFastMatchesReference(node, {x, grid}, {false, false}, "GridSampleCpu", 20);
      }
}

}  // namespace
}  // namespace osprey::testing
