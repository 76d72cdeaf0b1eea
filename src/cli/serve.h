#pragma once
// osprey serve: registered by main.cc with AddServeCommand, run with RunServeCommand when it was chosen.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <ostream>
#include <string>

namespace osprey::cli {

/// Adds the `serve` subcommand (its options live in serve.cc) and returns it.
CLI::App* AddServeCommand(CLI::App& app);
/// Adds the serve options to `app` itself (the server-only binary, osprey-server, has no subcommands).
void AddServeOptions(CLI::App* app);
/// Starts the model server and blocks until SIGINT/SIGTERM; returns 0 after a graceful stop. Throws osprey::Error.
int RunServeCommand(std::ostream& out);

/// "512M", "2G", "64MiB", "1048576" -> bytes (K/M/G/T are powers of 1024; fractions allowed: "1.5G"). Throws
/// kInvalidArgument naming `flag`.
int64_t ParseByteSize(const std::string& text, const std::string& flag);

}  // namespace osprey::cli
