#pragma once
// osprey augment: registered by main.cc with AddAugmentCommand, run with RunAugmentCommand when it was chosen. The
// dataset runner itself is augment::RunDataset (include/osprey/dataset.h, src/augment/runner.cc).
#include <CLI/CLI.hpp>
#include <ostream>

namespace osprey::cli {

/// Adds the `augment` subcommand and returns it.
CLI::App* AddAugmentCommand(CLI::App& app);
/// Runs the `augment` subcommand with the options parsed by AddAugmentCommand's app (augment::RunDataset).
int RunAugmentCommand(std::ostream& out, std::ostream& err);

}  // namespace osprey::cli
