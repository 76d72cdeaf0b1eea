#include "core/load_watch.h"

#include <filesystem>
#include <fstream>

namespace osprey {

int64_t ProcessRunDelayNs() {
  std::error_code ec;
  int64_t total = 0;
  bool any = false;
  for (std::filesystem::directory_iterator it("/proc/self/task", ec), end; !ec && it != end; it.increment(ec)) {
    std::ifstream in(it->path() / "schedstat");
    int64_t on_cpu = 0, delay = 0;
    if (in >> on_cpu >> delay) total += delay, any = true;
  }
  return any ? total : -1;
}

double LoadWatch::DelayShare() const {
  const int64_t delay_ns = ProcessRunDelayNs();
  if (delay_ns < 0 || delay_ns_ < 0) return 0;  // unknown: trust the timing
  const double wall_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start_).count();
  return wall_ns > 0 ? static_cast<double>(delay_ns - delay_ns_) / wall_ns : 0;
}

bool LoadWatch::Disturbed() const { return DelayShare() > kDisturbedShare; }

}  // namespace osprey
