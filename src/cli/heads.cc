// osprey heads train: a tenant's classifier head trained on a shared backbone (include/osprey/heads.h).
#include "cli/heads.h"

#include "osprey/heads.h"

namespace osprey::cli {
namespace {

struct HeadsCommandOptions {
  std::string backbone, data, output;
  heads::TrainOptions train;
  bool quiet = false;
};

HeadsCommandOptions& Options() {
  static HeadsCommandOptions options;
  return options;
}

CLI::App* g_train = nullptr;

}  // namespace

CLI::App* AddHeadsCommand(CLI::App& app) {
  HeadsCommandOptions& o = Options();
  CLI::App* heads = app.add_subcommand("heads", "Tenants as classifier heads on a shared backbone");
  heads->require_subcommand(1);
  g_train = heads->add_subcommand(
      "train",
      "Train a new classifier head on a backbone's features from an image folder (one sub-folder per class) and write "
      "it as the next version of OUTPUT (backbone weights unchanged, so a server stores them once)");
  g_train->add_option("--backbone", o.backbone, "Backbone model directory (<name> or <name>/<version>)")->required();
  g_train->add_option("--data", o.data, "Image folder: DATA/<class>/<image>")->required();
  g_train->add_option("--output", o.output, "REPO/NAME: the new version is written as REPO/NAME/<n+1>")->required();
  g_train->add_option("--features", o.train.features, "Feature tensor name (default: the final classifier's input)");
  g_train->add_option("--val-split", o.train.val_split, "Held-out fraction per class")->capture_default_str();
  g_train->add_option("--seed", o.train.seed, "Seed of the split")->capture_default_str();
  g_train->add_option("--C", o.train.c, "Inverse L2 strength (as scikit-learn's LogisticRegression C)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  g_train->add_option("--max-iter", o.train.max_iter, "L-BFGS iterations at most")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  g_train->add_option("--threads", o.train.threads, "Intra-op threads (0 = all cores)")->check(CLI::Range(0, 1024));
  g_train->add_option("--batch-size", o.train.batch_size, "Images per backbone run")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();
  g_train->add_option("--features-out", o.train.features_out,
                      "Also write the features (features.npy, labels.npy, validation.npy) to this folder");
  g_train->add_option("--augment", o.train.augment,
                      "Augmentation pipeline (osprey or Albumentations JSON, as `osprey augment` reads) for training "
                      "images");
  g_train->add_option("--copies", o.train.copies, "Augmented copies of each training image (with --augment)")
      ->check(CLI::Range(int64_t{0}, int64_t{100}))
      ->capture_default_str();
  g_train->add_flag("--quiet,-q", o.quiet, "Print only the report path");
  return heads;
}

int RunHeadsCommand(std::ostream& out, std::ostream& err) {
  HeadsCommandOptions& o = Options();
  if (g_train && *g_train) {
    auto progress = [&](const std::string& line) {
      if (!o.quiet) err << "heads: " << line << std::endl;
    };
    heads::TrainResult r = heads::Train(o.backbone, o.data, o.output, o.train, progress);
    out << r.model_dir << "\n";
    return 0;
  }
  return 2;
}

}  // namespace osprey::cli
