// osprey-server: the model server alone (`make server`): the options of `osprey serve`, and only what serving links
// (no augmentation, no benchmark code). The container image runs it.
#include <CLI/CLI.hpp>
#include <iostream>
#include <new>

#include "cli/omp_env.h"
#include "cli/serve.h"
#include "osprey/error.h"

int main(int argc, char** argv) {
  osprey::cli::ApplyOmpWaitDefault(argv);  // may re-exec this binary once (libgomp reads its environment at load)
  CLI::App app{"osprey-server: serve a model repository (KServe v2 REST and gRPC, Triton extensions, classify)"};
  osprey::cli::AddServeOptions(&app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "osprey-server: error: " << e.what() << "\nRun 'osprey-server --help' for usage.\n";
    return 2;
  }
  try {
    return osprey::cli::RunServeCommand(std::cout);
  } catch (const std::bad_alloc&) {
    std::cerr << "osprey-server: error: out of memory\n";
  } catch (const std::exception& e) {
    std::cerr << "osprey-server: error: " << e.what() << "\n";
  }
  return 1;
}
