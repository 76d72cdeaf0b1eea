#pragma once
// osprey decode: registered by main.cc with AddDecodeCommand, run with RunDecodeCommand when it was chosen.
#include <CLI/CLI.hpp>
#include <ostream>

namespace osprey::cli {

/// Adds the `decode` subcommand (its options live in this file) and returns it.
CLI::App* AddDecodeCommand(CLI::App& app);
/// Decodes the image given on the command line, writes the .npy and prints a summary. Throws osprey::Error.
int RunDecodeCommand(std::ostream& out);

}  // namespace osprey::cli
