// Pad with pads known at compile time (the reference kernel copies element by element). Constant mode: rows of the
// output are a run of the fill value, one memcpy of the input row and another run of the fill. Edge, reflect and
// wrap: PadIndexedKernel below. Any dtype and rank;
// rank-4 float32 padded along H and W only also runs on channels-last data (the layout pass keeps such a Pad between
// a convolution and the pooling after it channels-last: TF's "same" padding before a MaxPool, ResNetV2's stem).
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "ops/op_registry.h"
#include "ops/pad.h"

namespace osprey {
namespace {

constexpr int64_t kMinParallelBytes = int64_t{1} << 18;

// The fill value's bytes of a Pad node (zero unless given), or false when it is not known at compile time or its
// type differs from the data's.
bool PadFill(const KernelBuildContext& ctx, std::vector<char>* fill) {
  const size_t es = DTypeSize(ctx.input_dtypes[0]);
  fill->assign(es, 0);
  if (ctx.opset < 11) {
    const float value = ctx.node.GetFloat("value", 0.f);
    if (ctx.input_dtypes[0] != DType::kF32 && value != 0.f) return false;
    std::memcpy(fill->data(), &value, std::min(es, sizeof value));
  } else if (ctx.present.size() > 2 && ctx.present[2]) {
    if (ctx.input_values[2] == nullptr) return false;
    if (ctx.input_values[2]->numel() == 0) return true;
    if (ctx.input_values[2]->dtype() != ctx.input_dtypes[0]) return false;
    std::memcpy(fill->data(), ctx.input_values[2]->raw(), es);
  }
  return true;
}

// Begin and end pads per axis (ONNX order) of a constant-mode Pad whose pads, value and axes are compile-time
// constants (ops/pad.h reads them), none negative, and its fill value's bytes; false otherwise.
bool ConstantPads(const KernelBuildContext& ctx, std::vector<int64_t>* begin, std::vector<int64_t>* end,
                  std::vector<char>* fill) {
  if (ctx.input_shapes.empty() || !ctx.present[0] || ctx.output_shapes.size() != 1) return false;
  if (ctx.node.GetString("mode", "constant") != "constant") return false;
  const int64_t rank = static_cast<int64_t>(ctx.input_shapes[0].size());
  const size_t es = DTypeSize(ctx.input_dtypes[0]);
  if (rank < 1 || es == 0 || es > 8) return false;
  auto known = [&](int i) { return i < static_cast<int>(ctx.present.size()) && ctx.present[i]; };
  for (int i = 1; i < static_cast<int>(ctx.present.size()); ++i)
    if (known(i) && ctx.input_values[i] == nullptr) return false;
  if (!PadFill(ctx, fill)) return false;
  PadAmounts pads;
  try {
    if (!ReadPadAmounts(ctx.node, ctx.opset, rank, [&](int i) { return known(i) ? ctx.input_values[i] : nullptr; },
                        &pads))
      return false;
  } catch (const Error&) {
    return false;  // the reference kernel reports it
  }
  const Shape& in = ctx.input_shapes[0];
  const Shape& out = ctx.output_shapes[0];
  if (static_cast<int64_t>(out.size()) != rank) return false;
  for (int64_t d = 0; d < rank; ++d)
    if (pads.begin[d] < 0 || pads.end[d] < 0 || out[d] != in[d] + pads.begin[d] + pads.end[d]) return false;
  *begin = std::move(pads.begin), *end = std::move(pads.end);
  return true;
}

// Rank-4 float32 padded along H and W only: the same copy on the channels-last bytes.
bool SpatialOnly(const KernelBuildContext& ctx, const std::vector<int64_t>& begin, const std::vector<int64_t>& end) {
  return ctx.input_dtypes[0] == DType::kF32 && begin.size() == 4 && begin[0] == 0 && end[0] == 0 && begin[1] == 0 &&
         end[1] == 0;
}

// The copy on a physical shape: dims after the last padded one are one contiguous block; each output row along the
// last padded dim is fill, the input row, fill; rows whose outer index lies in a pad are all fill.
class PadConstantKernel final : public Kernel {
 public:
  PadConstantKernel(const char* name, const Shape& in, std::vector<int64_t> begin, std::vector<int64_t> end,
                    std::vector<char> fill)
      : name_(name), in_(in), begin_(std::move(begin)), end_(std::move(end)), fill_(std::move(fill)) {
    const int64_t rank = static_cast<int64_t>(in_.size());
    last_ = rank - 1;
    while (last_ > 0 && begin_[last_] == 0 && end_[last_] == 0) --last_;
    block_ = static_cast<int64_t>(fill_.size());
    for (int64_t d = last_ + 1; d < rank; ++d) block_ *= in_[d];
    zero_fill_ = true;
    for (char c : fill_) zero_fill_ = zero_fill_ && c == 0;
    outer_ = 1;
    in_bytes_ = out_bytes_ = static_cast<int64_t>(fill_.size());
    for (int64_t d = 0; d < rank; ++d) {
      if (d < last_) outer_ *= in_[d] + begin_[d] + end_[d];
      in_bytes_ *= in_[d], out_bytes_ *= in_[d] + begin_[d] + end_[d];
    }
  }
  const char* Name() const override { return name_; }

  void Run(KernelContext& ctx) override {
    const Tensor& x = ctx.In(0);
    Tensor& y = ctx.Out(0);
    if (static_cast<int64_t>(x.nbytes()) != in_bytes_ || static_cast<int64_t>(y.nbytes()) != out_bytes_)
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": " + name_ + ": tensor sizes changed");
    if (out_bytes_ == 0) return;
    const char* src = static_cast<const char*>(x.raw());
    char* dst = static_cast<char*>(y.raw());
    const int64_t row_in = in_[last_] * block_, head = begin_[last_] * block_, tail = end_[last_] * block_;
    const int64_t row_out = head + row_in + tail;
#pragma omp parallel for schedule(static) if (out_bytes_ >= kMinParallelBytes && outer_ > 1)
    for (int64_t o = 0; o < outer_; ++o) {
      // The input row of output row o, or -1 when o lies in a pad of an outer dim.
      int64_t rest = o, row = 0, stride = 1;
      bool inside = true;
      for (int64_t d = last_ - 1; d >= 0; --d) {
        const int64_t size = in_[d] + begin_[d] + end_[d], i = rest % size - begin_[d];
        rest /= size;
        inside = inside && i >= 0 && i < in_[d];
        row += i * stride;
        stride *= in_[d];
      }
      char* out = dst + o * row_out;
      if (!inside) {
        Fill(out, row_out);
        continue;
      }
      Fill(out, head);
      if (row_in) std::memcpy(out + head, src + row * row_in, row_in);
      Fill(out + head + row_in, tail);
    }
  }

 private:
  void Fill(char* p, int64_t bytes) const {
    if (bytes <= 0) return;
    if (zero_fill_) {
      std::memset(p, 0, bytes);
      return;
    }
    const int64_t es = static_cast<int64_t>(fill_.size());
    for (int64_t i = 0; i < bytes; i += es) std::memcpy(p + i, fill_.data(), es);
  }

  const char* name_;
  Shape in_;  // physical
  std::vector<int64_t> begin_, end_;
  std::vector<char> fill_;
  int64_t last_ = 0, block_ = 0, outer_ = 1, in_bytes_ = 0, out_bytes_ = 0;
  bool zero_fill_ = true;
};

// Pad with pads known when compiled, in plain layout, that PadConstantKernel does not take: modes edge, reflect and
// wrap, and negative pads (crops) in any mode. Each output row (all dims but the last) reads one input row, found
// through per-axis tables of source indices (ops/pad.h's PadSourceTable, the reference kernel's rule), or is all fill;
// within it, the head and tail are element copies through the last axis's table and the middle is one memcpy.
// Whisper's front end reflects 200 samples at each end of a 480,000-sample row; Kaldi's shifts a row by one
// (pads [0, 1, 0, -1], edge): the reference kernel copied element by element.
class PadIndexedKernel final : public Kernel {
 public:
  PadIndexedKernel(const Shape& in, std::vector<std::vector<int64_t>> source, int64_t last_begin,
                   std::vector<char> fill)
      : in_(in), es_(static_cast<int64_t>(fill.size())), source_(std::move(source)), fill_(std::move(fill)) {
    const int64_t rank = static_cast<int64_t>(in_.size());
    for (const auto& table : source_) out_.push_back(static_cast<int64_t>(table.size()));
    // The last axis: positions [head_, head_ + kept_) read input [first_, first_ + kept_) (a memcpy); the others
    // (the head and the tail) keep their table entries in edges_, the rest of its table goes (a long row's would be
    // twice the output's bytes).
    std::vector<int64_t> last;
    last.swap(source_[rank - 1]);
    head_ = std::max<int64_t>(0, last_begin);
    first_ = std::max<int64_t>(0, -last_begin);
    kept_ = 0;
    while (head_ + kept_ < out_[rank - 1] && last[head_ + kept_] == first_ + kept_) ++kept_;
    edges_.assign(last.begin(), last.begin() + head_);
    edges_.insert(edges_.end(), last.begin() + head_ + kept_, last.end());
    rows_ = 1;
    for (int64_t d = 0; d + 1 < rank; ++d) rows_ *= out_[d];
    in_bytes_ = out_bytes_ = es_;
    for (int64_t d = 0; d < rank; ++d) in_bytes_ *= in_[d], out_bytes_ *= out_[d];
  }
  const char* Name() const override { return "PadIndexed"; }

  void Run(KernelContext& ctx) override {
    const Tensor& x = ctx.In(0);
    Tensor& y = ctx.Out(0);
    if (static_cast<int64_t>(x.nbytes()) != in_bytes_ || static_cast<int64_t>(y.nbytes()) != out_bytes_)
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": " + Name() + ": tensor sizes changed");
    if (out_bytes_ == 0) return;
    const char* src = static_cast<const char*>(x.raw());
    char* dst = static_cast<char*>(y.raw());
    const int64_t rank = static_cast<int64_t>(in_.size()), n = in_[rank - 1], width = out_[rank - 1];
    const int64_t* edges = edges_.data();
    const int64_t tail = kept_;  // output o of the tail has its entry at edges[o - tail]
    const char* fill = fill_.data();
#pragma omp parallel for schedule(static) if (out_bytes_ >= kMinParallelBytes && rows_ > 1)
    for (int64_t r = 0; r < rows_; ++r) {
      int64_t rest = r, row = 0, stride = 1;
      bool inside = true;
      for (int64_t d = rank - 2; d >= 0; --d) {
        const int64_t s = source_[d][rest % out_[d]];
        inside = inside && s >= 0;
        row += s * stride;
        rest /= out_[d];
        stride *= in_[d];
      }
      const char* in_row = src + row * n * es_;
      char* out_row = dst + r * width * es_;
      auto put = [&](int64_t o, int64_t source) {
        std::memcpy(out_row + o * es_, inside && source >= 0 ? in_row + source * es_ : fill, es_);
      };
      if (!inside) {  // a row in a pad of an outer axis (mode constant): all fill
        for (int64_t o = 0; o < width; ++o) put(o, -1);
        continue;
      }
      for (int64_t o = 0; o < head_; ++o) put(o, edges[o]);
      std::memcpy(out_row + head_ * es_, in_row + first_ * es_, static_cast<size_t>(kept_ * es_));
      for (int64_t o = head_ + kept_; o < width; ++o) put(o, edges[o - tail]);
    }
  }

 private:
  Shape in_, out_;
  int64_t es_;
  std::vector<std::vector<int64_t>> source_;  // per axis but the last, per output index: the input index read, or -1
  std::vector<int64_t> edges_;                // the last axis's head entries, then its tail's
  std::vector<char> fill_;
  int64_t head_ = 0, first_ = 0, kept_ = 0, rows_ = 1, in_bytes_ = 0, out_bytes_ = 0;
};

// A plain-layout Pad that PadIndexedKernel runs: pads and fill known, every axis's table buildable (the reference
// kernel reports the errors), output not empty.
std::unique_ptr<Kernel> CreatePadIndexed(const KernelBuildContext& ctx) {
  const std::string mode = ctx.node.GetString("mode", "constant");
  if (mode != "constant" && mode != "edge" && mode != "reflect" && mode != "wrap") return nullptr;
  if (ctx.input_shapes.empty() || !ctx.present[0] || ctx.output_shapes.size() != 1) return nullptr;
  if (ctx.InLayout(0) != Layout::kPlain || ctx.OutLayout(0) != Layout::kPlain) return nullptr;
  const Shape& in = ctx.input_shapes[0];
  const int64_t rank = static_cast<int64_t>(in.size());
  const size_t es = DTypeSize(ctx.input_dtypes[0]);
  if (rank < 1 || es == 0 || es > 8) return nullptr;
  for (int i = 1; i < static_cast<int>(ctx.present.size()); ++i)
    if (ctx.present[i] && ctx.input_values[i] == nullptr) return nullptr;
  std::vector<char> fill;
  if (!PadFill(ctx, &fill)) return nullptr;
  PadAmounts pads;
  try {
    if (!ReadPadAmounts(
            ctx.node, ctx.opset, rank,
            [&](int i) {
              return i < static_cast<int>(ctx.present.size()) && ctx.present[i] ? ctx.input_values[i] : nullptr;
            },
            &pads))
      return nullptr;
  } catch (const Error&) {
    return nullptr;  // the reference kernel reports it
  }
  const Shape& out = ctx.output_shapes[0];
  if (static_cast<int64_t>(out.size()) != rank) return nullptr;
  for (int64_t d = 0; d < rank; ++d)  // before any table: no work (a table as long as a huge pad), or an error
    if (out[d] <= 0 || out[d] != in[d] + pads.begin[d] + pads.end[d]) return nullptr;
  std::vector<std::vector<int64_t>> source(rank);
  for (int64_t d = 0; d < rank; ++d) {
    source[d] = PadSourceTable(mode, in[d], pads.begin[d], pads.end[d]);
    if (static_cast<int64_t>(source[d].size()) != out[d]) return nullptr;  // the reference kernel reports it
  }
  return std::make_unique<PadIndexedKernel>(in, std::move(source), pads.begin[rank - 1], std::move(fill));
}

}  // namespace

std::unique_ptr<Kernel> CreatePadKernel(const KernelBuildContext& ctx) {
  std::vector<int64_t> begin, end;
  std::vector<char> fill;
  if (!ConstantPads(ctx, &begin, &end, &fill)) return CreatePadIndexed(ctx);
  const bool nhwc_in = ctx.InLayout(0) == Layout::kNhwc, nhwc_out = ctx.OutLayout(0) == Layout::kNhwc;
  if (nhwc_in != nhwc_out) return nullptr;
  if (!nhwc_in)
    return std::make_unique<PadConstantKernel>("PadConstant", ctx.input_shapes[0], std::move(begin), std::move(end),
                                               std::move(fill));
  if (!SpatialOnly(ctx, begin, end)) return nullptr;
  const Shape& s = ctx.input_shapes[0];
  return std::make_unique<PadConstantKernel>("PadConstantNhwc", Shape{s[0], s[2], s[3], s[1]},
                                             std::vector<int64_t>{0, begin[2], begin[3], 0},
                                             std::vector<int64_t>{0, end[2], end[3], 0}, std::move(fill));
}

bool PadFollowsNhwc(const KernelBuildContext& ctx) {
  std::vector<int64_t> begin, end;
  std::vector<char> fill;
  return ConstantPads(ctx, &begin, &end, &fill) && SpatialOnly(ctx, begin, end);
}

}  // namespace osprey
