#pragma once
// osprey augment: registered by main.cc with AddAugmentCommand, run with RunAugmentCommand when it was chosen.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <ostream>
#include <string>

namespace osprey::cli {

struct AugmentOptions {
  std::string pipeline;
  std::string input;
  std::string format = "auto";         // input: auto | coco | yolo
  std::string output;
  std::string output_format = "same";  // same | coco | yolo
  std::string image_format = "same";   // same | jpeg | png | webp
  int quality = 95;
  int64_t copies = 1;
  uint64_t seed = 0;
  int threads = 0;  // 0 = all cores
  std::string shard;  // "I/N", 0 <= I < N
  bool resume = false;
  int64_t preview = 0;
  std::string progress = "auto";  // auto | bar | lines | none
};

/// Process policy for augmentation runs: image-sized buffers come from malloc's heap (reused per item) instead of
/// per-buffer mappings (page faults per item). Called by RunAugment; the augmentation benchmarks call it too.
void UseHeapForImageBuffers();

/// Adds the `augment` subcommand and returns it.
CLI::App* AddAugmentCommand(CLI::App& app);
/// Runs the `augment` subcommand with the options parsed by AddAugmentCommand's app.
int RunAugmentCommand(std::ostream& out, std::ostream& err);
/// Augments a dataset (docs/augment.md). Progress and per-item problems go to `err`, the summary to `out`.
/// Returns 0 when every item was written without problems, 1 when any item failed or had annotation problems.
/// Throws osprey::Error for problems found before work starts (bad pipeline, unreadable dataset, bad options).
int RunAugment(const AugmentOptions& options, std::ostream& out, std::ostream& err);

}  // namespace osprey::cli
