// Flat-cost benchmark: does item N cost what item 1 did?
//  (a) one model run --iters times;
//  (b) a fresh small image graph (crop -> resize -> normalise, random input size 64..1024 px) built, compiled and run
//      --iters times, as the TF1 augmentation loop of our founding story did.
// Prints mean ms of the first and last 1,000 iterations, their ratio, and RSS growth.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <unistd.h>

#include "osprey/onnx.h"
#include "osprey/runtime.h"

using namespace osprey;

namespace {

double RssMiB() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, rss = 0;
  f >> pages >> rss;
  return static_cast<double>(rss) * sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

Tensor Random(DType dtype, Shape shape, std::mt19937& rng) {
  Tensor t(dtype, std::move(shape));
  if (dtype == DType::kU8) {
    for (int64_t i = 0; i < t.numel(); ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(rng());
  } else {
    std::uniform_real_distribution<float> u(0.f, 1.f);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  }
  return t;
}

// A small CNN built in code: 3 x (conv3x3 + BN + relu, stride 2) -> global pool -> linear 10.
Graph SmallCnn() {
  std::mt19937 rng(1);
  GraphBuilder b("small_cnn", 13);
  auto x = b.Input("x", DType::kF32, {1, 3, 64, 64});
  ValueRef h = x;
  int64_t cin = 3;
  for (int64_t cout : {16, 32, 64}) {
    auto w = b.Constant(Random(DType::kF32, {cout, cin, 3, 3}, rng));
    h = b.Op("Conv", {h, w}, {{"pads", Attribute::Ints({1, 1, 1, 1})}, {"strides", Attribute::Ints({2, 2})}});
    h = b.Op("BatchNormalization", {h, b.Constant(Random(DType::kF32, {cout}, rng)),
                                    b.Constant(Random(DType::kF32, {cout}, rng)),
                                    b.Constant(Random(DType::kF32, {cout}, rng)),
                                    b.Constant(Random(DType::kF32, {cout}, rng))});
    h = b.Op("Relu", {h});
    cin = cout;
  }
  h = b.Op("Flatten", {b.Op("GlobalAveragePool", {h})});
  h = b.Op("Gemm", {h, b.Constant(Random(DType::kF32, {10, 64}, rng)), b.Constant(Random(DType::kF32, {10}, rng))},
           {{"transB", Attribute::Int(1)}});
  b.Output(h, "logits");
  return b.Finish();
}

// Per-item preprocessing graph for an HxWx3 uint8 image: centre crop to a square, HWC->NCHW, resize to 224,
// scale to [0,1], normalise with ImageNet mean/std. The graph is new for every item (sizes vary).
Graph ImageGraph(int64_t h, int64_t w) {
  GraphBuilder b("prep", 13);
  auto x = b.Input("image", DType::kU8, {h, w, 3});
  int64_t side = std::min(h, w);
  int64_t top = (h - side) / 2, left = (w - side) / 2;
  auto i64 = [](std::vector<int64_t> v) { return Tensor::FromVector<int64_t>({static_cast<int64_t>(v.size())}, v); };
  auto crop = b.Op("Slice", {x, b.Constant(i64({top, left})), b.Constant(i64({top + side, left + side})),
                             b.Constant(i64({0, 1}))});
  auto f = b.Op("Cast", {crop}, {{"to", Attribute::Int(1)}});
  auto chw = b.Op("Unsqueeze", {b.Op("Transpose", {f}, {{"perm", Attribute::Ints({2, 0, 1})}}), b.Constant(i64({0}))});
  auto sizes = b.Constant(i64({1, 3, 224, 224}));
  auto resized = b.Op("Resize", {chw, ValueRef{-1}, ValueRef{-1}, sizes}, {{"mode", Attribute::String("linear")}});
  auto mean = b.Constant(Tensor::FromVector<float>({1, 3, 1, 1}, {0.485f * 255, 0.456f * 255, 0.406f * 255}));
  auto std = b.Constant(Tensor::FromVector<float>({1, 3, 1, 1}, {0.229f * 255, 0.224f * 255, 0.225f * 255}));
  b.Output(b.Op("Div", {b.Op("Sub", {resized, mean}), std}), "tensor");
  return b.Finish();
}

struct Result {
  double first_ms, last_ms, rss_growth_mib;
};

template <class F>
Result Measure(const char* label, int iters, int window, F&& step) {
  std::vector<double> ms(iters);
  double rss_after_first = 0;
  auto t_start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    step(i);
    ms[i] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i == window - 1) rss_after_first = RssMiB();
    if ((i + 1) % 1000 == 0 && isatty(2)) {
      double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
      std::fprintf(stderr, "\r%s: %d/%d  %.0f it/s   ", label, i + 1, iters, (i + 1) / el);
    }
  }
  if (isatty(2)) std::fprintf(stderr, "\n");
  double first = 0, last = 0;
  for (int i = 0; i < window; ++i) {
    first += ms[i];
    last += ms[iters - window + i];
  }
  return {first / window, last / window, RssMiB() - rss_after_first};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Flat-cost benchmark: cost and memory of item N vs item 1 (prints a table)"};
  int iters = 20000, threads = 1;
  std::string model_path;
  app.add_option("--iters", iters, "iterations per part (>= 2000)")->capture_default_str();
  app.add_option("--threads", threads, "intra-op threads")->capture_default_str();
  app.add_option("--model", model_path, "ONNX model for part (a) (default: a small CNN built in code)");
  CLI11_PARSE(app, argc, argv);
  if (iters < 2000) {
    std::fprintf(stderr, "flat_cost: --iters must be at least 2000 (two windows of 1000)\n");
    return 2;
  }
  const int window = 1000;
  try {
    ModelOptions mo;
    mo.compile.num_threads = threads;
    Model model(model_path.empty() ? SmallCnn() : LoadOnnxModel(model_path), mo);
    std::mt19937 rng(7);
    std::map<std::string, Tensor> inputs;
    for (const ValueInfo& vi : model.graph().input_infos) {
      Shape s;
      for (const Dim& d : vi.dims) s.push_back(d.value >= 0 ? d.value : 1);
      inputs[vi.name] = Random(vi.dtype, s, rng);
    }
    Result a = Measure("model", iters, window, [&](int) { model.Run(inputs); });

    // Sizes for part (b): the last window replays the first window's sizes so the two are comparable.
    std::vector<std::pair<int64_t, int64_t>> sizes(iters);
    std::uniform_int_distribution<int64_t> side(64, 1024);
    for (int i = 0; i < iters; ++i)
      sizes[i] = i >= iters - window ? sizes[i - (iters - window)] : std::make_pair(side(rng), side(rng));
    std::vector<Tensor> images;  // a few distinct pixel buffers per size would cost memory; reuse one max-size buffer
    Tensor pixels = Random(DType::kU8, {1024, 1024, 3}, rng);
    CompileOptions co;
    co.num_threads = threads;
    Result b = Measure("fresh graph", iters, window, [&](int i) {
      auto [h, w] = sizes[i];
      Graph g = ImageGraph(h, w);
      auto plan = Compile(g, {{DType::kU8, {h, w, 3}}}, co);
      Tensor img = Tensor::View(DType::kU8, {h, w, 3}, pixels.buffer(), 0);
      plan->Run({img});
    });
    std::printf("%-34s %12s %12s %8s %14s\n", "part", "first 1k ms", "last 1k ms", "ratio", "RSS growth MiB");
    std::printf("%-34s %12.3f %12.3f %8.3f %14.2f\n", "(a) one model, run N times", a.first_ms, a.last_ms,
                a.last_ms / a.first_ms, a.rss_growth_mib);
    std::printf("%-34s %12.3f %12.3f %8.3f %14.2f\n", "(b) fresh graph per item", b.first_ms, b.last_ms,
                b.last_ms / b.first_ms, b.rss_growth_mib);
    std::printf("iterations per part: %d, threads: %d, targets: ratio <= 1.05, RSS growth <= 4 MiB\n", iters, threads);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flat_cost: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
