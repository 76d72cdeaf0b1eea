// osprey's OpenMP runtime (team.cc): what the rest of osprey may ask of it.
#pragma once

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

}  // namespace osprey::threads
