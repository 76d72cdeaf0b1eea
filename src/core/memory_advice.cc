#include "core/memory_advice.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL, which leaves the buffer as it was
#endif

namespace osprey {

namespace {
bool HugePagesWanted() {
  static const bool wanted = [] {
    const char* v = std::getenv("OSPREY_HUGEPAGES");
    return v && std::strcmp(v, "1") == 0;
  }();
  return wanted;
}
}  // namespace

void PrepareForFill(const std::shared_ptr<Buffer>& buffer, bool huge_pages) {
  if (!buffer || buffer->device() != Device::kHost || !buffer->mmapped() || buffer->borrowed() || !buffer->data())
    return;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t length = (buffer->size() + page - 1) / page * page;  // mmapped blocks start on a page
#ifdef MADV_HUGEPAGE
  if (huge_pages && buffer->size() >= kHugePageAdviceBytes && HugePagesWanted())
    madvise(buffer->data(), length, MADV_HUGEPAGE);
#else
  (void)huge_pages;
#endif
  madvise(buffer->data(), length, MADV_POPULATE_WRITE);
}

}  // namespace osprey
