// osprey's OpenMP runtime (team.cc): what the rest of osprey may ask of it.
#pragma once

#include <string>

namespace osprey::threads {

/// Parallel regions of more than one thread this process has started on osprey's runtime (0 under libgomp).
long RegionsStarted();
/// Parts of a region (a thread number's share) that the region's thread 0 ran because their own thread had not
/// started them when it finished its part (team.cc, "Parts taken over").
long PartsTakenOver();
/// Sleeping workers woken with the waker's CPU left out of their affinity mask (team.cc, "Where a woken worker runs").
long WakesSteered();
/// Of those, the ones found on the waker's CPU when they woke: 0 unless the mask was set too late.
long WakesSteeredOntoTheWakersCpu();
/// True when OSPREY_OMP_RUNTIME=libgomp handed every OpenMP call to libgomp.
bool UsingLibgomp();
/// One line for logs: which runtime, and its wait policy.
const char* Describe();
/// What a kernel timed in this process depends on beyond the CPU and the thread count: "" under osprey's runtime with
/// its default waits, else the runtime and the settings that differ (libgomp and its OMP_WAIT_POLICY/GOMP_SPINCOUNT, a
/// passive or active wait, OSPREY_OMP_SPIN_US/YIELD_US, OSPREY_OMP_TAKE_OVER/STEER=0). A kernel of three parallel
/// regions per chunk (Winograd) ran at oneDNN's speed with OMP_WAIT_POLICY=passive and at half its time with the
/// default, so the tuning choices (kernels/cpu/dnnl_common.cc) are keyed by it.
const std::string& TimingContext();

}  // namespace osprey::threads
