// Flat-cost benchmark of augmentation: does image 60,000 cost what image 1 did?
// Synthetic images of random sizes (200..2000 px per side) with a few boxes go through a pipeline whose steps vary
// per image (OneOf / SomeOf / probabilities); each application builds, compiles, runs and drops its own graphs. The
// last --window items replay the first --window items' sizes and seeds, so the two windows do identical work.
// Prints mean ms of the first and last window, their ratio, RSS growth and the graphs built.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>

#include "osprey/augment.h"
#include "osprey/dataset.h"

using namespace osprey;
using namespace osprey::augment;

namespace {

double RssMiB() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, rss = 0;
  f >> pages >> rss;
  return static_cast<double>(rss) * sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

constexpr const char* kPipeline = R"({"type": "Compose", "transforms": [
  {"type": "OneOf", "p": 1, "transforms": [
    {"type": "RandomResizedCrop", "size": [512, 512], "scale": [0.3, 1.0], "p": 1},
    {"type": "RandomSizedBBoxSafeCrop", "height": 512, "width": 512, "p": 1},
    {"type": "Sequential", "p": 1, "transforms": [{"type": "LongestMaxSize", "max_size": 512, "p": 1},
                                                  {"type": "PadIfNeeded", "min_height": 512, "min_width": 512, "border_mode": 0, "p": 1}]}]},
  {"type": "HorizontalFlip", "p": 0.5},
  {"type": "SomeOf", "n": 1, "p": 0.7, "transforms": [
    {"type": "Affine", "scale": [0.8, 1.2], "rotate": [-15, 15], "shear": [-5, 5], "p": 1},
    {"type": "Rotate", "limit": 20, "border_mode": 0, "p": 1},
    {"type": "Perspective", "scale": [0.03, 0.08], "p": 1}]},
  {"type": "OneOf", "p": 0.8, "transforms": [
    {"type": "ColorJitter", "p": 1}, {"type": "HueSaturationValue", "p": 1},
    {"type": "RandomBrightnessContrast", "p": 1}, {"type": "RandomGamma", "p": 1}]},
  {"type": "GaussianBlur", "blur_limit": [3, 7], "p": 0.3},
  {"type": "GaussNoise", "std_range": [0.02, 0.08], "p": 0.2},
  {"type": "ToGray", "p": 0.05},
  {"type": "CoarseDropout", "num_holes_range": [1, 4], "hole_height_range": [16, 48], "hole_width_range": [16, 48], "p": 0.3}],
  "bbox_params": {"min_visibility": 0.1}})";

// A synthetic image: a cheap gradient with three solid boxes, sized by `seed`.
Sample MakeSample(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rng() % uint64_t(hi - lo + 1)); };
  const int64_t h = uniform(200, 2000), w = uniform(200, 2000);
  Sample s;
  s.image = Tensor(DType::kU8, {h, w, 3});
  uint8_t* p = s.image.data<uint8_t>();
  for (int64_t y = 0; y < h; ++y) {
    uint8_t* row = p + y * w * 3;
    for (int64_t x = 0; x < w; ++x) {
      row[x * 3] = static_cast<uint8_t>(x);
      row[x * 3 + 1] = static_cast<uint8_t>(y);
      row[x * 3 + 2] = static_cast<uint8_t>(x + y);
    }
  }
  for (int b = 0; b < 3; ++b) {
    Object o;
    o.x0 = static_cast<double>(uniform(0, w / 2)), o.y0 = static_cast<double>(uniform(0, h / 2));
    o.x1 = o.x0 + static_cast<double>(uniform(10, w / 2)), o.y1 = o.y0 + static_cast<double>(uniform(10, h / 2));
    o.category = b;
    s.objects.push_back(o);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Augmentation flat-cost benchmark: mean ms of the first and last window, RSS growth"};
  int64_t items = 60000, window = 1000;
  uint64_t seed = 1;
  app.add_option("--items", items, "Images to augment")->check(CLI::Range(int64_t{2}, int64_t{10000000}))->capture_default_str();
  app.add_option("--window", window, "Images per measured window")->check(CLI::Range(int64_t{1}, int64_t{1000000}))->capture_default_str();
  app.add_option("--seed", seed, "Run seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  osprey::augment::UseHeapForImageBuffers();  // as `osprey augment` does
  if (2 * window > items) window = items / 2;

  const Pipeline pipeline = Pipeline::FromJson(kPipeline);
  double first_ms = 0, last_ms = 0, rss_after_first = 0;
  int64_t graphs = 0, warps = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < items; ++i) {
    // The last window replays the first window's items (same sizes, same random steps).
    const int64_t item = i >= items - window ? i - (items - window) : i;
    const Sample in = MakeSample(ItemSeed(seed, static_cast<uint64_t>(item), 1));
    ApplyReport report;
    const auto t0 = std::chrono::steady_clock::now();
    const Sample out = pipeline.Apply(in, ItemSeed(seed, static_cast<uint64_t>(item), 0), {}, &report);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    graphs += report.graphs, warps += report.warps;
    if (i < window) first_ms += ms;
    if (i >= items - window) last_ms += ms;
    if (i + 1 == window) rss_after_first = RssMiB();
    if ((i + 1) % 5000 == 0 || i + 1 == items) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "augment_flat: %lld/%lld images, %.1f images/s, RSS %.1f MiB\n", (long long)(i + 1),
                   (long long)items, (i + 1) / s, RssMiB());
    }
  }
  first_ms /= window, last_ms /= window;
  const double growth = RssMiB() - rss_after_first;
  std::printf("| images | window | first %lld mean ms | last %lld mean ms | ratio | RSS growth | graphs built | warps |\n",
              (long long)window, (long long)window);
  std::printf("|---|---|---|---|---|---|---|---|\n");
  std::printf("| %lld | %lld | %.3f | %.3f | %.3f | %.2f MiB | %lld | %lld |\n", (long long)items, (long long)window,
              first_ms, last_ms, last_ms / first_ms, growth, (long long)graphs, (long long)warps);
  return 0;
}
