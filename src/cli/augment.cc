// osprey augment: the command's options, filled into augment::RunOptions; the dataset runner is augment::RunDataset
// (src/augment/runner.cc, docs/augment.md).
#include "cli/augment.h"

#include <cstdint>

#include "osprey/dataset.h"

namespace osprey::cli {

namespace {

augment::RunOptions& Options() {
  static augment::RunOptions o;
  return o;
}

}  // namespace

CLI::App* AddAugmentCommand(CLI::App& app) {
  augment::RunOptions& o = Options();
  CLI::App* a = app.add_subcommand(
      "augment", "Augment a detection dataset (COCO or YOLO) with a pipeline; boxes, polygons and keypoints follow");
  a->add_option("--pipeline,-p", o.pipeline, "Pipeline JSON (osprey's or Albumentations' A.save format)")->required();
  a->add_option("--input,-i", o.input, "Dataset: COCO annotation .json or folder, or YOLO folder")->required();
  a->add_option("--format", o.format, "Input format")->check(CLI::IsMember({"auto", "coco", "yolo"}))->capture_default_str();
  a->add_option("--output,-o", o.output, "Output folder (created; images/ plus annotations)")->required();
  a->add_option("--output-format", o.output_format, "Output dataset format")
      ->check(CLI::IsMember({"same", "coco", "yolo"}))
      ->capture_default_str();
  a->add_option("--image-format", o.image_format, "Output images (same = as the source file)")
      ->check(CLI::IsMember({"same", "jpeg", "jpg", "png", "webp"}))
      ->capture_default_str();
  a->add_option("--quality", o.quality, "JPEG/WebP quality")->check(CLI::Range(1, 100))->capture_default_str();
  a->add_option("--copies,-k", o.copies, "Augmented copies per image")->check(CLI::Range(int64_t{1}, int64_t{100000}))
      ->capture_default_str();
  a->add_option("--seed", o.seed, "Run seed: the same seed gives byte-identical output")->capture_default_str();
  a->add_option("--threads,-t", o.threads, "Worker threads (0 = all cores); output does not depend on it")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  a->add_option("--shard", o.shard, "Do only shard I of N (0 <= I < N), e.g. 0/4; all N shards cover the dataset once");
  a->add_flag("--resume", o.resume, "Continue in an existing output folder, skipping finished items");
  a->add_option("--preview", o.preview, "Write OUTPUT/preview.png: a contact sheet of the first K outputs, boxes drawn")
      ->check(CLI::Range(int64_t{0}, int64_t{1024}));
  a->add_option("--progress", o.progress, "Progress display (auto: a bar on a terminal, plain lines otherwise)")
      ->check(CLI::IsMember({"auto", "bar", "lines", "none"}))
      ->capture_default_str();
  return a;
}

int RunAugmentCommand(std::ostream& out, std::ostream& err) { return augment::RunDataset(Options(), out, err); }

}  // namespace osprey::cli
