#include "kernels/reference/reference.h"

namespace osprey {

void AddElementwiseReferenceKernels(ReferenceKernelTable& t) {}

}  // namespace osprey
