#include "kernels/reference/reference.h"

namespace osprey {

void AddReductionReferenceKernels(ReferenceKernelTable& t) {}

}  // namespace osprey
