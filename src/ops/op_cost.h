#pragma once
// A rough single-thread cost of one node, in "work units" (multiply-adds count two, every other element touched
// one), from its shapes alone: the runtime times small compute steps on one thread against the plan's threads
// (docs/architecture.md, "Threads per step"), and this says which are small.
#include <cstdint>
#include <vector>

#include "osprey/graph.h"

namespace osprey {

/// Conv / ConvTranspose / ConvInteger / QLinearConv: 2 x multiply-adds; Gemm / MatMul (and integer forms): 2 x M x N
/// x K; LSTM / GRU / RNN: 2 x the multiply-adds of every step's gates; any other op: the elements of its inputs and
/// outputs. Saturates at INT64_MAX / 4.
int64_t EstimatedWork(const Node& node, const std::vector<Shape>& input_shapes,
                      const std::vector<Shape>& output_shapes);

}  // namespace osprey
