#pragma once
// What a kernel timed in this process depends on beyond the CPU and the thread count: the OpenMP runtime and how its
// threads wait between parallel regions. A kernel of three parallel regions per chunk (osprey's Winograd) ran at
// oneDNN's speed with OMP_WAIT_POLICY=passive and at half its time with the default waits, so the tuner keys its
// choices by this text (kernels/cpu/dnnl_common.cc).
#include <string>

namespace osprey {

/// "" under osprey's own OpenMP runtime with its default waits; otherwise the runtime and the settings that differ.
/// A program linking osprey's libraries without that runtime (src/threads, in the executables and the Python module)
/// runs on libgomp: "libgomp" plus its OMP_WAIT_POLICY / GOMP_SPINCOUNT when set.
const std::string& TimingContext();

/// Called by osprey's OpenMP runtime when it is linked in (src/threads/team.cc, before main: not thread-safe) with its
/// text.
void SetTimingContext(std::string context);

}  // namespace osprey
