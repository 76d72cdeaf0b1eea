// Kernels' per-thread scratch (kernels/cpu/thread_scratch.h) is given back: a run of a large input left its threads'
// blocks that large for the life of the threads, in no account (32 MiB in a Python process after `del model`). Now
// TrimSharedArenas frees the blocks when no run is in progress, SharedArenaBytes counts them, and a block a kernel
// reserved outside any run stays until its thread reserves inside one again. Oracles: the blocks' byte count, and the
// same output before and after the blocks were freed.
#include "kernels/cpu/thread_scratch.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey {
namespace {

using cpu::ThreadScratch;
using cpu::ThreadScratchBytes;
using cpu::TrimThreadScratch;
using testing::ExpectTensorNear;
using testing::RandomTensor;

// A convolution reading and writing plain NCHW tensors: oneDNN's kernel reorders them through the thread's scratch.
Graph PlainConv() {
  GraphBuilder b("conv", 13);
  auto x = b.Input("x", DType::kF32, {-1, 32, 48, 48});
  b.Output(b.Op("Conv", {x, b.Constant(RandomTensor({32, 32, 3, 3}, 1))}, {{"pads", Attribute::Ints({1, 1, 1, 1})}}),
           "y");
  return b.Finish();
}

TEST(ThreadScratch, FreedWhenNoRunIsInProgressAndCounted) {
  TrimSharedArenas(0);
  ModelOptions options;
  options.compile.num_threads = 2;
  Model model(PlainConv(), options);
  const Tensor x = RandomTensor({4, 32, 48, 48}, 2);
  const Tensor first = model.Run({{"x", x}})[0].second.Clone();
  const int64_t held = ThreadScratchBytes();
  ASSERT_GT(held, 0) << "no kernel of this plan used its thread's scratch: the test needs one that does";
  EXPECT_GE(SharedArenaBytes(), held) << "counted with the idle execution arenas";
  EXPECT_EQ(TrimThreadScratch(3600), 0u) << "used just now, not an hour ago";

  // While a run is in progress on another thread nothing is freed (its team may be using a block).
  std::promise<void> entered, leave;
  std::thread runner([&] {
    const ThreadScratch::InUse in_use;
    entered.set_value();
    leave.get_future().wait();
  });
  entered.get_future().wait();
  EXPECT_EQ(TrimThreadScratch(0), 0u);
  EXPECT_EQ(ThreadScratchBytes(), held);
  leave.set_value();
  runner.join();

  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(TrimThreadScratch(0.01), static_cast<size_t>(held)) << "unused since the first trim, 30 ms ago";
  EXPECT_EQ(ThreadScratchBytes(), 0);
  ExpectTensorNear(model.Run({{"x", x}})[0].second, first, 0, 0);  // the blocks grow again
  EXPECT_GT(ThreadScratchBytes(), 0);
}

TEST(ThreadScratch, BlockReservedOutsideARunIsKeptUntilUsedInOne) {
  TrimThreadScratch(0);
  const size_t bytes = size_t{1} << 20;
  std::promise<void> reserved, trimmed, reserved_in_run, trimmed_again;
  std::thread user([&] {
    ThreadScratch::Reserve(bytes);  // as a kernel run by hand: no InUse
    reserved.set_value();
    trimmed.get_future().wait();
    {
      const ThreadScratch::InUse in_use;
      ThreadScratch::Reserve(64);
    }
    reserved_in_run.set_value();
    trimmed_again.get_future().wait();
  });
  reserved.get_future().wait();
  EXPECT_EQ(TrimThreadScratch(0), 0u) << "the thread may still be using it";
  EXPECT_GE(ThreadScratchBytes(), static_cast<int64_t>(bytes));
  trimmed.set_value();
  reserved_in_run.get_future().wait();
  EXPECT_GE(TrimThreadScratch(0), bytes);
  EXPECT_EQ(ThreadScratchBytes(), 0);
  trimmed_again.set_value();
  user.join();

  std::thread([&] {
    const ThreadScratch::InUse in_use;
    ThreadScratch::Reserve(bytes);
  }).join();
  EXPECT_EQ(ThreadScratchBytes(), 0) << "a thread's block goes when the thread ends";
}

}  // namespace
}  // namespace osprey
