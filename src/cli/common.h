#pragma once
// The osprey CLI's subcommands as plain functions (app.cc parses arguments with CLI11 and calls them), plus the
// helpers they share. Subcommands print to `out`, return the process exit code and throw osprey::Error on failure.
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "osprey/graph.h"
#include "osprey/runtime.h"
#include "osprey/tensor.h"

namespace CLI {
class App;
}

namespace osprey {

extern const char* kOspreyVersion;  // src/cli/version.cc

namespace cli {

/// How `osprey serve` is provided: `add` registers the subcommand, `run` runs it once chosen (throws osprey::Error).
/// The osprey binary executes osprey-server, installed beside it (ExecServe, serve_exec.cc), so the rest of the
/// command line loads no server libraries; the Python package serves in its own process (InProcessServe, serve.cc).
struct ServeCommand {
  CLI::App* (*add)(CLI::App& app);
  int (*run)();
};
ServeCommand ExecServe();
ServeCommand InProcessServe();

/// The whole `osprey` command line (argv[0] is the program name): parses, runs the subcommand, prints errors; returns
/// the exit code (0 ok, 1 error, 2 usage). main.cc and `python -m osprey` call it.
int RunCommandLine(int argc, char** argv, const ServeCommand& serve);

struct InspectOptions {
  std::string model;
  bool json = false;
};
/// Prints the model summary. Returns 1 when the model uses unsupported ops (which it lists), else 0.
int RunInspect(const InspectOptions& options, std::ostream& out);

struct RunOptions {
  std::string model;
  std::vector<std::string> inputs;  // "NAME=FILE.npy"
  bool random_inputs = false;
  uint64_t seed = 0;
  std::vector<std::string> dims;  // "SYMBOL=N"
  std::string output_dir;
  int threads = 0;
  bool reference = false;
  std::string precision = "fp32";  // "fp32" | "bf16" | "auto" | "fp16" (CompileOptions::precision)
  std::string device = "cpu";      // "cpu" | "cuda" | "cuda:N" (CompileOptions::device)
};
/// Runs the model once and writes <output_dir>/<output name>.npy for each output.
int RunRun(const RunOptions& options, std::ostream& out);

struct BenchOptions {
  std::string model;
  int64_t batch = 0;  // 0 = not given (symbolic batch dims become 1)
  int threads = 0;
  int warmup = 5;
  int iters = 50;
  bool json = false;
  bool profile = false;
  int top = 20;  // --profile: nodes listed, slowest first (0: all)
  uint64_t seed = 0;
  std::vector<std::string> dims;  // "SYMBOL=N"
  bool reference = false;
  std::string precision = "fp32";  // "fp32" | "bf16" | "auto" | "fp16" (CompileOptions::precision)
  std::string device = "cpu";      // "cpu" | "cuda" | "cuda:N" (CompileOptions::device)
  int streams = 0;  // > 0: throughput mode, this many threads each running the one shared Model concurrently
  double gap_ms = 0;  // latency mode: idle this long before each timed run (not timed), as between a server's requests
  std::vector<std::string> inputs;  // "NAME=FILE.npy": inputs read from files instead of random ones
};
/// Times the model on random inputs (and those given as files).
int RunBench(const BenchOptions& options, std::ostream& out);

// ---- shared helpers ----

/// Parses "KEY=VALUE" into its two halves (split at the first '='); throws kInvalidArgument naming `flag`.
std::pair<std::string, std::string> SplitAssignment(const std::string& text, const std::string& flag);

/// The help text of every --device flag (run, bench, classify, serve).
inline constexpr const char* kDeviceHelp =
    "Where to run: cpu, cuda (= cuda:0) or cuda:N; on a GPU, ops without a CUDA kernel run on the CPU with copies "
    "between (bench --profile shows which)";
/// The help text of every --precision flag.
inline constexpr const char* kPrecisionHelp =
    "Conv/Gemm/MatMul compute precision: fp32, bf16 (CPUs with AVX512_BF16; each kernel keeps bf16 only where it "
    "measures faster than fp32), auto (bf16 where the CPU has it and it is faster, else fp32) or fp16 (GPU, Tensor "
    "Cores)";

/// Parses --dims "SYMBOL=N" entries (N >= 0).
std::map<std::string, int64_t> ParseDimOverrides(const std::vector<std::string>& entries);

/// Concrete shape of a declared input: symbolic dims from `dims` (by symbol), else 1. Throws kInvalidArgument when
/// the input declares no shape.
Shape ConcreteInputShape(const ValueInfo& info, const std::map<std::string, int64_t>& dims);

/// Uniform [0, 1) for float dtypes, zeros for integer and bool dtypes. `state` is advanced (deterministic stream).
Tensor RandomInput(DType dtype, const Shape& shape, uint64_t* state);

/// File name for an output: characters other than [A-Za-z0-9._-] become '_'; never empty, "." or "..".
std::string SanitizeFileName(const std::string& name);

/// Unsupported ops of `graph` as "Op (node 'name')", in node order.
std::vector<std::string> UnsupportedOps(const Graph& graph);

/// "12.3 MiB"-style size.
std::string FormatBytes(int64_t bytes);

/// Threads a run will really use for `requested` (0 = all cores).
int EffectiveThreads(int requested);

/// Comma-separated list of the model's input names, with dtypes and shapes, for error messages.
std::string DescribeInputs(const Graph& graph);

/// The inputs given as NAME=FILE.npy entries (run's and bench's --input), each a graph input named once.
std::map<std::string, Tensor> ReadInputFiles(const Graph& graph, const std::vector<std::string>& entries);

}  // namespace cli
}  // namespace osprey
