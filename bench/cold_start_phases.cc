// Cold start of one model in this (fresh) process, by phase: what `osprey bench`'s load and first run are made of.
//
//   osprey_cold_start MODEL.onnx [--threads T] [--batch B] [--warm N] [--second-batch B2] [--json]
//
// Phases are timed without touching the engine's code: the linker wraps the functions at the phase boundaries
// (-Wl,--wrap=<mangled name>, see CMakeLists.txt), so compile.cc's own Compile() runs, and its internal steps are read
// off the calls it makes:
//   load        LoadOnnxModel: strip (onnx_wire::StripInitializerData: the model's structure without its weights'
//               bytes) + protobuf parse (MessageLite::ParseFrom*) + import (TensorFromProto: the initializer copies;
//               the rest: mapping the file, nodes, sort, ValidateOps)
//   model       Model(graph): Validate + ValidateOps, Graph::ContentDigest (hashes every weight, once),
//               WeightStore::InternOwned / Intern (stores each weight: adopts the imported buffer or copies it),
//               Graph::Fingerprint (from the digests; the older code hashed every weight here again)
//   compile     Compile(): validate (Graph::Validate, ValidateOps) -> infer-and-fold (up to RunFusionPasses) ->
//               fusion (RunFusionPasses) -> layout (AssignLayouts, of which nhwc_query = CpuKernelSupportsNhwc, which
//               builds oneDNN primitive descriptors) -> kernels (AssignLayouts' end to Compile's end: kernel creation
//               and the memory plan; kernel_calls = the summed time inside CreateCpuKernel / CreateElementwiseKernel /
//               CreateLayoutReorderKernel, pack = inside cpu::PackWeight)
//   first_exec  the first Plan::Run (arena, page faults, oneDNN's first executions)
//   warm        median of N more runs
//   second.*    with --second-batch: a second plan (batch B2) compiled and run in the now warm process, which shows how
//               much of first_exec - warm each new plan pays again (arena pages, new primitives' first run)
// first_run_ms = compile + first_exec (+ input checks): what `osprey bench --json` reports as first_run_ms.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dnnl_common.h"
#include "osprey/onnx.h"
#include "osprey/runtime.h"
#include "runtime/plan_impl.h"

namespace google::protobuf {
namespace io {
class ZeroCopyInputStream;
}
class MessageLite;
}  // namespace google::protobuf

using namespace osprey;
using Clock = std::chrono::steady_clock;

namespace {

double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

// Summed milliseconds per wrapped function (several threads may call them at once).
struct Totals {
  std::mutex mu;
  std::map<std::string, double> ms;
  std::map<std::string, int> calls;
  void Add(const std::string& key, double v) {
    std::lock_guard<std::mutex> lock(mu);
    ms[key] += v;
    calls[key] += 1;
  }
  double Get(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = ms.find(key);
    return it == ms.end() ? 0.0 : it->second;
  }
  void Clear() {
    std::lock_guard<std::mutex> lock(mu);
    ms.clear();
    calls.clear();
  }
};
Totals g_totals;

// Time points of the last Compile: its start and end, and RunFusionPasses' / AssignLayouts' starts and ends.
struct CompileMarks {
  Clock::time_point start, end, fusion_start, fusion_end, layout_start, layout_end;
  bool fused = false, laid_out = false;
};
CompileMarks g_marks;

template <class F>
auto Timed(const char* key, F&& f) {
  const auto t0 = Clock::now();
  struct Done {
    const char* key;
    Clock::time_point t0;
    ~Done() { g_totals.Add(key, Ms(t0, Clock::now())); }
  } done{key, t0};
  return f();
}

}  // namespace

// The wrapped functions: __real_X is the engine's own; __wrap_X is what its callers in other object files now call.
extern "C" {
std::shared_ptr<const Plan>
__real__ZN6osprey7CompileERKNS_5GraphERKSt6vectorINS_10TensorSpecESaIS4_EERKNS_14CompileOptionsEPNS_11WeightStoreESt10shared_ptrINS_13MemoryAccountEE(
    const Graph&, const std::vector<TensorSpec>&, const CompileOptions&, WeightStore*, std::shared_ptr<MemoryAccount>);
std::shared_ptr<const Plan>
__wrap__ZN6osprey7CompileERKNS_5GraphERKSt6vectorINS_10TensorSpecESaIS4_EERKNS_14CompileOptionsEPNS_11WeightStoreESt10shared_ptrINS_13MemoryAccountEE(
    const Graph& g, const std::vector<TensorSpec>& in, const CompileOptions& o, WeightStore* w,
    std::shared_ptr<MemoryAccount> a) {
  g_marks = CompileMarks{};
  g_marks.start = Clock::now();
  auto plan =
      __real__ZN6osprey7CompileERKNS_5GraphERKSt6vectorINS_10TensorSpecESaIS4_EERKNS_14CompileOptionsEPNS_11WeightStoreESt10shared_ptrINS_13MemoryAccountEE(
          g, in, o, w, std::move(a));
  g_marks.end = Clock::now();
  return plan;
}

void __real__ZN6osprey11ValidateOpsERKNS_5GraphE(const Graph&);
void __wrap__ZN6osprey11ValidateOpsERKNS_5GraphE(const Graph& g) {
  Timed("ValidateOps", [&] { __real__ZN6osprey11ValidateOpsERKNS_5GraphE(g); });
}

void __real__ZNK6osprey5Graph8ValidateEv(const Graph*);
void __wrap__ZNK6osprey5Graph8ValidateEv(const Graph* g) {
  Timed("Graph::Validate", [&] { __real__ZNK6osprey5Graph8ValidateEv(g); });
}

void __real__ZN6osprey15RunFusionPassesERNS_12CompileStateE(CompileState&);
void __wrap__ZN6osprey15RunFusionPassesERNS_12CompileStateE(CompileState& st) {
  g_marks.fusion_start = Clock::now();
  __real__ZN6osprey15RunFusionPassesERNS_12CompileStateE(st);
  g_marks.fusion_end = Clock::now();
  g_marks.fused = true;
}

void __real__ZN6osprey13AssignLayoutsERNS_12CompileStateERKSt8functionIFbiEEb(CompileState&,
                                                                              const std::function<bool(int)>&, bool);
void __wrap__ZN6osprey13AssignLayoutsERNS_12CompileStateERKSt8functionIFbiEEb(CompileState& st,
                                                                              const std::function<bool(int)>& f,
                                                                              bool rank5) {
  g_marks.layout_start = Clock::now();
  __real__ZN6osprey13AssignLayoutsERNS_12CompileStateERKSt8functionIFbiEEb(st, f, rank5);
  g_marks.layout_end = Clock::now();
  g_marks.laid_out = true;
}

bool __real__ZN6osprey21CpuKernelSupportsNhwcERKNS_18KernelBuildContextE(const KernelBuildContext&);
bool __wrap__ZN6osprey21CpuKernelSupportsNhwcERKNS_18KernelBuildContextE(const KernelBuildContext& c) {
  return Timed("CpuKernelSupportsNhwc",
               [&] { return __real__ZN6osprey21CpuKernelSupportsNhwcERKNS_18KernelBuildContextE(c); });
}

std::unique_ptr<Kernel> __real__ZN6osprey15CreateCpuKernelERKNS_18KernelBuildContextE(const KernelBuildContext&);
std::unique_ptr<Kernel> __wrap__ZN6osprey15CreateCpuKernelERKNS_18KernelBuildContextE(const KernelBuildContext& c) {
  return Timed("CreateCpuKernel", [&] { return __real__ZN6osprey15CreateCpuKernelERKNS_18KernelBuildContextE(c); });
}

std::unique_ptr<Kernel> __real__ZN6osprey23CreateElementwiseKernelERKNS_18KernelBuildContextE(
    const KernelBuildContext&);
std::unique_ptr<Kernel> __wrap__ZN6osprey23CreateElementwiseKernelERKNS_18KernelBuildContextE(
    const KernelBuildContext& c) {
  return Timed("CreateElementwiseKernel",
               [&] { return __real__ZN6osprey23CreateElementwiseKernelERKNS_18KernelBuildContextE(c); });
}

std::unique_ptr<Kernel> __real__ZN6osprey25CreateLayoutReorderKernelERKSt6vectorIlSaIlEENS_6LayoutES5_i(
    const Shape&, Layout, Layout, int);
std::unique_ptr<Kernel> __wrap__ZN6osprey25CreateLayoutReorderKernelERKSt6vectorIlSaIlEENS_6LayoutES5_i(
    const Shape& s, Layout a, Layout b, int n) {
  return Timed("CreateLayoutReorderKernel", [&] {
    return __real__ZN6osprey25CreateLayoutReorderKernelERKSt6vectorIlSaIlEENS_6LayoutES5_i(s, a, b, n);
  });
}

cpu::PackedWeight __real__ZN6osprey3cpu10PackWeightERKNS_18KernelBuildContextERKN4dnnl6memory4descERKNS_6TensorES8_f(
    const KernelBuildContext&, const dnnl::memory::desc&, const Tensor&, const dnnl::memory::desc&, float);
cpu::PackedWeight __wrap__ZN6osprey3cpu10PackWeightERKNS_18KernelBuildContextERKN4dnnl6memory4descERKNS_6TensorES8_f(
    const KernelBuildContext& c, const dnnl::memory::desc& from, const Tensor& t, const dnnl::memory::desc& to,
    float scale) {
  return Timed("PackWeight", [&] {
    return __real__ZN6osprey3cpu10PackWeightERKNS_18KernelBuildContextERKN4dnnl6memory4descERKNS_6TensorES8_f(
        c, from, t, to, scale);
  });
}

Tensor __real__ZN6osprey11WeightStore6InternERKNS_6TensorE(WeightStore*, const Tensor&);
Tensor __wrap__ZN6osprey11WeightStore6InternERKNS_6TensorE(WeightStore* s, const Tensor& t) {
  return Timed("WeightStore::Intern", [&] { return __real__ZN6osprey11WeightStore6InternERKNS_6TensorE(s, t); });
}

std::string __real__ZNK6osprey5Graph11FingerprintB5cxx11Ev(const Graph*);
std::string __wrap__ZNK6osprey5Graph11FingerprintB5cxx11Ev(const Graph* g) {
  return Timed("Graph::Fingerprint", [&] { return __real__ZNK6osprey5Graph11FingerprintB5cxx11Ev(g); });
}

Tensor __real__ZN6osprey15TensorFromProtoERKN4onnx11TensorProtoERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEESB_PKSt17basic_string_viewIcS7_E(
    const void*, const std::string&, const std::string&, const std::string_view*);
Tensor __wrap__ZN6osprey15TensorFromProtoERKN4onnx11TensorProtoERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEESB_PKSt17basic_string_viewIcS7_E(
    const void* tp, const std::string& dir, const std::string& what, const std::string_view* raw) {
  return Timed("TensorFromProto", [&] {
    return __real__ZN6osprey15TensorFromProtoERKN4onnx11TensorProtoERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEESB_PKSt17basic_string_viewIcS7_E(
        tp, dir, what, raw);
  });
}

Tensor __real__ZN6osprey11WeightStore11InternOwnedENS_6TensorERKSt5arrayImLm2EE(WeightStore*, Tensor,
                                                                                const std::array<uint64_t, 2>&);
Tensor __wrap__ZN6osprey11WeightStore11InternOwnedENS_6TensorERKSt5arrayImLm2EE(WeightStore* s, Tensor t,
                                                                                const std::array<uint64_t, 2>& d) {
  return Timed("WeightStore::Intern",
               [&] { return __real__ZN6osprey11WeightStore11InternOwnedENS_6TensorERKSt5arrayImLm2EE(s, std::move(t), d); });
}

Graph::Digest __real__ZN6osprey5Graph13ContentDigestERKNS_6TensorE(const Tensor&);
Graph::Digest __wrap__ZN6osprey5Graph13ContentDigestERKNS_6TensorE(const Tensor& t) {
  return Timed("Graph::ContentDigest", [&] { return __real__ZN6osprey5Graph13ContentDigestERKNS_6TensorE(t); });
}

std::string
__real__ZNK6osprey5Graph11FingerprintB5cxx11ERKSt13unordered_mapIiSt5arrayImLm2EESt4hashIiESt8equal_toIiESaISt4pairIKiS3_EEE(
    const Graph*, const std::unordered_map<int, Graph::Digest>&);
std::string
__wrap__ZNK6osprey5Graph11FingerprintB5cxx11ERKSt13unordered_mapIiSt5arrayImLm2EESt4hashIiESt8equal_toIiESaISt4pairIKiS3_EEE(
    const Graph* g, const std::unordered_map<int, Graph::Digest>& d) {
  return Timed("Graph::Fingerprint", [&] {
    return __real__ZNK6osprey5Graph11FingerprintB5cxx11ERKSt13unordered_mapIiSt5arrayImLm2EESt4hashIiESt8equal_toIiESaISt4pairIKiS3_EEE(
        g, d);
  });
}

bool __real__ZN6google8protobuf11MessageLite23ParseFromZeroCopyStreamEPNS0_2io19ZeroCopyInputStreamE(
    google::protobuf::MessageLite*, google::protobuf::io::ZeroCopyInputStream*);
bool __wrap__ZN6google8protobuf11MessageLite23ParseFromZeroCopyStreamEPNS0_2io19ZeroCopyInputStreamE(
    google::protobuf::MessageLite* m, google::protobuf::io::ZeroCopyInputStream* s) {
  return Timed("protobuf parse", [&] {
    return __real__ZN6google8protobuf11MessageLite23ParseFromZeroCopyStreamEPNS0_2io19ZeroCopyInputStreamE(m, s);
  });
}

bool __real__ZN6google8protobuf11MessageLite15ParseFromStringERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE(
    google::protobuf::MessageLite*, const std::string&);
bool __wrap__ZN6google8protobuf11MessageLite15ParseFromStringERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE(
    google::protobuf::MessageLite* m, const std::string& s) {
  return Timed("protobuf parse", [&] {
    return __real__ZN6google8protobuf11MessageLite15ParseFromStringERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE(
        m, s);
  });
}

bool __real__ZN6osprey9onnx_wire20StripInitializerDataEPKcmPNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEPSt6vectorINS0_7RawSpanESaISB_EE(
    const char*, size_t, std::string*, void*);
bool __wrap__ZN6osprey9onnx_wire20StripInitializerDataEPKcmPNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEPSt6vectorINS0_7RawSpanESaISB_EE(
    const char* d, size_t n, std::string* out, void* spans) {
  return Timed("strip", [&] {
    return __real__ZN6osprey9onnx_wire20StripInitializerDataEPKcmPNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEPSt6vectorINS0_7RawSpanESaISB_EE(
        d, n, out, spans);
  });
}

bool __real__ZN6google8protobuf11MessageLite14ParseFromArrayEPKvi(google::protobuf::MessageLite*, const void*, int);
bool __wrap__ZN6google8protobuf11MessageLite14ParseFromArrayEPKvi(google::protobuf::MessageLite* m, const void* d,
                                                                    int n) {
  return Timed("protobuf parse",
               [&] { return __real__ZN6google8protobuf11MessageLite14ParseFromArrayEPKvi(m, d, n); });
}
}  // extern "C"

namespace {

std::map<std::string, Tensor> Inputs(const Graph& graph, int64_t batch) {
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  std::map<std::string, Tensor> inputs;
  for (const ValueInfo& vi : graph.input_infos) {
    Shape shape;
    for (size_t d = 0; d < vi.dims.size(); ++d) shape.push_back(vi.dims[d].value >= 0 ? vi.dims[d].value : batch);
    Tensor t(vi.dtype, shape);
    if (vi.dtype == DType::kF32)
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
    else
      std::memset(t.raw(), 0, t.nbytes());
    inputs.emplace(vi.name, std::move(t));
  }
  return inputs;
}

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Cold start of one model by phase (load, model, compile, first run), in this fresh process"};
  std::string model_path;
  int threads = 0, warm = 5;
  int64_t batch = 1;
  bool json = false;
  int64_t second_batch = 0;
  app.add_option("model", model_path, "ONNX model file")->required();
  app.add_option("--second-batch", second_batch, "then compile and run a second plan for this batch size (0: none)");
  app.add_option("--threads", threads, "intra-op threads (0 = all cores)");
  app.add_option("--batch", batch, "batch size for symbolic leading dims");
  app.add_option("--warm", warm, "warm runs after the first (median reported)");
  app.add_flag("--json", json, "one JSON object on stdout");
  CLI11_PARSE(app, argc, argv);

  std::vector<std::pair<std::string, double>> out;  // ordered fields
  const auto t_load = Clock::now();
  Graph graph = LoadOnnxModel(model_path);
  const auto t_loaded = Clock::now();
  out.emplace_back("load_ms", Ms(t_load, t_loaded));
  out.emplace_back("load.strip_ms", g_totals.Get("strip"));
  out.emplace_back("load.parse_ms", g_totals.Get("protobuf parse"));
  out.emplace_back("load.tensors_ms", g_totals.Get("TensorFromProto"));
  out.emplace_back("load.validate_ms", g_totals.Get("ValidateOps") + g_totals.Get("Graph::Validate"));
  g_totals.Clear();

  std::map<std::string, Tensor> inputs = Inputs(graph, batch);
  ModelOptions options;
  options.compile.num_threads = threads;
  const auto t_model = Clock::now();
  Model model(std::move(graph), options);
  const auto t_modeled = Clock::now();
  out.emplace_back("model_ms", Ms(t_model, t_modeled));
  out.emplace_back("model.validate_ms", g_totals.Get("ValidateOps") + g_totals.Get("Graph::Validate"));
  out.emplace_back("model.fingerprint_ms", g_totals.Get("Graph::Fingerprint"));
  out.emplace_back("model.hash_ms", g_totals.Get("Graph::ContentDigest"));
  out.emplace_back("model.intern_ms", g_totals.Get("WeightStore::Intern"));
  g_totals.Clear();

  const auto t_first = Clock::now();
  model.Run(inputs);
  const auto t_firsted = Clock::now();
  const CompileMarks m = g_marks;
  const double compile_ms = Ms(m.start, m.end);
  const double validate_ms = g_totals.Get("ValidateOps") + g_totals.Get("Graph::Validate");
  const auto fold_end = m.fused ? m.fusion_start : m.laid_out ? m.layout_start : m.end;
  const auto kernels_start = m.laid_out ? m.layout_end : m.fused ? m.fusion_end : fold_end;
  out.emplace_back("first_run_ms", Ms(t_first, t_firsted));
  out.emplace_back("compile_ms", compile_ms);
  out.emplace_back("compile.validate_ms", validate_ms);
  out.emplace_back("compile.infer_fold_ms", Ms(m.start, fold_end) - validate_ms);
  out.emplace_back("compile.fusion_ms", m.fused ? Ms(m.fusion_start, m.fusion_end) : 0.0);
  out.emplace_back("compile.layout_ms", m.laid_out ? Ms(m.layout_start, m.layout_end) : 0.0);
  out.emplace_back("compile.layout.nhwc_query_ms", g_totals.Get("CpuKernelSupportsNhwc"));
  out.emplace_back("compile.kernels_ms", Ms(kernels_start, m.end));
  out.emplace_back("compile.kernels.calls_ms", g_totals.Get("CreateCpuKernel") +
                                                   g_totals.Get("CreateElementwiseKernel") +
                                                   g_totals.Get("CreateLayoutReorderKernel"));
  out.emplace_back("compile.kernels.pack_ms", g_totals.Get("PackWeight"));
  out.emplace_back("compile.intern_ms", g_totals.Get("WeightStore::Intern"));
  out.emplace_back("first_exec_ms", Ms(m.end, t_firsted));
  g_totals.Clear();

  std::vector<double> times;
  for (int i = 0; i < warm; ++i) {
    const auto s = Clock::now();
    model.Run(inputs);
    times.push_back(Ms(s, Clock::now()));
  }
  double median = 0;
  if (!times.empty()) {
    std::sort(times.begin(), times.end());
    median = times.size() % 2 ? times[times.size() / 2]
                              : (times[times.size() / 2 - 1] + times[times.size() / 2]) / 2;
  }
  out.emplace_back("warm_ms", median);
  out.emplace_back("total_ms", Ms(t_load, t_firsted));

  if (second_batch > 0) {
    // A second plan in the now warm process: what of first_exec - warm is per plan (arena, scratch, oneDNN's first
    // run of new primitives) rather than per process (thread pool, libraries' lazy set-up).
    std::map<std::string, Tensor> inputs2 = Inputs(model.graph(), second_batch);
    const auto s = Clock::now();
    model.Run(inputs2);
    const auto e = Clock::now();
    out.emplace_back("second.compile_ms", Ms(g_marks.start, g_marks.end));
    out.emplace_back("second.first_exec_ms", Ms(g_marks.end, e));
    out.emplace_back("second.first_run_ms", Ms(s, e));
    std::vector<double> t2;
    for (int i = 0; i < std::max(warm, 1); ++i) {
      const auto a = Clock::now();
      model.Run(inputs2);
      t2.push_back(Ms(a, Clock::now()));
    }
    std::sort(t2.begin(), t2.end());
    out.emplace_back("second.warm_ms", t2[t2.size() / 2]);
  }

  if (json) {
    std::string s = "{";
    for (size_t i = 0; i < out.size(); ++i) s += (i ? ", \"" : "\"") + out[i].first + "\": " + Num(out[i].second);
    std::printf("%s}\n", s.c_str());
  } else {
    for (const auto& [k, v] : out) std::printf("%-30s %10.2f\n", k.c_str(), v);
  }
  return 0;
}
