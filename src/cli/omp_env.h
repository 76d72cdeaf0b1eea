// The OpenMP wait policy of osprey's binaries (docs/performance.md, "Under CPU contention").
//
// The binaries run their parallel regions on osprey's own OpenMP runtime (src/threads/team.cc), whose waits need no
// setting made before start-up. OSPREY_OMP_RUNTIME=libgomp hands them to libgomp instead, which reads
// OMP_WAIT_POLICY / GOMP_SPINCOUNT once, when the library is loaded, before main() runs; setting them in main() is too
// late. So then `osprey` and `osprey-server` call ApplyOmpWaitDefault(argv) first thing in main(): when the user has
// set neither variable, the process re-executes itself once (/proc/self/exe, the same argv) with libgomp's bounded
// spin (GOMP_SPINCOUNT=1000) set, and OSPREY_OMP_DEFAULT=<value> marks the re-executed process (no loop; it also says
// the default came from osprey, not the user). A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT always wins;
// OSPREY_OMP_DEFAULT=0 turns the re-exec off (libgomp's own default: spin ~300,000 iterations, then sleep). If the
// re-exec fails the process carries on as it is. Nothing is printed on stdout; OSPREY_OMP_DEBUG=1 prints the setting in
// force on stderr (and, at exit, what osprey's runtime did).
//
// Header-only because osprey-server links only serve.cc/version.cc of src/cli (CMakeLists.txt).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "threads/team.h"

namespace osprey::cli {

// libgomp's default here: bounded spinning. An idle OpenMP thread spins ~1,000 iterations (some microseconds), then
// sleeps on a futex, instead of libgomp's ~300,000 (milliseconds), which collapses when other processes hold the
// cores. Chosen by bench/contention (docs/performance.md): near passive under contention, near libgomp's default on a
// quiet host.
inline constexpr const char* kOmpDefaultVar = "GOMP_SPINCOUNT";
inline constexpr const char* kOmpDefaultValue = "1000";
inline constexpr const char* kOmpMarkerVar = "OSPREY_OMP_DEFAULT";

// Subcommands whose process never starts an OpenMP team, so the wait policy cannot matter and the re-exec is
// skipped: `augment` runs every plan with one thread (its parallelism is its own --threads workers); `serve` executes
// osprey-server, which applies the default itself.
inline bool NeedsNoOpenMp(char** argv) {
  return argv[0] != nullptr && argv[1] != nullptr &&
         (std::strcmp(argv[1], "augment") == 0 || std::strcmp(argv[1], "serve") == 0);
}

inline void ApplyOmpWaitDefault(char** argv) {
  if (!threads::UsingLibgomp()) {
    if (const char* debug = std::getenv("OSPREY_OMP_DEBUG"); debug != nullptr && std::strcmp(debug, "0") != 0)
      std::fprintf(stderr, "osprey: openmp: %s\n", threads::Describe());
    return;
  }
  const char* marker = std::getenv(kOmpMarkerVar);
  const bool user_set = std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr;
  const bool skipped = marker == nullptr && !user_set && NeedsNoOpenMp(argv);
  bool exec_failed = false;
  if (marker == nullptr && !user_set && !skipped) {
    // Not yet re-executed and the user left the wait policy to us.
    if (setenv(kOmpDefaultVar, kOmpDefaultValue, 1) == 0 && setenv(kOmpMarkerVar, kOmpDefaultValue, 1) == 0) {
      std::fflush(nullptr);
      execv("/proc/self/exe", argv);
    }
    // execv failed (no /proc, say): carry on with libgomp's default.
    unsetenv(kOmpDefaultVar);
    unsetenv(kOmpMarkerVar);
    exec_failed = true;
  }
  if (const char* debug = std::getenv("OSPREY_OMP_DEBUG"); debug != nullptr && std::strcmp(debug, "0") != 0) {
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    const char* spin = std::getenv("GOMP_SPINCOUNT");
    const char* source = skipped                         ? "libgomp default: this command runs no OpenMP team"
                         : exec_failed                   ? "libgomp default: re-exec failed"
                         : marker == nullptr             ? "user"
                         : std::strcmp(marker, "0") == 0 ? (user_set ? "user" : "libgomp default: OSPREY_OMP_DEFAULT=0")
                                                         : "osprey default";
    std::fprintf(stderr, "osprey: openmp: OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s (%s)\n", policy ? policy : "(unset)",
                 spin ? spin : "(unset)", source);
  }
}

}  // namespace osprey::cli
