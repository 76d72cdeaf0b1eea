#include "ops/op_registry.h"

namespace osprey {

void RegisterImageOps(OpRegistry& r) {}

}  // namespace osprey
