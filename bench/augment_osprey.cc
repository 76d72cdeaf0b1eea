// In-memory augmentation throughput of osprey (driven by bench/augment.py): images are decoded once (untimed), then
// the pipeline is applied to every image `--repeats` times on `--threads` threads (each application with its own
// seed, boxes included). Prints one JSON object: {"images": N, "seconds": S, "images_per_s": R}.
#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "osprey/augment.h"
#include "osprey/dataset.h"
#include "osprey/image.h"

using namespace osprey;
using namespace osprey::augment;

int main(int argc, char** argv) {
  CLI::App app{"osprey in-memory augmentation throughput"};
  std::string pipeline_path, input;
  int threads = 1, repeats = 3;
  app.add_option("--pipeline", pipeline_path, "Pipeline JSON")->required();
  app.add_option("--input", input, "Dataset (COCO or YOLO)")->required();
  app.add_option("--threads", threads, "Threads")->check(CLI::Range(1, 256));
  app.add_option("--repeats", repeats, "Passes over the dataset")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  osprey::augment::UseHeapForImageBuffers();  // as `osprey augment` does
  try {
    const Pipeline pipeline = Pipeline::FromFile(pipeline_path);
    Dataset ds = ReadDataset(input);
    std::vector<Sample> samples;
    for (DatasetItem& item : ds.items) {
      Sample s;
      s.image = ReadImageFile(item.image_path);
      if (item.normalized) ResolveYolo(item, s.image.dim(1), s.image.dim(0));
      s.objects = item.objects;
      samples.push_back(std::move(s));
    }
    // One untimed pass warms caches and the allocator.
    for (size_t i = 0; i < samples.size() && i < 8; ++i) pipeline.Apply(samples[i], ItemSeed(99, i, 0));
    const int64_t total = static_cast<int64_t>(samples.size()) * repeats;
    std::atomic<int64_t> next{0};
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&] {
        for (int64_t w; (w = next.fetch_add(1)) < total;) {
          const size_t i = static_cast<size_t>(w % static_cast<int64_t>(samples.size()));
          const Sample out = pipeline.Apply(samples[i], ItemSeed(1, i, static_cast<uint64_t>(w)));
          if (out.image.numel() == 0) std::abort();
        }
      });
    for (std::thread& t : pool) t.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("{\"images\": %lld, \"seconds\": %.6f, \"images_per_s\": %.3f}\n", (long long)total, s, total / s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "osprey_augment_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
