#include "kernels/reference/reference.h"

namespace osprey {

void AddNnReferenceKernels(ReferenceKernelTable& t) {}

}  // namespace osprey
