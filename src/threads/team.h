// osprey's OpenMP runtime (team.cc): what the rest of osprey may ask of it.
#pragma once

namespace osprey::threads {

/// Parallel regions of more than one thread this process has started on osprey's runtime (0 under libgomp).
long RegionsStarted();
/// True when OSPREY_OMP_RUNTIME=libgomp handed every OpenMP call to libgomp.
bool UsingLibgomp();
/// One line for logs: which runtime, and its wait policy.
const char* Describe();

}  // namespace osprey::threads
