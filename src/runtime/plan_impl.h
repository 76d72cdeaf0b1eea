#pragma once
// Internal layout of a compiled Plan, shared by compile.cc (builds it) and plan.cc (runs it).
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/kernel.h"
#include "osprey/runtime.h"

namespace osprey {

/// Where a value lives during a run.
struct Slot {
  enum class Kind { kConstant, kInput, kArena, kOutput };
  Kind kind = Kind::kArena;
  DType dtype = DType::kF32;
  Shape shape;
  Tensor constant;       // kConstant
  int input_index = -1;  // kInput
  size_t offset = 0;     // kArena: byte offset in the arena
};

struct Step {
  Node node;               // possibly rewritten by fusion passes
  std::vector<int> inputs;   // slot ids; -1 = omitted
  std::vector<int> outputs;  // slot ids
  ReferenceKernel reference = nullptr;
  std::unique_ptr<Kernel> fast;
};

struct Plan::Impl {
  int opset = 17;
  int num_threads = 1;
  std::vector<Slot> slots;
  std::vector<Step> steps;
  std::vector<int> output_slots;  // per graph output
  std::vector<TensorSpec> output_specs;
  size_t arena_bytes = 0;
  std::shared_ptr<MemoryAccount> account;
  // Arenas are reused across runs; one per concurrent run.
  mutable std::mutex arena_mu;
  mutable std::vector<std::shared_ptr<Buffer>> free_arenas;
};

/// A value during compilation: its type, and its contents when known at compile time.
struct CompileValue {
  bool typed = false;
  DType dtype = DType::kF32;
  Shape shape;
  bool known = false;
  Tensor value;
};

/// Mutable compile-time graph: nodes still to run (not folded) and every value's type/value.
struct CompileState {
  const Graph* graph = nullptr;
  int opset = 17;
  std::vector<CompileValue> values;
  std::vector<Node> nodes;  // live (unfolded) nodes, in execution order
  std::vector<char> is_graph_output;
  WeightStore* weights = nullptr;
  int AddConstant(Tensor t);
};

/// Fusion passes on live nodes (docs/architecture.md): BN folding into Conv, Conv + Add residual, activation fusion.
void RunFusionPasses(CompileState& state);

}  // namespace osprey
