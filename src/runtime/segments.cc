// Models cut at their data-dependent ops (segments.h).
#include "runtime/segments.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "kernels/reference/reference.h"
#include "ops/control_flow.h"
#include "ops/op_registry.h"
#include "runtime/inline_if.h"
#include "runtime/inline_loop.h"

namespace osprey {
namespace {

bool HoldsCut(const Graph& g, const std::vector<char>& inputs_known = {});
std::vector<char> StaticValues(const Graph& g, const std::vector<char>& inputs_known = {});

constexpr int64_t kMaxCuts = 1024;
// Attribute (int 1) of a node the graph is cut at and run on the host although it is no data-dependent op (InsteadOf).
constexpr const char* kOnHostAttr = "_on_host";
constexpr int64_t kMaxHostOutputBytes = int64_t{1} << 30;  // per run of such a node (RunOnHost)
constexpr int64_t kMaxCutValues = int64_t{1} << 26;

bool IsDataDependentOp(const Node& n) {
  const OpSchema* schema = OpRegistry::Get().Find(n.op_type);
  return schema != nullptr && schema->traits.data_dependent;
}

// Whether a Loop can be unrolled when compiled: its trip count and condition are known then (`known`: the static
// values of the graph it sits in) and so is the condition its body computes in every iteration, given that the
// iteration number is and the carried values known on entry stay known (a fixed point). `body_known` gets which
// body inputs are known.
bool LoopUnrollable(const Node& loop, const std::vector<char>& known, std::vector<char>* body_known) {
  auto it = loop.attrs.find("body");
  auto carried_it = loop.attrs.find(kLoopCarriedAttr);
  if (it == loop.attrs.end() || !it->second.g || carried_it == loop.attrs.end()) return true;  // refused when compiled
  const Graph& body = *it->second.g;
  const size_t carried = static_cast<size_t>(std::max<int64_t>(0, carried_it->second.i));
  auto outer = [&](size_t k) { return k < loop.inputs.size() && (loop.inputs[k] < 0 || known[loop.inputs[k]]); };
  body_known->assign(body.inputs.size(), 0);
  for (size_t k = 0; k < body.inputs.size(); ++k) (*body_known)[k] = k < 2 || outer(k);
  if (!outer(0) || !outer(1) || body.outputs.empty() || body.outputs.size() < 1 + carried) return false;
  for (;;) {
    const std::vector<char> values = StaticValues(body, *body_known);
    bool changed = false;
    for (size_t k = 0; k < carried && 2 + k < body_known->size(); ++k)
      if ((*body_known)[2 + k] && !values[body.outputs[1 + k]]) {
        (*body_known)[2 + k] = 0;
        changed = true;
      }
    if (!changed) return values[body.outputs[0]] != 0;
  }
}

// Where a model is cut (`known`: the static values of the graph `n` sits in, StaticValues):
// - a data-dependent op (NonZero, NonMaxSuppression, Compress);
// - a node marked kOnHostAttr (InsteadOf: an If whose branches give different shapes, a node a shape of which needs
//   a value known only at run time);
// - an If with a cut in a branch (torchvision's detectors run NMS in an If on whether any box is left): the branch
//   its condition picks runs through a runner of its own;
// - a Loop with a cut in its body (tf2onnx's tf.map_fn over classes, each iteration an NMS), or one that cannot be
//   unrolled when compiled because its trip count or condition follow input data (TensorFlow's padded NMS loops
//   while boxes are left): the host runs its body once per iteration.
bool IsCut(const Node& n, const std::vector<char>& known) {
  if (n.attrs.count(kOnHostAttr)) return true;
  if (!n.domain.empty() && n.domain != "ai.onnx") return false;
  if (n.op_type == "If") {
    std::vector<char> inputs_known;  // a branch's inputs are the If's after the condition
    for (size_t k = 1; k < n.inputs.size(); ++k) inputs_known.push_back(n.inputs[k] < 0 || known[n.inputs[k]]);
    for (const char* branch : {"then_branch", "else_branch"}) {
      auto it = n.attrs.find(branch);
      if (it != n.attrs.end() && it->second.g && HoldsCut(*it->second.g, inputs_known)) return true;
    }
    return false;
  }
  if (n.op_type == "Loop") {
    std::vector<char> body_known;
    if (!LoopUnrollable(n, known, &body_known)) return true;
    auto it = n.attrs.find("body");
    return it != n.attrs.end() && it->second.g && HoldsCut(*it->second.g, body_known);
  }
  return IsDataDependentOp(n);
}

bool HoldsCut(const Graph& g, const std::vector<char>& inputs_known) {
  bool control_flow = false;
  for (const Node& n : g.nodes) {
    if (IsDataDependentOp(n) || n.attrs.count(kOnHostAttr)) return true;
    control_flow = control_flow || n.op_type == "If" || n.op_type == "Loop";
  }
  if (!control_flow) return false;
  const std::vector<char> known = StaticValues(g, inputs_known);
  for (const Node& n : g.nodes)
    if (IsCut(n, known)) return true;
  return false;
}

// What every runner of one model shares: its plan cache capacity, weight store and memory account, and the count of
// specialised runners alive (SpecializingRunner), which the model bounds as a whole: a chain of cuts whose counts
// change every run would otherwise keep up to 16 runners per level, nested.
struct Shared {
  size_t capacity = 8;
  WeightStore* weights = nullptr;
  std::shared_ptr<MemoryAccount> account;
  std::atomic<int64_t> specialized{0};
  std::atomic<int64_t> instead{0};  // parts alive that run cut where a compile failed (PlainRunner::Either)
};
using SharedPtr = std::shared_ptr<Shared>;
constexpr int64_t kMaxSpecialized = 256;  // specialised runners alive per model

std::unique_ptr<GraphRunner> MakeCutRunner(const Graph& graph, const SharedPtr& shared);

// Marks kOnHostAttr on the nodes of `g` (its subgraphs too, copied where marked) of type `op_type` (any when empty)
// named `name`, or whose copy in an unrolled loop has that name (a prefix + the name). Returns how many were not
// marked before.
int MarkOnHost(Graph* g, const std::string& name, const std::string& op_type) {
  int marked = 0;
  for (Node& n : g->nodes) {
    const bool named = !n.name.empty() && name.size() >= n.name.size() &&
                       name.compare(name.size() - n.name.size(), n.name.size(), n.name) == 0;
    if (named && (op_type.empty() || n.op_type == op_type) && !n.attrs.count(kOnHostAttr)) {
      n.attrs[kOnHostAttr] = Attribute::Int(1);
      ++marked;
    }
    for (auto& [key, attr] : n.attrs) {
      if (attr.kind != Attribute::Kind::kGraph || !attr.g) continue;
      auto copy = std::make_shared<Graph>(*attr.g);
      if (const int k = MarkOnHost(copy.get(), name, op_type)) {
        attr.g = std::move(copy);
        marked += k;
      }
    }
  }
  return marked;
}

void CheckCuts(const Graph& graph);

// What runs `graph` instead of one plan when compiling it threw `e`: the graph cut at the node `e` names, run on the
// host between the parts before and after it, which are compiled for the shapes each run gives. For IfShapesDiffer
// (an If on input data whose branches give different shapes) that is the If, whose branch runs through a runner of
// its own; for ValueNotKnown (a value a shape needs known only at run time: a Slice at a host-run Loop's step) the
// node, whose shapes are inferred from the values and whose reference kernel runs (RunOnHost). Null for other
// errors, or when no such node is left to cut at (the error then stands); kUnsupported beyond the bound on cuts.
std::unique_ptr<GraphRunner> InsteadOf(const Graph& graph, const Error& e, const SharedPtr& shared) {
  const auto* differ = dynamic_cast<const IfShapesDiffer*>(&e);
  const auto* unknown = dynamic_cast<const ValueNotKnown*>(&e);
  if (!differ && !unknown) return nullptr;
  Graph g = graph;
  if (MarkOnHost(&g, differ ? differ->node_name() : unknown->node_name(), differ ? "If" : "") == 0) return nullptr;
  if (!HoldsCut(g)) return nullptr;  // marked where no cut is made (a Scan body): the error stands
  CheckCuts(g);
  return MakeCutRunner(g, shared);
}

// One part without data-dependent ops: compiled per input shapes, plans cached; or, once a compile met what one plan
// cannot hold (InsteadOf), the runner made for that.
class PlainRunner final : public GraphRunner {
 public:
  PlainRunner(Graph graph, SharedPtr shared)
      : graph_(std::move(graph)), cache_(shared->capacity), shared_(std::move(shared)) {}
  ~PlainRunner() override {
    if (instead_) --shared_->instead;
  }
  std::vector<Tensor> Run(const std::vector<Tensor>& inputs, const CompileOptions& options,
                          std::vector<OpProfile>* profile) override {
    return Either([&] { return Compiled(inputs, options)->Run(inputs, profile); },
                  [&](GraphRunner& instead) { return instead.Run(inputs, options, profile); });
  }
  std::shared_ptr<const Plan> FirstPlan(const std::vector<Tensor>& inputs, const CompileOptions& options) override {
    return Either([&] { return Compiled(inputs, options); },
                  [&](GraphRunner& instead) { return instead.FirstPlan(inputs, options); });
  }
  void ForEachCache(const std::function<void(PlanCache&)>& f) override {
    f(cache_);
    if (std::shared_ptr<GraphRunner> instead = Instead()) instead->ForEachCache(f);
  }

 private:
  template <typename Whole, typename Parts>
  auto Either(Whole whole, Parts parts) -> decltype(whole()) {
    std::shared_ptr<GraphRunner> instead = Instead();
    if (!instead) {
      try {
        return whole();
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!instead_) {
          // Each such cut nests the part after it in one more runner, compiled again: bounded per model as cuts
          // made when loaded are (CheckCuts), so that a chain of thousands of data-shaped Slices cannot buy
          // unbounded recursion or compile work.
          const int64_t cuts = shared_->instead + 1;
          if (cuts > kMaxCuts || cuts * graph_.num_values() > kMaxCutValues)
            throw Error(ErrorCode::kUnsupported, std::string(e.what()) + "; osprey runs a model cut at such nodes, " +
                                                     "at most " + std::to_string(kMaxCuts) + " of them");
          instead_ = InsteadOf(graph_, e, shared_);
          if (instead_) ++shared_->instead;
        }
        if (!(instead = instead_)) throw;
      }
    }
    return parts(*instead);
  }
  std::shared_ptr<const Plan> Compiled(const std::vector<Tensor>& inputs, const CompileOptions& options) {
    std::vector<TensorSpec> specs;
    for (const Tensor& t : inputs) specs.push_back({t.dtype(), t.shape()});
    // The cache is this part's own: the key needs no fingerprint of the graph.
    return cache_.GetOrCompile("part", specs, options,
                               [&] { return Compile(graph_, specs, options, shared_->weights, shared_->account); });
  }
  std::shared_ptr<GraphRunner> Instead() {
    std::lock_guard<std::mutex> lock(mu_);
    return instead_;
  }

  Graph graph_;
  PlanCache cache_;
  SharedPtr shared_;
  std::mutex mu_;
  std::shared_ptr<GraphRunner> instead_;  // set once a compile met what one plan cannot hold
};

std::unique_ptr<GraphRunner> MakeRunner(Graph graph, const SharedPtr& shared) {
  if (HoldsCut(graph)) return MakeCutRunner(graph, shared);
  return std::make_unique<PlainRunner>(std::move(graph), shared);
}

// What compiling `g` may unroll: its nodes, with a nested Loop's body counted once per iteration when its trip count
// is a constant (it will be unrolled in every compile), once otherwise (then it runs, or is refused, on budgets of
// its own). A host-run loop whose body is compiled anew per iteration pays this per iteration.
int64_t UnrolledNodes(const Graph& g) {
  int64_t n = static_cast<int64_t>(g.nodes.size());
  for (const Node& node : g.nodes)
    for (const auto& [name, attr] : node.attrs) {
      if (attr.kind != Attribute::Kind::kGraph || !attr.g) continue;
      int64_t times = 1;
      if (node.op_type == "Loop" && !node.inputs.empty() && node.inputs[0] >= 0) {
        auto m = g.constants.find(node.inputs[0]);
        if (m != g.constants.end() && m->second.numel() == 1)
          times = std::clamp<int64_t>(m->second.GetAsInt(0), 1, kMaxLoopIterations);
      }
      n = std::min<int64_t>(n + times * UnrolledNodes(*attr.g), kMaxLoopNodes + 1);
    }
  return n;
}

// Cuts of a graph, counting those in the graphs of its cut nodes (inputs of those taken as unknown: an upper bound).
int64_t CountCuts(const Graph& g) {
  int64_t n = 0;
  const std::vector<char> known = StaticValues(g);
  for (const Node& node : g.nodes) {
    if (!IsCut(node, known)) continue;
    ++n;
    for (const auto& [name, attr] : node.attrs)
      if (attr.kind == Attribute::Kind::kGraph && attr.g) n += CountCuts(*attr.g);
  }
  return n;
}

// Values of `g` that do not depend on any input's values: constants, Shape/Size outputs, and what is computed from
// those alone (the sizes, axes and indices a model derives from shapes). Known when a part after a cut runs, they
// are handed to it as constants (SpecializingRunner), as they would have been folded had there been no cut.
// `inputs_known` (per graph input, may be empty) marks inputs whose values are known too.
std::vector<char> StaticValues(const Graph& g, const std::vector<char>& inputs_known) {
  std::vector<char> known(static_cast<size_t>(g.num_values()), 0);
  for (const auto& [id, t] : g.constants) known[id] = 1;
  for (size_t k = 0; k < g.inputs.size() && k < inputs_known.size(); ++k)
    if (g.inputs[k] >= 0 && inputs_known[k]) known[g.inputs[k]] = 1;
  for (const Node& n : g.nodes) {
    bool all = n.op_type == "Shape" || n.op_type == "Size";
    if (!all && n.op_type != "If" && n.op_type != "Loop" && n.op_type != "Scan" && !IsDataDependentOp(n)) {
      all = true;
      for (int v : n.inputs) all = all && (v < 0 || known[v]);
    }
    if (all)
      for (int v : n.outputs)
        if (v >= 0) known[v] = 1;
  }
  return known;
}

// A part whose inputs flagged `fixed` are compiled in as constants: one runner per distinct set of their values (the
// least recently used dropped beyond 16, or beyond kMaxSpecialized alive in the whole model), so shape arithmetic
// after a cut folds as it would without the cut.
class SpecializingRunner final : public GraphRunner {
 public:
  // `fixed` flags: 1 compiles a value in when it is small (kMaxFixedElements), one runner per value; kConstant
  // compiles it in whatever its size, keyed by its buffer: for a constant of the outer graph, the same tensor every
  // run (a loop body's captured weights, which then fold: SLANet's GRU weights transposed per step).
  static constexpr char kConstant = 2;
  SpecializingRunner(Graph graph, std::vector<char> fixed, SharedPtr shared, size_t max_runners = 16)
      : graph_(std::move(graph)), fixed_(std::move(fixed)), shared_(std::move(shared)), max_runners_(max_runners) {}
  ~SpecializingRunner() override { shared_->specialized -= static_cast<int64_t>(runners_.size()); }
  std::vector<Tensor> Run(const std::vector<Tensor>& inputs, const CompileOptions& options,
                          std::vector<OpProfile>* profile) override {
    std::vector<Tensor> rest;
    const std::shared_ptr<GraphRunner> runner = For(inputs, &rest);  // held: another thread may drop it meanwhile
    return runner->Run(rest, options, profile);
  }
  std::shared_ptr<const Plan> FirstPlan(const std::vector<Tensor>& inputs, const CompileOptions& options) override {
    std::vector<Tensor> rest;
    const std::shared_ptr<GraphRunner> runner = For(inputs, &rest);
    return runner->FirstPlan(rest, options);
  }
  void ForEachCache(const std::function<void(PlanCache&)>& f) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, runner] : runners_) runner->ForEachCache(f);
  }

 private:
  static constexpr int64_t kMaxFixedElements = 64;  // larger values stay inputs

  std::shared_ptr<GraphRunner> For(const std::vector<Tensor>& inputs, std::vector<Tensor>* rest) {
    std::string key;
    std::vector<char> as_constant(inputs.size(), 0);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Tensor& t = inputs[i];
      const char flag = i < fixed_.size() ? fixed_[i] : 0;
      if (flag == kConstant || (flag && t.numel() <= kMaxFixedElements)) {
        as_constant[i] = flag;
        key += std::to_string(i) + ":" + DTypeName(t.dtype()) + ShapeToString(t.shape()) + "=";
        if (flag == kConstant) {
          const void* buffer = t.raw();
          key.append(reinterpret_cast<const char*>(&buffer), sizeof(buffer));
        } else {
          key.append(static_cast<const char*>(t.raw()), t.nbytes());
        }
        key += ";";
      } else {
        rest->push_back(t);
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = runners_.begin(); it != runners_.end(); ++it)
      if (it->first == key) {
        runners_.splice(runners_.begin(), runners_, it);
        return runners_.front().second;
      }
    Graph g = graph_;
    g.inputs.clear();
    g.input_infos.clear();
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (as_constant[i]) {
        g.constants[graph_.inputs[i]] = as_constant[i] == kConstant ? inputs[i] : inputs[i].Clone();
      } else {
        g.inputs.push_back(graph_.inputs[i]);
        g.input_infos.push_back(graph_.input_infos[i]);
      }
    }
    // Dropping a runner drops the specialised runners nested in it too (their destructors count them off).
    while (!runners_.empty() && (runners_.size() >= max_runners_ || shared_->specialized >= kMaxSpecialized)) {
      runners_.pop_back();
      --shared_->specialized;
    }
    runners_.emplace_front(key, MakeRunner(std::move(g), shared_));
    ++shared_->specialized;
    return runners_.front().second;
  }

  Graph graph_;
  std::vector<char> fixed_;  // per input of graph_
  SharedPtr shared_;
  size_t max_runners_;
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<GraphRunner>>> runners_;  // most recent first
};

// `g` reduced to `nodes` (indices into g.nodes, in order), reading `inputs` and giving `outputs` (value ids of g,
// which the part keeps: unused ids are harmless), with the constants those nodes read.
Graph Part(const Graph& g, const std::vector<size_t>& nodes, const std::vector<int>& inputs,
           const std::vector<int>& outputs, const std::string& suffix) {
  Graph p;
  p.name = g.name + suffix;
  p.opset = g.opset;
  p.value_names = g.value_names;
  for (size_t i : nodes) {
    p.nodes.push_back(g.nodes[i]);
    for (int v : g.nodes[i].inputs) {
      auto c = g.constants.find(v);
      if (v >= 0 && c != g.constants.end()) p.constants.emplace(v, c->second);
    }
  }
  auto info_of = [](const std::vector<int>& ids, const std::vector<ValueInfo>& infos, int v,
                    const std::string& name) -> ValueInfo {
    for (size_t k = 0; k < ids.size() && k < infos.size(); ++k)
      if (ids[k] == v) return infos[k];
    ValueInfo info;
    info.name = name;
    return info;
  };
  for (int v : inputs) {
    p.inputs.push_back(v);
    p.input_infos.push_back(info_of(g.inputs, g.input_infos, v, g.value_names[v]));
  }
  for (int v : outputs) {
    p.outputs.push_back(v);
    p.output_infos.push_back(info_of(g.outputs, g.output_infos, v, g.value_names[v]));
  }
  p.Validate();
  return p;
}

// A node marked kOnHostAttr, other than an If, run on host tensors: its output shapes inferred from the values, which
// are all known now, and its reference kernel run.
std::vector<Tensor> RunOnHost(const Node& node, int opset, const std::vector<const Tensor*>& inputs) {
  const OpSchema* schema = OpRegistry::Get().Find(node.op_type);
  const ReferenceKernel kernel = FindReferenceKernel(node.op_type);
  if (schema == nullptr || !kernel)
    throw Error(ErrorCode::kUnsupported, node.Describe() + ": no host kernel for op " + node.op_type);
  InferContext ic{node, opset};
  for (const Tensor* t : inputs) {
    ic.present.push_back(t != nullptr);
    ic.input_dtypes.push_back(t ? t->dtype() : DType::kF32);
    ic.input_shapes.push_back(t ? t->shape() : Shape{});
    ic.input_values.push_back(t);
  }
  schema->infer(ic);
  OSPREY_CHECK(ic.output_shapes.size() >= node.outputs.size());
  // A few bytes of a value (Expand's shape, Tile's repeats) may ask for any size: bounded, as folding is.
  int64_t bytes = 0;
  for (size_t i = 0; i < node.outputs.size(); ++i)
    bytes = CheckedAdd(bytes, NumBytes(ic.output_dtypes[i], ic.output_shapes[i]), node.Describe());
  if (bytes > kMaxHostOutputBytes)
    throw Error(ErrorCode::kResourceExhausted,
                node.Describe() + ": the values of its inputs ask for " + std::to_string(bytes) + " bytes of output; " +
                    "osprey runs such a node, whose shapes follow values known only at run time, up to " +
                    std::to_string(kMaxHostOutputBytes >> 20) + " MiB");
  std::vector<Tensor> outs;
  for (size_t i = 0; i < node.outputs.size(); ++i) outs.emplace_back(ic.output_dtypes[i], ic.output_shapes[i]);
  // Outputs without elements have nothing to compute (as plans skip such steps: Step::no_output).
  if (std::all_of(outs.begin(), outs.end(), [](const Tensor& t) { return t.numel() == 0; })) return outs;
  KernelContext kc{node, opset};
  kc.inputs = inputs;
  for (Tensor& t : outs) kc.outputs.push_back(&t);
  kernel(kc);
  return outs;
}

// How a SpecializingRunner takes outer value `v` of `g` (`known`: StaticValues): compiled in by buffer when it is a
// constant, by value when it is known from shapes (small), else as an input.
char Fixed(const Graph& g, const std::vector<char>& known, int v) {
  if (v < 0) return 0;
  if (g.constants.count(v)) return SpecializingRunner::kConstant;
  return known[v];
}

// prefix -> the data-dependent node -> tail; values flow between them by the parent graph's value ids.
class SegmentedRunner final : public GraphRunner {
 public:
  SegmentedRunner(const Graph& g, const SharedPtr& shared) {
    const std::vector<char> known = StaticValues(g);  // values a part after the cut gets compiled in
    size_t d = 0;
    while (d < g.nodes.size() && !IsCut(g.nodes[d], known)) ++d;
    OSPREY_CHECK(d < g.nodes.size());
    cut_ = g.nodes[d];
    opset_ = g.opset;
    graph_inputs_ = g.inputs;
    graph_outputs_ = g.outputs;
    // The tail: every node that reads the cut node's outputs, or a tail node's (nodes are in topological order).
    std::vector<char> after(static_cast<size_t>(g.num_values()), 0), produced_before(after.size(), 0);
    for (int v : cut_.outputs)
      if (v >= 0) after[v] = 1;
    std::vector<size_t> prefix_nodes, tail_nodes;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      if (i == d) continue;
      bool downstream = false;
      for (int v : g.nodes[i].inputs) downstream = downstream || (v >= 0 && after[v]);
      if (downstream) {
        tail_nodes.push_back(i);
        for (int v : g.nodes[i].outputs)
          if (v >= 0) after[v] = 1;
      } else {
        prefix_nodes.push_back(i);
        for (int v : g.nodes[i].outputs)
          if (v >= 0) produced_before[v] = 1;
      }
    }
    std::unordered_set<int> graph_input_set(g.inputs.begin(), g.inputs.end());
    // What the prefix must hand on: the values the cut node, the tail and the graph's outputs read from it.
    std::vector<int> from_prefix;
    std::unordered_set<int> seen;
    auto need = [&](int v) {
      if (v >= 0 && produced_before[v] && seen.insert(v).second) from_prefix.push_back(v);
    };
    for (int v : cut_.inputs) need(v);
    std::vector<int> tail_inputs;
    std::unordered_set<int> tail_made, tail_seen;
    for (size_t i : tail_nodes) {
      for (int v : g.nodes[i].inputs) {
        need(v);
        if (v >= 0 && !tail_made.count(v) && !g.constants.count(v) && tail_seen.insert(v).second)
          tail_inputs.push_back(v);
      }
      for (int v : g.nodes[i].outputs) tail_made.insert(v);
    }
    std::vector<int> tail_outputs;
    for (int v : g.outputs) {
      need(v);
      if (tail_made.count(v) && std::find(tail_outputs.begin(), tail_outputs.end(), v) == tail_outputs.end())
        tail_outputs.push_back(v);
    }
    if (!from_prefix.empty()) {
      std::vector<int> inputs;
      std::unordered_set<int> read;
      for (size_t i : prefix_nodes)
        for (int v : g.nodes[i].inputs) read.insert(v);
      for (int v : g.inputs)
        if (read.count(v)) inputs.push_back(v);
      prefix_inputs_ = inputs;
      prefix_outputs_ = from_prefix;
      prefix_ = MakeRunner(Part(g, prefix_nodes, inputs, from_prefix, "/before " + cut_.name), shared);
    }
    if (!tail_outputs.empty()) {
      tail_inputs_ = tail_inputs;
      tail_outputs_ = tail_outputs;
      Graph tail = Part(g, tail_nodes, tail_inputs, tail_outputs, "/after " + cut_.name);
      std::vector<char> fixed;
      bool any = false;
      for (int v : tail_inputs) {
        fixed.push_back(known[v]);
        any = any || known[v];
      }
      if (any)
        tail_ = std::make_unique<SpecializingRunner>(std::move(tail), std::move(fixed), shared);
      else
        tail_ = MakeRunner(std::move(tail), shared);
    }
    for (int v : cut_.inputs)
      if (v >= 0 && g.constants.count(v)) constants_.emplace(v, g.constants.at(v));
    if (cut_.op_type == "Loop") {
      // The body's inputs are (iteration, condition, carried..., captured...), as the node's after its first two.
      CheckLoopNode(cut_);
      Graph body = *cut_.attrs.at("body").g;
      body.opset = g.opset;
      body.name = g.name + "/" + cut_.name + "/body";
      carried_ = static_cast<size_t>(cut_.attrs.at(kLoopCarriedAttr).i);
      body_nodes_ = std::max<int64_t>(1, UnrolledNodes(body));
      body_outputs_ = body.output_infos;
      // Compiled in: the captured outer values known from shapes or constants. The iteration number, the condition
      // and the carried values stay inputs, one plan for every iteration (SLANet's 500-step decoder reads its step
      // as a ScatterElements index); a node a shape of which needs one of them (tf.map_fn's body slices its element
      // at a counter it carries) runs on the host between parts of the body (InsteadOf).
      // A carried value the body passes on unchanged (paddle2onnx carries the decoder's weights) is a captured one.
      std::vector<char> fixed(2 + carried_, 0);
      passed_on_.assign(carried_, 0);
      for (size_t k = 0; k < carried_ && 2 + k < body.inputs.size() && 1 + k < body.outputs.size(); ++k)
        if (body.inputs[2 + k] == body.outputs[1 + k]) {
          passed_on_[k] = 1;
          fixed[2 + k] = Fixed(g, known, cut_.inputs[2 + k]);
        }
      for (size_t k = 2 + carried_; k < cut_.inputs.size(); ++k) fixed.push_back(Fixed(g, known, cut_.inputs[k]));
      HoistInvariants(body, fixed, shared);
      body_ = std::make_unique<SpecializingRunner>(std::move(body), std::move(fixed), shared, kMaxSpecialized);
    }
    if (cut_.op_type == "If") {
      // Each branch is a graph whose inputs are the If's inputs after the condition (the outer values it reads).
      for (int b = 0; b < 2; ++b) {
        auto it = cut_.attrs.find(b == 0 ? "then_branch" : "else_branch");
        if (it == cut_.attrs.end() || !it->second.g)
          throw Error(ErrorCode::kInvalidArgument, cut_.Describe() + ": a branch is missing");
        Graph branch = *it->second.g;
        branch.opset = g.opset;
        branch.name = g.name + "/" + cut_.name + (b == 0 ? "/then" : "/else");
        // The outer values it reads that are known from shapes or constants are compiled in, as for a tail.
        std::vector<char> fixed;
        for (size_t k = 1; k < cut_.inputs.size(); ++k) fixed.push_back(Fixed(g, known, cut_.inputs[k]));
        branches_[b] = std::make_unique<SpecializingRunner>(std::move(branch), std::move(fixed), shared);
      }
    }
    for (int v : g.outputs)
      if (g.constants.count(v)) constants_.emplace(v, g.constants.at(v));
  }

  std::vector<Tensor> Run(const std::vector<Tensor>& inputs, const CompileOptions& options,
                          std::vector<OpProfile>* profile) override {
    std::unordered_map<int, Tensor> env;
    for (size_t i = 0; i < graph_inputs_.size() && i < inputs.size(); ++i) env[graph_inputs_[i]] = inputs[i];
    auto get = [&](int v) -> const Tensor& {
      auto it = env.find(v);
      if (it != env.end()) return it->second;
      auto c = constants_.find(v);
      OSPREY_CHECK(c != constants_.end());
      return c->second;
    };
    auto gather = [&](const std::vector<int>& ids) {
      std::vector<Tensor> ts;
      for (int v : ids) ts.push_back(get(v));
      return ts;
    };
    if (prefix_) {
      std::vector<Tensor> outs = prefix_->Run(gather(prefix_inputs_), options, profile);
      for (size_t k = 0; k < outs.size(); ++k) env[prefix_outputs_[k]] = std::move(outs[k]);
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Tensor> made;
    if (cut_.op_type == "If") {
      OSPREY_CHECK(!cut_.inputs.empty() && cut_.inputs[0] >= 0);
      const bool taken = ConditionValue(cut_, get(cut_.inputs[0]), "the condition");
      std::vector<Tensor> branch_inputs;
      for (size_t k = 1; k < cut_.inputs.size(); ++k) branch_inputs.push_back(get(cut_.inputs[k]));
      made = branches_[taken ? 0 : 1]->Run(branch_inputs, options, profile);
    } else if (cut_.op_type == "Loop") {
      made = RunLoop(get, options, profile);
    } else {
      std::vector<const Tensor*> cut_inputs;
      for (int v : cut_.inputs) cut_inputs.push_back(v >= 0 ? &get(v) : nullptr);
      made =
          IsDataDependentOp(cut_) ? RunDataDependentOp(cut_, opset_, cut_inputs) : RunOnHost(cut_, opset_, cut_inputs);
    }
    if (profile && cut_.op_type != "If" && cut_.op_type != "Loop")
      profile->push_back({cut_.name, cut_.op_type, "DataDependentOnHost",
                          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()});
    for (size_t k = 0; k < made.size() && k < cut_.outputs.size(); ++k)
      if (cut_.outputs[k] >= 0) env[cut_.outputs[k]] = std::move(made[k]);
    if (tail_) {
      std::vector<Tensor> outs = tail_->Run(gather(tail_inputs_), options, profile);
      for (size_t k = 0; k < outs.size(); ++k) env[tail_outputs_[k]] = std::move(outs[k]);
    }
    return gather(graph_outputs_);
  }

  std::shared_ptr<const Plan> FirstPlan(const std::vector<Tensor>& inputs, const CompileOptions& options) override {
    if (!prefix_) return nullptr;
    std::vector<Tensor> ts;
    for (int v : prefix_inputs_)
      for (size_t i = 0; i < graph_inputs_.size(); ++i)
        if (graph_inputs_[i] == v && i < inputs.size()) ts.push_back(inputs[i]);
    return prefix_->FirstPlan(ts, options);
  }

  void ForEachCache(const std::function<void(PlanCache&)>& f) override {
    if (prefix_) prefix_->ForEachCache(f);
    for (auto& b : branches_)
      if (b) b->ForEachCache(f);
    if (body_) body_->ForEachCache(f);
    if (invariant_) invariant_->ForEachCache(f);
    if (tail_) tail_->ForEachCache(f);
  }

 private:
  // Moves the loop-invariant nodes of `body` (a cut Loop's; `fixed`: its runner's flags, passed_on_ set) into
  // invariant_, run once per loop before the first iteration (SLANet's projection of the encoder features: 21% of its
  // time when run per step): nodes without subgraphs, neither random nor data-dependent, reading only constants, the
  // captured and passed-on inputs and other such nodes' results, at least one of them a value known only at run time
  // (nodes on constants and shapes alone stay in the body, which folds them). Their results that the rest of the body
  // reads become body inputs after the captured ones.
  void HoistInvariants(Graph& body, std::vector<char>& fixed, const SharedPtr& shared) {
    const size_t values = static_cast<size_t>(body.num_values());
    std::vector<char> invariant(values, 0), runtime(values, 0), inputs_known(body.inputs.size(), 0);
    for (size_t k = 2; k < body.inputs.size() && k < fixed.size(); ++k) {
      inputs_known[k] = fixed[k] != 0;
      if (k < 2 + carried_ && !passed_on_[k - 2]) continue;
      invariant[body.inputs[k]] = 1;
      runtime[body.inputs[k]] = fixed[k] == 0;
    }
    for (const auto& [id, t] : body.constants) invariant[id] = 1;
    const std::vector<char> known = StaticValues(body, inputs_known);
    std::vector<size_t> moved;
    std::vector<char> moved_value(values, 0), made_here(values, 0);
    for (size_t i = 0; i < body.nodes.size(); ++i) {
      const Node& n = body.nodes[i];
      bool ok = !IsDataDependentOp(n) && !n.attrs.count(kOnHostAttr) && n.op_type.rfind("Random", 0) != 0 &&
                n.op_type != "Multinomial" && n.op_type != "Bernoulli" && n.op_type != "Dropout";
      for (const auto& [key, attr] : n.attrs) ok = ok && attr.kind != Attribute::Kind::kGraph;
      bool reads_runtime = false, outputs_known = !n.outputs.empty();
      for (int v : n.inputs) {
        if (v < 0) continue;
        ok = ok && invariant[v] && (!made_here[v] || moved_value[v]);  // a body node's result stays in the body
        reads_runtime = reads_runtime || runtime[v];
      }
      for (int v : n.outputs) outputs_known = outputs_known && v >= 0 && known[v];
      for (int v : n.outputs)
        if (v >= 0) made_here[v] = 1;
      if (!ok || !reads_runtime || outputs_known) continue;
      moved.push_back(i);
      for (int v : n.outputs)
        if (v >= 0) invariant[v] = runtime[v] = moved_value[v] = 1;
    }
    if (moved.empty()) return;
    std::vector<char> read(values, 0), read_by_moved(values, 0);
    std::vector<Node> kept;
    for (size_t i = 0, m = 0; i < body.nodes.size(); ++i) {
      const bool is_moved = m < moved.size() && moved[m] == i;
      m += is_moved;
      for (int v : body.nodes[i].inputs)
        if (v >= 0) (is_moved ? read_by_moved : read)[v] = 1;
      if (!is_moved) kept.push_back(body.nodes[i]);
    }
    for (int v : body.outputs) read[v] = 1;
    std::vector<int> inputs, outputs;
    for (size_t k = 2; k < body.inputs.size(); ++k)
      if (read_by_moved[body.inputs[k]]) {
        inputs.push_back(body.inputs[k]);
        invariant_inputs_.push_back(static_cast<int>(k));  // the Loop node's input k is the body's input k
      }
    for (size_t i : moved)
      for (int v : body.nodes[i].outputs)
        if (v >= 0 && read[v]) outputs.push_back(v);
    if (outputs.empty()) {
      invariant_inputs_.clear();
      return;
    }
    Graph part = Part(body, moved, inputs, outputs, "/invariant");
    std::vector<char> part_fixed;
    for (int k : invariant_inputs_) part_fixed.push_back(fixed[k]);
    invariant_ = std::make_unique<SpecializingRunner>(std::move(part), std::move(part_fixed), shared);
    body.nodes = std::move(kept);
    for (int v : outputs) {
      body.inputs.push_back(v);
      ValueInfo info;
      info.name = body.value_names[v];
      body.input_infos.push_back(info);
      fixed.push_back(0);
    }
    body.Validate();
  }

  // A cut Loop on the host: the body once per iteration while the trip count (if given) and the condition (if
  // given) allow, at most kMaxLoopIterations; carried values passed on, each scan output's iterations stacked.
  template <class Get>
  std::vector<Tensor> RunLoop(const Get& get, const CompileOptions& options, std::vector<OpProfile>* profile) {
    int64_t trips = -1;  // -1: no trip count
    if (cut_.inputs[0] >= 0) {
      const Tensor& m = get(cut_.inputs[0]);
      if (m.numel() != 1 || m.dtype() != DType::kI64)
        throw Error(ErrorCode::kInvalidArgument, cut_.Describe() + ": the trip count must be one int64");
      trips = std::max<int64_t>(0, m.data<int64_t>()[0]);
    }
    bool cond = cut_.inputs[1] < 0 || ConditionValue(cut_, get(cut_.inputs[1]), "the condition");
    if (trips < 0 && cut_.inputs[1] < 0)
      throw Error(ErrorCode::kInvalidArgument,
                  cut_.Describe() + ": neither a trip count nor a condition: the loop would never end");
    std::vector<Tensor> carried;
    for (size_t k = 0; k < carried_; ++k) carried.push_back(get(cut_.inputs[2 + k]));
    std::vector<Tensor> captured;
    for (size_t k = 2 + carried_; k < cut_.inputs.size(); ++k) captured.push_back(get(cut_.inputs[k]));
    bool hoisted = false;  // the loop-invariant part's results, computed before the first iteration
    const size_t scans = cut_.outputs.size() - carried_;
    std::vector<std::vector<Tensor>> scanned(scans);
    // The budget of an unrolled loop (each iteration may compile a body of its own): iterations x body nodes, and
    // iterations alone; refused before the first iteration when the trip count says so.
    auto over = [&](int64_t iterations) {
      return iterations > kMaxLoopIterations || iterations * body_nodes_ > kMaxLoopNodes;
    };
    auto refuse = [&](int64_t iterations) {
      throw Error(ErrorCode::kUnsupported, cut_.Describe() + ": " + std::to_string(iterations) +
                                               " iterations of a body of " + std::to_string(body_nodes_) +
                                               " nodes: more than osprey runs for one loop (" +
                                               std::to_string(kMaxLoopIterations) + " iterations, " +
                                               std::to_string(kMaxLoopNodes) + " iterations x nodes)");
    };
    if (trips > 0 && cond && over(trips)) refuse(trips);
    for (int64_t i = 0; (trips < 0 || i < trips) && cond; ++i) {
      if (over(i + 1)) refuse(i + 1);
      if (invariant_ && !hoisted) {
        std::vector<Tensor> invariant_in;
        for (int k : invariant_inputs_) invariant_in.push_back(get(cut_.inputs[k]));
        std::vector<Tensor> results = invariant_->Run(invariant_in, options, profile);
        captured.insert(captured.end(), results.begin(), results.end());
        hoisted = true;
      }
      std::vector<Tensor> in{Tensor::Scalar<int64_t>(i), Tensor::Scalar<bool>(cond)};
      in.insert(in.end(), carried.begin(), carried.end());
      in.insert(in.end(), captured.begin(), captured.end());
      std::vector<Tensor> out = body_->Run(in, options, profile);
      if (out.size() != 1 + carried_ + scans)
        throw Error(ErrorCode::kInvalidArgument, cut_.Describe() + ": the body gave " + std::to_string(out.size()) +
                                                     " outputs, expected " + std::to_string(1 + carried_ + scans));
      for (size_t k = 0; k < out.size() && k < body_outputs_.size(); ++k)
        CheckDeclaredType(body_outputs_[k], out[k].dtype(), cut_.Describe() + ": the body's");
      for (size_t k = 0; k < carried_; ++k)
        if (out[1 + k].dtype() != carried[k].dtype())
          throw Error(ErrorCode::kInvalidArgument, cut_.Describe() + ": carried value " + std::to_string(k) +
                                                       " enters the body as " + DTypeName(carried[k].dtype()) +
                                                       " and leaves it as " + DTypeName(out[1 + k].dtype()) +
                                                       " (a loop-carried value keeps one type)");
      cond = ConditionValue(cut_, out[0], "the body's condition");
      for (size_t k = 0; k < carried_; ++k)
        if (!passed_on_[k]) carried[k] = std::move(out[1 + k]);
      for (size_t k = 0; k < scans; ++k) scanned[k].push_back(std::move(out[1 + carried_ + k]));
    }
    std::vector<Tensor> made = std::move(carried);
    for (size_t k = 0; k < scans; ++k) made.push_back(StackScan(k, scanned[k]));
    return made;
  }

  // Scan output k: its iterations' values stacked on a new first axis (all of one type and shape, as ONNX requires).
  Tensor StackScan(size_t k, const std::vector<Tensor>& parts) const {
    if (parts.empty()) {  // [0] and the shape the body declares for it, when it declares every dim
      const size_t out = 1 + carried_ + k;
      Shape shape{0};
      if (out >= body_outputs_.size()) return Tensor(DType::kF32, shape);
      const ValueInfo& info = body_outputs_[out];
      for (const Dim& d : info.dims) shape.push_back(d.value);
      if (!info.has_shape || std::any_of(info.dims.begin(), info.dims.end(), [](const Dim& d) { return d.value < 0; }))
        shape = {0};
      return Tensor(info.dtype, shape);
    }
    Shape shape = parts[0].shape();
    for (const Tensor& t : parts)
      if (t.shape() != shape || t.dtype() != parts[0].dtype())
        throw Error(ErrorCode::kInvalidArgument,
                    cut_.Describe() + ": scan output " + std::to_string(k) + " is " + DTypeName(t.dtype()) + " " +
                        ShapeToString(t.shape()) + " in one iteration and " + DTypeName(parts[0].dtype()) + " " +
                        ShapeToString(shape) + " in the first (each iteration must give one type and shape)");
    shape.insert(shape.begin(), static_cast<int64_t>(parts.size()));
    Tensor stacked(parts[0].dtype(), shape);
    char* dst = static_cast<char*>(stacked.raw());
    for (const Tensor& t : parts) {
      std::memcpy(dst, t.raw(), t.nbytes());
      dst += t.nbytes();
    }
    return stacked;
  }

  Node cut_;
  int opset_ = 17;
  std::vector<int> graph_inputs_, graph_outputs_;
  std::unordered_map<int, Tensor> constants_;  // read by the cut node or given as graph outputs
  std::unique_ptr<GraphRunner> prefix_, tail_;
  std::unique_ptr<GraphRunner> branches_[2];  // a cut If: then, else
  std::unique_ptr<GraphRunner> body_;         // a cut Loop
  size_t carried_ = 0;                        // a cut Loop's carried values
  std::vector<char> passed_on_;               // per carried value: the body passes it on unchanged
  std::unique_ptr<GraphRunner> invariant_;    // a cut Loop's loop-invariant nodes (HoistInvariants)
  std::vector<int> invariant_inputs_;         // their inputs: indices of the Loop node's inputs
  int64_t body_nodes_ = 1;                    // its body's nodes, nested loops unrolled (UnrolledNodes)
  std::vector<ValueInfo> body_outputs_;       // declared: for a scan output of zero iterations
  std::vector<int> prefix_inputs_, prefix_outputs_, tail_inputs_, tail_outputs_;
};

}  // namespace

bool HasDataDependentOps(const Graph& graph) { return HoldsCut(graph); }

namespace {
// Each cut nests one runner in the next and copies the graph's value table: bound both (torchvision's SSDlite has 181
// cuts in 5,000 values), so a hostile model cannot buy unbounded recursion or memory.
void CheckCuts(const Graph& graph) {
  const int64_t cuts = CountCuts(graph);
  if (cuts > kMaxCuts || cuts * graph.num_values() > kMaxCutValues)
    throw Error(ErrorCode::kUnsupported, graph.name + ": " + std::to_string(cuts) +
                                             " data-dependent ops (NonZero, NonMaxSuppression, Ifs "
                                             "whose branches give different shapes, ...) in a graph of " +
                                             std::to_string(graph.num_values()) +
                                             " values: more than osprey cuts a model at (" + std::to_string(kMaxCuts) +
                                             " cuts, " + std::to_string(kMaxCutValues) + " cuts x values)");
}

std::unique_ptr<GraphRunner> MakeCutRunner(const Graph& graph, const SharedPtr& shared) {
  return std::make_unique<SegmentedRunner>(graph, shared);
}

SharedPtr MakeShared(size_t plan_cache_capacity, WeightStore* weights, std::shared_ptr<MemoryAccount> account) {
  auto shared = std::make_shared<Shared>();
  shared->capacity = plan_cache_capacity;
  shared->weights = weights;
  shared->account = std::move(account);
  return shared;
}
}  // namespace

std::unique_ptr<GraphRunner> MakeSegmentedRunner(const Graph& graph, size_t plan_cache_capacity, WeightStore* weights,
                                                 std::shared_ptr<MemoryAccount> account) {
  CheckCuts(graph);
  return MakeCutRunner(graph, MakeShared(plan_cache_capacity, weights, std::move(account)));
}

std::unique_ptr<GraphRunner> MakeRunnerInsteadOf(const Graph& graph, const Error& e, size_t plan_cache_capacity,
                                                 WeightStore* weights, std::shared_ptr<MemoryAccount> account) {
  return InsteadOf(graph, e, MakeShared(plan_cache_capacity, weights, std::move(account)));
}

}  // namespace osprey
