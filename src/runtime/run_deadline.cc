// RunDeadline: a per-thread deadline that runs check before each step (include/osprey/runtime.h).
#include <cstdio>

#include "osprey/error.h"
#include "osprey/runtime.h"

namespace osprey {
namespace {

thread_local const RunDeadline* t_deadline = nullptr;

}  // namespace

RunDeadline::RunDeadline(Clock::time_point at, std::string reason)
    : at_(at), set_(Clock::now()), reason_(std::move(reason)), outer_(t_deadline) {
  if (outer_ && outer_->at_ <= at_) {  // the earlier one applies
    at_ = outer_->at_;
    set_ = outer_->set_;
    reason_ = outer_->reason_;
  }
  t_deadline = this;
}

RunDeadline::~RunDeadline() { t_deadline = outer_; }

bool RunDeadline::Passed() { return t_deadline && Clock::now() >= t_deadline->at_; }

void RunDeadline::Throw(const std::string& where) {
  const RunDeadline* d = t_deadline;
  if (!d) throw Error(ErrorCode::kInternal, "RunDeadline::Throw without a deadline");
  char ms[32];
  std::snprintf(ms, sizeof ms, "%.1f", std::chrono::duration<double, std::milli>(Clock::now() - d->set_).count());
  throw Error(ErrorCode::kDeadlineExceeded,
              "deadline exceeded (" + d->reason_ + "): the run stopped after " + ms + " ms, before " + where);
}

}  // namespace osprey
