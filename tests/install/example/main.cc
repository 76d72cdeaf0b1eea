// The README's library example, as a user would write it against the installed osprey: a graph built in code and
// run, then one augmentation pipeline applied to an image with a box. Prints what the test checks.
#include <cstdio>

#include "osprey/augment.h"
#include "osprey/runtime.h"

int main() {
  osprey::GraphBuilder b("prep");
  auto x = b.Input("x", osprey::DType::kF32, {-1, 3});
  b.Output(b.Op("Relu", {x}), "y");
  osprey::Model model(b.Finish());
  auto outputs = model.Run({{"x", osprey::Tensor::FromVector<float>({2, 3}, {-1, 2, -3, 4, -5, 6})}});
  const float* y = outputs[0].second.data<float>();
  std::printf("relu:");
  for (int i = 0; i < 6; ++i) std::printf(" %g", y[i]);
  std::printf("\n");

  using namespace osprey::augment;
  Pipeline p = Pipeline::FromSteps({{"HorizontalFlip", 1.0}});
  osprey::Tensor image = osprey::Tensor::Zeros(osprey::DType::kU8, {20, 40, 3});
  Sample out = p.Apply(Sample{image, {Object{0, 0, 10, 5, /*category=*/3}}}, /*seed=*/42);
  const Object& o = out.objects.at(0);
  std::printf("box: %g %g %g %g\n", o.x0, o.y0, o.x1, o.y1);
  return 0;
}
