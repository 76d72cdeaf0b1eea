// The osprey binary: the command line lives in app.cc (shared with `python -m osprey`); `osprey serve` executes
// osprey-server (serve_exec.cc).
#include "cli/common.h"
#include "cli/omp_env.h"

int main(int argc, char** argv) {
  osprey::cli::ApplyOmpWaitDefault(argv);  // may re-exec this binary once (libgomp reads its environment at load)
  return osprey::cli::RunCommandLine(argc, argv, osprey::cli::ExecServe());
}
