// RunDeadline: a per-thread deadline and cancel check that runs look at before each step (include/osprey/runtime.h).
#include <cstdio>

#include "osprey/error.h"
#include "osprey/runtime.h"

namespace osprey {
namespace {

thread_local const RunDeadline* t_deadline = nullptr;

}  // namespace

RunDeadline::RunDeadline(Clock::time_point at, std::string reason, std::function<bool()> cancelled,
                         std::string cancel_reason)
    : at_(at),
      set_(Clock::now()),
      reason_(std::move(reason)),
      cancelled_(std::move(cancelled)),
      cancel_reason_(std::move(cancel_reason)),
      outer_(t_deadline) {
  if (outer_ && outer_->at_ <= at_) {  // the earlier deadline applies (each cancel check applies: Passed)
    at_ = outer_->at_;
    reason_ = outer_->reason_;
  }
  t_deadline = this;
}

RunDeadline::~RunDeadline() { t_deadline = outer_; }

bool RunDeadline::Passed() {
  const RunDeadline* d = t_deadline;
  if (!d) return false;
  if (d->at_ != Clock::time_point::max() && Clock::now() >= d->at_) return true;
  for (; d; d = d->outer_)
    if (d->cancelled_ && d->cancelled_()) return true;
  return false;
}

void RunDeadline::Throw(const std::string& where) {
  const RunDeadline* d = t_deadline;
  if (!d) throw Error(ErrorCode::kInternal, "RunDeadline::Throw without a deadline");
  char ms[32];
  std::snprintf(ms, sizeof ms, "%.1f", std::chrono::duration<double, std::milli>(Clock::now() - d->set_).count());
  const std::string stopped = "the run stopped after " + std::string(ms) + " ms, before " + where;
  if (d->at_ == Clock::time_point::max() || Clock::now() < d->at_)
    for (const RunDeadline* c = d; c; c = c->outer_)
      if (c->cancelled_ && c->cancelled_())
        throw Error(ErrorCode::kCancelled, "cancelled (" + c->cancel_reason_ + "): " + stopped);
  throw Error(ErrorCode::kDeadlineExceeded, "deadline exceeded (" + d->reason_ + "): " + stopped);
}

}  // namespace osprey
