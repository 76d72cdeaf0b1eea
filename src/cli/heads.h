#pragma once
// osprey heads train: registered by app.cc with AddHeadsCommand, run with RunHeadsCommand when it was chosen.
#include <CLI/CLI.hpp>
#include <ostream>

namespace osprey::cli {

/// Adds the `heads` command (with its `train` subcommand; options live in heads.cc) and returns it.
CLI::App* AddHeadsCommand(CLI::App& app);
/// Runs the chosen `heads` subcommand. Throws osprey::Error.
int RunHeadsCommand(std::ostream& out, std::ostream& err);

}  // namespace osprey::cli
