#pragma once
// Work buffers a kernel keeps between runs, one per concurrent run, at most kKept: a fresh block of a few MB is mapped
// and faulted in on every run otherwise (Whisper's 4.8 MB of STFT frames: 1.8 ms; an integer convolution's float
// copies: about as long as the convolution itself). Thread-safe.
#include <mutex>
#include <utility>
#include <vector>

namespace osprey::cpu {

template <class T>
class SparePool {
 public:
  static constexpr size_t kKept = 4;
  /// A kept one, or make() when none is idle.
  template <class Make>
  T Take(Make make) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!spare_.empty()) {
        T t = std::move(spare_.back());
        spare_.pop_back();
        return t;
      }
    }
    return make();
  }
  void Give(T t) {
    std::lock_guard<std::mutex> lock(mu_);
    if (spare_.size() < kKept) spare_.push_back(std::move(t));
  }

 private:
  std::mutex mu_;
  std::vector<T> spare_;
};

}  // namespace osprey::cpu
