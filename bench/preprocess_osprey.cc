// Image preprocessing benchmark, osprey side (bench/preprocess drives it and runs the Pillow and OpenCV pipelines).
// Reads one JPEG into memory once, then per iteration: DecodeImage with the DCT-scaling hint (the decoded image stays
// at least as large as the resize target), then the model-style preprocessing through ImagePreprocessor (resize the
// shorter side to round(size / 0.875) bilinear with antialias, centre crop size x size, ImageNet normalisation, CHW
// float32). Prints one JSON line: median/mean/min ms per image (decode + preprocess), decode-only and preprocess-only
// medians, the decoded size, the output shape and a checksum. --npy FILE writes the last output tensor.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "osprey/classify.h"
#include "osprey/image.h"
#include "osprey/npy.h"

using namespace osprey;

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double Ms(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"osprey image preprocessing benchmark: JPEG bytes -> normalised CHW float32 tensor (one JSON line)"};
  int size = 224, iters = 50, warmup = 5, threads = 1;
  std::string path, npy_path;
  app.add_option("--size", size, "crop size (the model input is size x size)")->capture_default_str();
  app.add_option("--iters", iters, "timed iterations")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed iterations first (the first compiles the plan)")->capture_default_str();
  app.add_option("--threads", threads, "intra-op threads")->capture_default_str();
  app.add_option("--npy", npy_path, "write the last output tensor here (.npy)");
  app.add_option("file", path, "JPEG file")->required();
  CLI11_PARSE(app, argc, argv);
  if (size < 1 || iters < 1 || warmup < 0 || threads < 1) {
    std::fprintf(stderr, "preprocess_osprey: --size, --iters and --threads must be >= 1, --warmup >= 0\n");
    return 2;
  }
  try {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(ErrorCode::kNotFound, path + ": cannot open");
    const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());

    PreprocessSpec spec;
    spec.input = "image";
    spec.resize_mode = "bilinear";
    spec.resize = "shorter";
    spec.resize_size = std::llround(size / 0.875);  // 224 -> 256, 299 -> 342 (torchvision's ImageNet recipe)
    spec.crop_height = size;
    spec.crop_width = size;
    spec.color = "RGB";
    spec.scale = 1.0f / 255.0f;
    spec.mean = {0.485f, 0.456f, 0.406f};
    spec.std = {0.229f, 0.224f, 0.225f};
    spec.layout = "NCHW";
    CompileOptions co;
    co.num_threads = threads;
    ImagePreprocessor pre(spec, co);

    DecodeOptions decode;
    decode.channels = 3;
    decode.min_width = spec.resize_size;  // DCT hint: the decoded shorter side stays >= the resize target
    decode.min_height = spec.resize_size;

    std::vector<double> total, dec, prep;
    Tensor out, image;
    DecodeInfo info;
    for (int i = 0; i < warmup + iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      image = DecodeImage(bytes.data(), bytes.size(), decode, &info);
      const auto t1 = std::chrono::steady_clock::now();
      out = pre.Run(image);
      const auto t2 = std::chrono::steady_clock::now();
      if (i >= warmup) {
        total.push_back(Ms(t0, t2));
        dec.push_back(Ms(t0, t1));
        prep.push_back(Ms(t1, t2));
      }
    }
    if (out.dtype() != DType::kF32 || out.shape() != Shape{3, size, size})
      throw Error(ErrorCode::kInternal, "expected a float32 [3, " + std::to_string(size) + ", " +
                                            std::to_string(size) + "] tensor, found " + DTypeName(out.dtype()) + " " +
                                            ShapeToString(out.shape()));
    double sum = 0, abs_sum = 0;
    const float* p = out.data<float>();
    for (int64_t i = 0; i < out.numel(); ++i) {
      sum += p[i];
      abs_sum += std::fabs(p[i]);
    }
    if (!npy_path.empty()) WriteNpy(npy_path, out);
    std::printf(
        "{\"file\": \"%s\", \"size\": %d, \"threads\": %d, \"warmup\": %d, \"iters\": %d, \"median_ms\": %.4f, "
        "\"mean_ms\": %.4f, \"min_ms\": %.4f, \"decode_median_ms\": %.4f, \"preprocess_median_ms\": %.4f, "
        "\"stored\": [%lld, %lld], \"decoded\": [%lld, %lld], \"dct_scale\": \"%d/%d\", \"shape\": \"%s\", "
        "\"checksum\": %.6f, \"abs_checksum\": %.6f}\n",
        path.c_str(), size, threads, warmup, iters, Median(total), Mean(total),
        *std::min_element(total.begin(), total.end()), Median(dec), Median(prep),
        static_cast<long long>(info.stored_width), static_cast<long long>(info.stored_height),
        static_cast<long long>(image.dim(1)), static_cast<long long>(image.dim(0)), info.scale_num, info.scale_denom,
        ShapeToString(out.shape()).c_str(), sum, abs_sum);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "preprocess_osprey: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
