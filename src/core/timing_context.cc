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
  Context& c = Stored();
  if (!c.set) {  // no osprey runtime linked in: libgomp, which reads these once at load
    c.set = true;
    c.text = "libgomp";
    for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"})
      if (const char* v = std::getenv(name)) c.text += std::string(" ") + name + "=" + v;
  }
  return c.text;
}

}  // namespace osprey
