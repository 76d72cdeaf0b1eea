#include "kernels/reference/reference.h"

namespace osprey {

void AddShapeReferenceKernels(ReferenceKernelTable& t) {}

}  // namespace osprey
