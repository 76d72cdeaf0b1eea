#pragma once
// A model cut at its data-dependent ops (OpTraits::data_dependent: NonZero, NonMaxSuppression, Compress), whose output
// shapes depend on values: the nodes that do not depend on such an op's outputs form one graph (the prefix), the op
// runs on the host between plans, and the nodes after it form another graph (the tail), compiled for the shapes each
// run produces (plans cached by shape, as a model's are). Each part is cut again where it holds more such ops. An If
// whose branch, or a Loop whose body, holds such an op is cut the same way and runs its branch or body on the host; so
// is an If whose condition follows input data and whose branches give outputs of different shapes, and a node a shape
// of which needs a value known only at run time (MakeRunnerInsteadOf).
// docs/architecture.md, "Data-dependent shapes".
#include <functional>
#include <memory>
#include <vector>

#include "osprey/runtime.h"

namespace osprey {

class GraphRunner {
 public:
  virtual ~GraphRunner() = default;
  /// Runs with the graph's inputs in order; returns its outputs in order. Appends per-step times to `profile`.
  virtual std::vector<Tensor> Run(const std::vector<Tensor>& inputs, const CompileOptions& options,
                                  std::vector<OpProfile>* profile) = 0;
  /// The plan of the first compiled part for these inputs (what `bench` describes), compiling it if needed.
  virtual std::shared_ptr<const Plan> FirstPlan(const std::vector<Tensor>& inputs, const CompileOptions& options) = 0;
  /// Every plan cache of the parts.
  virtual void ForEachCache(const std::function<void(PlanCache&)>& f) = 0;
};

/// True when a node at `graph`'s top level has OpTraits::data_dependent.
bool HasDataDependentOps(const Graph& graph);

/// The cut runner of `graph` (HasDataDependentOps must be true). Constants stay the graph's tensors (no copies).
std::unique_ptr<GraphRunner> MakeSegmentedRunner(const Graph& graph, size_t plan_cache_capacity, WeightStore* weights,
                                                 std::shared_ptr<MemoryAccount> account);

/// What runs `graph` instead of one plan when compiling it threw `e`, as a model with a data-dependent op runs: cut at
/// the node `e` names, which runs on the host, the parts before and after it compiled for the shapes each run gives.
/// For an If on input data whose branches give different shapes (IfShapesDiffer, runtime/inline_if.h), or a node a
/// shape of which needs a value known only at run time (ValueNotKnown, ops/op_registry.h: a Slice at a Loop's step).
/// Null for other errors, or when no such node is left to cut at (the error then stands).
std::unique_ptr<GraphRunner> MakeRunnerInsteadOf(const Graph& graph, const Error& e, size_t plan_cache_capacity,
                                                 WeightStore* weights, std::shared_ptr<MemoryAccount> account);

}  // namespace osprey
