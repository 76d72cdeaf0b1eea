#pragma once
// Kernel memory hints for large buffers written whole right after allocation (imported and packed weights).
#include <memory>

#include "osprey/tensor.h"

namespace osprey {

/// Buffers of at least this many bytes get huge pages with OSPREY_HUGEPAGES=1 (one 2 MiB page; smaller ones could not
/// use one).
inline constexpr size_t kHugePageAdviceBytes = size_t{2} << 20;

/// Call on a fresh buffer that is about to be written whole (docs/performance.md, "Cold start"). For host blocks the
/// Allocator mmapped: populates every page in one call (madvise MADV_POPULATE_WRITE, Linux >= 5.14; elsewhere a no-op)
/// instead of one page fault per 4 KiB on first write: copying 99 MiB into fresh memory took ~45 ms instead of ~62 on
/// the 2-vCPU VM. With `huge_pages` and OSPREY_HUGEPAGES=1 (off by default) it first asks for transparent huge pages
/// (madvise MADV_HUGEPAGE) for blocks of at least kHugePageAdviceBytes: ResNet-50's imported weights then copied in
/// a median ~40 ms instead of ~78, but every few runs in 100-290 ms, the time going to zeroing the fresh 2 MiB pages
/// (probably memory the hypervisor had reclaimed); packed weights on huge pages were bimodal the same way (60 or
/// 170-270 ms), which is why packing passes `huge_pages` = false. Hints only: results never change.
void PrepareForFill(const std::shared_ptr<Buffer>& buffer, bool huge_pages);
inline void PrepareForFill(const Tensor& t, bool huge_pages) { PrepareForFill(t.buffer(), huge_pages); }

}  // namespace osprey
