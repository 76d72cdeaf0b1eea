#pragma once
// CUDA Graphs for DeviceBackend::BeginCapture / EndCapture / Replay (the runtime captures a plan's device kernels once
// per device arena and replays them: one launch per run; docs/gpu.md).
#include <memory>

namespace osprey::cuda {

/// Starts recording `stream` (thread-local mode: other threads' CUDA calls are not affected). False when the stream
/// cannot be captured (the default stream, or the kernels run in host emulation).
bool BeginGraphCapture(int ordinal, void* stream);
/// Ends the recording and instantiates it; nullptr when the capture was invalidated (an unsupported call was made
/// while recording) or instantiation failed. The CUDA error state is cleared either way.
std::shared_ptr<void> EndGraphCapture(int ordinal, void* stream);
/// Queues the instantiated graph on `stream`; throws kInternal on a launch error.
void ReplayGraph(int ordinal, void* graph, void* stream);

}  // namespace osprey::cuda
