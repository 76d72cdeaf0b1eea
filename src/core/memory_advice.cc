#include "core/memory_advice.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace osprey {

namespace {
bool Enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("OSPREY_HUGEPAGES");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return enabled;
}
}  // namespace

void AdviseHugePages(const std::shared_ptr<Buffer>& buffer) {
#ifdef MADV_HUGEPAGE
  if (!buffer || buffer->device() != Device::kHost || !buffer->mmapped() || buffer->borrowed() ||
      buffer->size() < kHugePageAdviceBytes || !Enabled())
    return;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t length = (buffer->size() + page - 1) / page * page;  // mmapped blocks start on a page
  madvise(buffer->data(), length, MADV_HUGEPAGE);                    // a hint: failure changes nothing
#else
  (void)buffer;
#endif
}

}  // namespace osprey
