// PreprocessSpec::dtype: an image model whose input is float16 or bfloat16 gets its preprocessed image in that type
// (computed in float32, then converted); a spec whose type differs from the model's input, or an input of another
// type, is refused naming both. Oracle: the float32 preprocessing of the same image, rounded by hand-checked
// conversions (FloatToHalf / FloatToBFloat16).
#include <gtest/gtest.h>

#include <string>

#include "osprey/classify.h"
#include "osprey/error.h"
#include "osprey/model_dir.h"

namespace osprey {
namespace {

Graph ImageGraph(DType dtype) {
  Graph g;
  g.input_infos.push_back(ValueInfo{"pixels", dtype, true, {Dim{-1, "N"}, Dim{3, ""}, Dim{8, ""}, Dim{8, ""}}});
  return g;
}

std::string CheckError(const PreprocessSpec& spec, const Graph& graph) {
  try {
    CheckPreprocessSpec(spec, graph);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  return "no error";
}

TEST(PreprocessDtype, DerivedFromTheInputAndChecked) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const Graph g = ImageGraph(dtype);
    const PreprocessSpec spec = DerivePreprocessSpec(g);
    EXPECT_EQ(spec.dtype, dtype);
    EXPECT_NO_THROW(CheckPreprocessSpec(spec, g));
  }
  PreprocessSpec f32 = DerivePreprocessSpec(ImageGraph(DType::kF32));
  EXPECT_NE(CheckError(f32, ImageGraph(DType::kF16)).find("makes float32 images, the model takes float16"),
            std::string::npos);
  EXPECT_NE(CheckError(f32, ImageGraph(DType::kI8)).find("expected float32, float16 or bfloat16"), std::string::npos);
}

TEST(PreprocessDtype, HalfImagesAreTheFloatOnesRounded) {
  PreprocessSpec spec = DerivePreprocessSpec(ImageGraph(DType::kF32));
  Tensor image(DType::kU8, {12, 10, 3});
  for (int64_t i = 0; i < image.numel(); ++i) image.data<uint8_t>()[i] = static_cast<uint8_t>((i * 37) % 256);
  const Tensor full = ImagePreprocessor(spec).Run(image);
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    spec.dtype = dtype;
    const Tensor half = ImagePreprocessor(spec).Run(image);
    ASSERT_EQ(half.dtype(), dtype);
    ASSERT_EQ(half.shape(), full.shape());
    int wrong = 0;
    for (int64_t i = 0; i < full.numel(); ++i) {
      const float v = full.data<float>()[i];
      wrong += half.data<uint16_t>()[i] != (dtype == DType::kF16 ? FloatToHalf(v) : FloatToBFloat16(v));
    }
    EXPECT_EQ(wrong, 0) << DTypeName(dtype);
  }
}

}  // namespace
}  // namespace osprey
