#include "kernels/reference/reference.h"

namespace osprey {

void AddImageReferenceKernels(ReferenceKernelTable& t) {}

}  // namespace osprey
