#pragma once
/// Errors: one exception type with a code. Thrown inside the engine, caught at the CLI, server and API boundaries.
#include <stdexcept>
#include <string>

namespace osprey {

/// kDeadlineExceeded: a run stopped because its deadline passed; kCancelled: because whoever asked for it went away
/// (RunDeadline). Appended last: bindings index by code.
enum class ErrorCode {
  kInvalidArgument,
  kNotFound,
  kUnsupported,
  kResourceExhausted,
  kUnavailable,
  kInternal,
  kDeadlineExceeded,
  kCancelled
};

/// Short lowercase name of a code ("invalid argument", ...).
const char* ErrorCodeName(ErrorCode code);

/// The one exception type. `what()` is the user-facing message: it names the thing, what was expected, what was found.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace osprey

/// Broken invariant inside osprey (a bug, not bad input).
#define OSPREY_CHECK(cond)                                                                                     \
  do {                                                                                                         \
    if (!(cond))                                                                                               \
      throw ::osprey::Error(::osprey::ErrorCode::kInternal,                                                    \
                            std::string("internal check failed: " #cond " at ") + __FILE__ + ":" +             \
                                std::to_string(__LINE__));                                                     \
  } while (0)
