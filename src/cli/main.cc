// The osprey binary: the command line lives in app.cc (shared with `python -m osprey`).
#include "cli/common.h"

int main(int argc, char** argv) { return osprey::cli::RunCommandLine(argc, argv); }
