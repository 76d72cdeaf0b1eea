// `osprey serve` in the osprey binary: executes osprey-server, installed beside osprey (same folder in the build tree
// and in an install), with the same arguments. The server's gRPC, TLS and Abseil libraries then load only when a
// server runs: every other command starts in about 10 ms instead of 37. exec keeps the process id, so a supervisor's
// signals (SIGTERM, SIGINT) reach the server itself.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "cli/common.h"
#include "osprey/error.h"

namespace osprey::cli {
namespace {

CLI::App* g_serve = nullptr;

// Every argument after `serve`, --help included, goes to osprey-server, which owns the options.
CLI::App* AddServePassthrough(CLI::App& app) {
  g_serve = app.add_subcommand("serve",
                               "Serve a model repository (KServe v2 REST and gRPC, Triton extensions, classify): runs "
                               "osprey-server, installed beside osprey; `osprey serve --help` lists its options");
  g_serve->prefix_command();
  g_serve->set_help_flag();
  return g_serve;
}

std::string ServerPath() {
  std::string self(PATH_MAX, '\0');
  const ssize_t n = readlink("/proc/self/exe", self.data(), self.size());
  if (n <= 0 || static_cast<size_t>(n) >= self.size())
    throw Error(ErrorCode::kNotFound,
                "osprey serve: cannot find the folder of this binary (/proc/self/exe); run osprey-server instead, "
                "with the same arguments");
  self.resize(static_cast<size_t>(n));
  return (std::filesystem::path(self).parent_path() / "osprey-server").string();
}

int ExecServer() {
  const std::string server = ServerPath();
  std::vector<std::string> args = g_serve->remaining();
  std::vector<char*> argv = {const_cast<char*>(server.c_str())};
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  execv(server.c_str(), argv.data());
  const int err = errno;
  throw Error(ErrorCode::kNotFound, "osprey serve runs " + server + ", which could not be started (" +
                                        std::strerror(err) +
                                        "): build it with `make build` (or `make server`), or run osprey-server "
                                        "with the same arguments");
}

}  // namespace

ServeCommand ExecServe() { return {AddServePassthrough, ExecServer}; }

}  // namespace osprey::cli
