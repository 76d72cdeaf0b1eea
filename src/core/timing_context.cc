#include "core/timing_context.h"

#include <cstdlib>

namespace osprey {
namespace {

// Whether a runtime has set the text, and the text.
struct Context {
  bool set = false;
  std::string text;
};

Context& Stored() {
  static Context context;
  return context;
}

}  // namespace

void SetTimingContext(std::string context) {
  Stored().set = true;
  Stored().text = std::move(context);
}

const std::string& TimingContext() {
  // No osprey runtime linked in: libgomp, which reads these once at load (a thread-safe static: compiles may run on
  // several threads at once).
  static const std::string libgomp = [] {
    std::string text = "libgomp";
    for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"})
      if (const char* v = std::getenv(name)) text += std::string(" ") + name + "=" + v;
    return text;
  }();
  const Context& c = Stored();
  return c.set ? c.text : libgomp;
}

}  // namespace osprey
