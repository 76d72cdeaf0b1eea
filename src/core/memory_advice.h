#pragma once
// Kernel memory hints for long-lived, large buffers (weights and their packed forms).
#include <memory>

#include "osprey/tensor.h"

namespace osprey {

/// Buffers of at least this many bytes get huge pages (one 2 MiB page; smaller ones could not use one).
inline constexpr size_t kHugePageAdviceBytes = size_t{2} << 20;

/// Asks Linux to back `buffer` with transparent huge pages (madvise MADV_HUGEPAGE) when it is a host block of at least
/// kHugePageAdviceBytes that the Allocator mmapped. Call it before the buffer is first written: filling 100 MiB of
/// fresh weights then takes ~30 ms of page faults instead of ~75 (docs/performance.md, "Cold start"), and the kernels
/// that read it later miss the TLB less. Only a hint: without THP (or with OSPREY_HUGEPAGES=0) nothing changes.
void AdviseHugePages(const std::shared_ptr<Buffer>& buffer);
inline void AdviseHugePages(const Tensor& t) { AdviseHugePages(t.buffer()); }

}  // namespace osprey
