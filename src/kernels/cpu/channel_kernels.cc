// Fast data-movement kernels along the channel axis: Concat, Slice and Split of channels, and the internal
// _ChannelShuffle (src/ops/internal_ops.cc). Each is one pass of copies prepared at compile time, in one of two forms:
//   plain:    every input and output in ONNX order; a channel range of one batch item is one contiguous block, so
//             the kernels are block memcpys (Concat also handles any axis, rank and dtype this way);
//   channels-last (NHWC, rank-4 float32): every tensor stored as [N, H, W, C]; each pixel holds a contiguous row of
//             channels, so the kernels copy (or, for the shuffle, interleave) channel runs pixel by pixel.
// Mixed layouts are not handled: the layout pass (src/runtime/layout.cc) makes these nodes channels-last only when
// every tensor input is, and CpuKernelFollowsNhwc says which nodes qualify. Work is split over OpenMP threads by
// batch items (plain) or pixels (NHWC) once a copy is large enough to pay for the parallel region. A Slice that cuts
// H, W or the batch too (unit steps: crops such as Keras' Cropping2D) follows channels-last as well, copying one run
// per output row (SliceBoxNhwc); plain, any Slice whose arguments are known when compiled copies the runs of its
// strided view (SlicePlain). Gather of plain data along any axis copies one run per (outer index, index)
// (GatherPlain).
#include <emmintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "ops/op_registry.h"
#include "ops/slice.h"

namespace osprey {
namespace {

// Below this many bytes moved, one thread does the copy: a parallel region costs a few microseconds.
constexpr int64_t kMinParallelBytes = int64_t{1} << 18;

char* Bytes(Tensor& t) { return static_cast<char*>(t.raw()); }
const char* Bytes(const Tensor& t) { return static_cast<const char*>(t.raw()); }

bool IsF32Rank4(DType dtype, const Shape& shape) { return dtype == DType::kF32 && shape.size() == 4; }

// All tensor inputs and outputs in one layout: *nhwc says which. False when they are mixed.
bool UniformLayout(const KernelBuildContext& ctx, size_t num_tensor_inputs, bool* nhwc) {
  const Layout first = ctx.InLayout(0);
  for (size_t i = 0; i < num_tensor_inputs; ++i)
    if (ctx.InLayout(static_cast<int>(i)) != first) return false;
  for (size_t j = 0; j < ctx.output_shapes.size(); ++j)
    if (ctx.OutLayout(static_cast<int>(j)) != first) return false;
  *nhwc = first == Layout::kNhwc;
  return true;
}

[[noreturn]] void Internal(const Node& node, const char* kernel, const std::string& what) {
  throw Error(ErrorCode::kInternal, node.Describe() + ": " + kernel + ": " + what);
}

void CheckBytes(const Node& node, const char* kernel, const char* what, const Tensor& t, size_t expected) {
  if (t.nbytes() != expected || (expected && t.raw() == nullptr))
    Internal(
        node, kernel,
        std::string(what) + " holds " + std::to_string(t.nbytes()) + " bytes, expected " + std::to_string(expected));
}

// n runs of `run` bytes, run i copied from src(i) to dst(i): a fixed-size copy (no call) for runs of up to 16 bytes,
// where a memcpy call per run would cost more than the copy (RAFT's [.., 2] coordinates split and concatenated).
template <class Src, class Dst>
void CopyRuns(int64_t run, int64_t n, Src src, Dst dst) {
  auto fixed = [&](auto bytes) {
    for (int64_t i = 0; i < n; ++i) std::memcpy(dst(i), src(i), bytes);
  };
  switch (run) {
    case 4:
      return fixed(std::integral_constant<size_t, 4>());
    case 8:
      return fixed(std::integral_constant<size_t, 8>());
    case 12:
      return fixed(std::integral_constant<size_t, 12>());
    case 16:
      return fixed(std::integral_constant<size_t, 16>());
    default:
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst(i), src(i), static_cast<size_t>(run));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Concat and Split, plain, along any axis, rank and dtype: for each index of the axes before `axis` ("outer"), part i
// (Concat's input i, Split's output i) is one contiguous block of the whole tensor's row (Split: LeViT's q, k, v).
class PlainBlocks final : public Kernel {
 public:
  PlainBlocks(bool split, std::vector<size_t> part_bytes, int64_t outer)
      : split_(split), part_bytes_(std::move(part_bytes)), outer_(outer) {
    for (size_t b : part_bytes_) row_bytes_ += b, small_parts_ = small_parts_ && b <= kSmallPartBytes;
  }
  const char* Name() const override { return split_ ? "SplitPlain" : "ConcatPlain"; }
  void Run(KernelContext& ctx) override {
    const int64_t k = static_cast<int64_t>(part_bytes_.size());
    if (static_cast<int64_t>(split_ ? ctx.outputs.size() : ctx.inputs.size()) != k)
      Internal(ctx.node, Name(), "part count changed");
    std::vector<char*> out_part(k);       // Split's outputs
    std::vector<const char*> in_part(k);  // Concat's inputs
    for (int64_t i = 0; i < k; ++i) {
      const int index = static_cast<int>(i);
      if (split_) {
        CheckBytes(ctx.node, Name(), "output", ctx.Out(index), part_bytes_[i] * outer_);
        out_part[i] = Bytes(ctx.Out(index));
      } else {
        CheckBytes(ctx.node, Name(), "input", ctx.In(index), part_bytes_[i] * outer_);
        in_part[i] = Bytes(ctx.In(index));
      }
    }
    CheckBytes(ctx.node, Name(), split_ ? "input" : "output", split_ ? ctx.In(0) : ctx.Out(0), row_bytes_ * outer_);
    const char* whole_in = split_ ? Bytes(ctx.In(0)) : nullptr;
    char* whole_out = split_ ? nullptr : Bytes(ctx.Out(0));
    const size_t total = row_bytes_ * static_cast<size_t>(outer_);
    // Each thread copies an equal share of the whole tensor's bytes, whichever parts and rows it crosses: parts of
    // unequal sizes (a Concat of 64, 32 and 32 channels) or a single row (one image) still keep every thread busy.
    auto copy = [&](size_t begin, size_t end) {
      if (begin >= end) return;
      size_t o = begin / row_bytes_, at = begin - o * row_bytes_;  // row o, byte `at` of part i
      int64_t i = 0;
      while (at >= part_bytes_[i]) at -= part_bytes_[i++];
      while (begin < end) {  // then part after part: one step per part, however many parts
        const size_t n = std::min(part_bytes_[i] - at, end - begin);
        if (split_)
          std::memcpy(out_part[i] + o * part_bytes_[i] + at, whole_in + begin, n);
        else
          std::memcpy(whole_out + begin, in_part[i] + o * part_bytes_[i] + at, n);
        begin += n;
        at += n;
        if (at == part_bytes_[i]) {
          at = 0;
          if (++i == k) i = 0, ++o;
        }
      }
    };
    if (total == 0) return;
    const bool parallel = static_cast<int64_t>(total) >= kMinParallelBytes && omp_get_max_threads() > 1;
    if (small_parts_) {  // part by part, a fixed-size copy per row
      auto rows = [&](int64_t o0, int64_t o1) {
        size_t at = 0;
        for (int64_t i = 0; i < k; ++i) {
          const size_t p = part_bytes_[i], row = row_bytes_;
          if (p == 0) continue;
          if (split_)
            CopyRuns(
                static_cast<int64_t>(p), o1 - o0, [&](int64_t o) { return whole_in + (o0 + o) * row + at; },
                [&](int64_t o) { return out_part[i] + (o0 + o) * p; });
          else
            CopyRuns(
                static_cast<int64_t>(p), o1 - o0, [&](int64_t o) { return in_part[i] + (o0 + o) * p; },
                [&](int64_t o) { return whole_out + (o0 + o) * row + at; });
          at += p;
        }
      };
      if (!parallel) return rows(0, outer_);
#pragma omp parallel
      {
        const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        rows(outer_ * t / threads, outer_ * (t + 1) / threads);
      }
      return;
    }
    if (!parallel) return copy(0, total);
#pragma omp parallel
    {
      const size_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      copy(total * t / threads, total * (t + 1) / threads);
    }
  }

 private:
  bool split_;
  std::vector<size_t> part_bytes_;
  // Parts of at most this many bytes per row are copied part by part with fixed-size copies instead of one memcpy
  // call per part and row.
  static constexpr size_t kSmallPartBytes = 16;
  int64_t outer_;
  size_t row_bytes_ = 0;
  bool small_parts_ = true;
};

// Concat, channels-last: per pixel, input i's C_i floats go to channels [first_i, first_i + C_i) of the output row.
class ConcatNhwc final : public Kernel {
 public:
  ConcatNhwc(std::vector<int64_t> channels, int64_t pixels) : channels_(std::move(channels)), pixels_(pixels) {
    for (int64_t c : channels_) total_ += c;
  }
  const char* Name() const override { return "ConcatF32Nhwc"; }
  void Run(KernelContext& ctx) override {
    const size_t k = channels_.size();
    if (ctx.inputs.size() != k) Internal(ctx.node, Name(), "input count changed");
    std::vector<const float*> src(k);
    for (size_t i = 0; i < k; ++i) {
      CheckBytes(ctx.node, Name(), "input", ctx.In(static_cast<int>(i)), pixels_ * channels_[i] * sizeof(float));
      src[i] = ctx.In(static_cast<int>(i)).data<float>();
    }
    CheckBytes(ctx.node, Name(), "output", ctx.Out(0), pixels_ * total_ * sizeof(float));
    float* dst = ctx.Out(0).data<float>();
    const bool parallel = pixels_ * total_ * static_cast<int64_t>(sizeof(float)) >= kMinParallelBytes;
    if (!parallel || omp_get_max_threads() == 1) {
      CopyPixels(src.data(), dst, 0, pixels_);
      return;
    }
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      CopyPixels(src.data(), dst, pixels_ * t / threads, pixels_ * (t + 1) / threads);
    }
  }

 private:
  // Pixels [begin, end): a plain function so the single-threaded path keeps its loop state in registers.
  void CopyPixels(const float* const* src, float* dst, int64_t begin, int64_t end) const {
    const size_t k = channels_.size();
    for (int64_t p = begin; p < end; ++p) {
      float* row = dst + p * total_;
      for (size_t i = 0; i < k; ++i) {
        const int64_t c = channels_[i];
        std::memcpy(row, src[i] + p * c, static_cast<size_t>(c) * sizeof(float));
        row += c;
      }
    }
  }

  std::vector<int64_t> channels_;
  int64_t pixels_;
  int64_t total_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// Slice / Split along the channels of a rank-4 float32 tensor: output j takes channels [first_j, first_j + count_j).
class ChannelRanges final : public Kernel {
 public:
  ChannelRanges(const char* name, bool nhwc, Shape in_shape, std::vector<int64_t> first, std::vector<int64_t> count)
      : name_(name), nhwc_(nhwc), in_shape_(std::move(in_shape)), first_(std::move(first)), count_(std::move(count)) {}
  const char* Name() const override { return name_; }
  void Run(KernelContext& ctx) override {
    const int64_t n = in_shape_[0], c = in_shape_[1], hw = in_shape_[2] * in_shape_[3];
    CheckBytes(ctx.node, name_, "input", ctx.In(0), n * c * hw * sizeof(float));
    const float* src = ctx.In(0).data<float>();
    std::vector<float*> dst(first_.size(), nullptr);
    int64_t moved = 0;
    for (size_t j = 0; j < first_.size(); ++j) {
      if (ctx.outputs[j] == nullptr) continue;
      CheckBytes(ctx.node, name_, "output", ctx.Out(static_cast<int>(j)), n * count_[j] * hw * sizeof(float));
      dst[j] = ctx.Out(static_cast<int>(j)).data<float>();
      moved += n * count_[j] * hw * static_cast<int64_t>(sizeof(float));
    }
    const bool parallel = moved >= kMinParallelBytes && omp_get_max_threads() > 1;
    if (nhwc_) {
      // One pass over the pixels for all outputs (each input row read once), in one parallel region.
      const int64_t pixels = n * hw;
      if (!parallel) {
        CopyPixels(src, dst.data(), c, 0, pixels);
        return;
      }
#pragma omp parallel
      {
        const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        CopyPixels(src, dst.data(), c, pixels * t / threads, pixels * (t + 1) / threads);
      }
      return;
    }
    const int64_t tasks = n * static_cast<int64_t>(first_.size());
#pragma omp parallel for schedule(static) if (parallel && tasks > 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t b = t / static_cast<int64_t>(first_.size());
      const size_t j = static_cast<size_t>(t % static_cast<int64_t>(first_.size()));
      if (dst[j] == nullptr) continue;
      const int64_t count = count_[j];
      std::memcpy(dst[j] + b * count * hw, src + (b * c + first_[j]) * hw,
                  static_cast<size_t>(count * hw) * sizeof(float));
    }
  }

 private:
  // Channels-last pixels [begin, end): output j's channels of each pixel, a plain function so the single-threaded
  // path keeps its loop state in registers.
  void CopyPixels(const float* src, float* const* dst, int64_t c, int64_t begin, int64_t end) const {
    const size_t k = first_.size();
    for (int64_t p = begin; p < end; ++p) {
      const float* row = src + p * c;
      for (size_t j = 0; j < k; ++j) {
        if (dst[j] == nullptr) continue;
        const int64_t count = count_[j];
        std::memcpy(dst[j] + p * count, row + first_[j], static_cast<size_t>(count) * sizeof(float));
      }
    }
  }

  const char* name_;
  bool nhwc_;
  Shape in_shape_;
  std::vector<int64_t> first_, count_;
};

// ---------------------------------------------------------------------------------------------------------------
// _ChannelShuffle. Built from a table giving, for every shuffled channel, the input and the input channel it copies.
struct ChannelSource {
  int input;
  int64_t channel;
};

// Channels-last shuffles keep one row pointer per input on the stack.
constexpr size_t kMaxShuffleInputs = 16;

// dst[2m] = a[m], dst[2m + 1] = b[m] for m < pairs: the two-group shuffle of channels-last rows.
inline void Interleave(const float* a, const float* b, int64_t pairs, float* dst) {
  int64_t m = 0;
  for (; m + 4 <= pairs; m += 4) {
    const __m128 va = _mm_loadu_ps(a + m), vb = _mm_loadu_ps(b + m);
    _mm_storeu_ps(dst + 2 * m, _mm_unpacklo_ps(va, vb));
    _mm_storeu_ps(dst + 2 * m + 4, _mm_unpackhi_ps(va, vb));
  }
  for (; m < pairs; ++m) {
    dst[2 * m] = a[m];
    dst[2 * m + 1] = b[m];
  }
}

class ChannelShuffle final : public Kernel {
 public:
  ChannelShuffle(bool nhwc, size_t element_bytes, int64_t batch, int64_t inner, std::vector<int64_t> in_channels,
                 std::vector<int64_t> out_channels, int64_t groups)
      : nhwc_(nhwc),
        element_bytes_(element_bytes),
        batch_(batch),
        inner_(inner),
        in_channels_(std::move(in_channels)),
        out_channels_(std::move(out_channels)) {
    int64_t total = 0;
    for (int64_t c : in_channels_) total += c;
    const int64_t per_group = total / groups;
    std::vector<ChannelSource> concat;  // channel of the concatenated inputs -> source
    for (size_t i = 0; i < in_channels_.size(); ++i)
      for (int64_t c = 0; c < in_channels_[i]; ++c) concat.push_back({static_cast<int>(i), c});
    int64_t k = 0;
    for (int64_t count : out_channels_) {
      std::vector<ChannelSource> table;
      for (int64_t j = 0; j < count; ++j, ++k) table.push_back(concat[(k % groups) * per_group + k / groups]);
      tables_.push_back(std::move(table));
    }
    // Channels-last rows of a two-group shuffle interleave two contiguous channel runs.
    for (const std::vector<ChannelSource>& t : tables_) {
      bool interleaved = t.size() % 2 == 0 && !t.empty();
      for (size_t m = 0; interleaved && 2 * m < t.size(); ++m)
        interleaved = t[2 * m].input == t[0].input && t[2 * m].channel == t[0].channel + static_cast<int64_t>(m) &&
                      t[2 * m + 1].input == t[1].input &&
                      t[2 * m + 1].channel == t[1].channel + static_cast<int64_t>(m);
      interleaved_.push_back(interleaved);
    }
  }

  const char* Name() const override { return nhwc_ ? "ChannelShuffleF32Nhwc" : "ChannelShufflePlain"; }

  void Run(KernelContext& ctx) override {
    const size_t k = in_channels_.size();
    if (ctx.inputs.size() != k || ctx.outputs.size() != tables_.size())
      Internal(ctx.node, Name(), "input or output count changed");
    std::vector<const char*> src(k);
    int64_t total_bytes = 0;
    for (size_t i = 0; i < k; ++i) {
      const size_t bytes = static_cast<size_t>(batch_ * in_channels_[i] * inner_) * element_bytes_;
      CheckBytes(ctx.node, Name(), "input", ctx.In(static_cast<int>(i)), bytes);
      src[i] = Bytes(ctx.In(static_cast<int>(i)));
      total_bytes += static_cast<int64_t>(bytes);
    }
    std::vector<char*> dst(tables_.size());
    for (size_t j = 0; j < tables_.size(); ++j) {
      CheckBytes(ctx.node, Name(), "output", ctx.Out(static_cast<int>(j)),
                 static_cast<size_t>(batch_ * out_channels_[j] * inner_) * element_bytes_);
      dst[j] = Bytes(ctx.Out(static_cast<int>(j)));
    }
    const bool parallel = total_bytes >= kMinParallelBytes;
    if (nhwc_)
      RunNhwc(src, dst, parallel);
    else
      RunPlain(src, dst, parallel);
  }

 private:
  // One contiguous block of `inner_` elements per (batch item, channel).
  void RunPlain(const std::vector<const char*>& src, const std::vector<char*>& dst, bool parallel) const {
    const size_t block = static_cast<size_t>(inner_) * element_bytes_;
    for (size_t j = 0; j < tables_.size(); ++j) {
      const std::vector<ChannelSource>& table = tables_[j];
      const int64_t count = out_channels_[j];
      const int64_t tasks = batch_ * count;
#pragma omp parallel for schedule(static) if (parallel && tasks > 1)
      for (int64_t t = 0; t < tasks; ++t) {
        const int64_t b = t / count, c = t % count;
        const ChannelSource& s = table[c];
        std::memcpy(dst[j] + static_cast<size_t>(t) * block,
                    src[s.input] + static_cast<size_t>(b * in_channels_[s.input] + s.channel) * block, block);
      }
    }
  }

  // Per pixel (batch item and spatial position), each output row gathers its channels from the input rows.
  void RunNhwc(const std::vector<const char*>& src_bytes, const std::vector<char*>& dst_bytes, bool parallel) const {
    const int64_t pixels = batch_ * inner_;
    const size_t k = in_channels_.size();
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t p = 0; p < pixels; ++p) {
      const float* in_row[kMaxShuffleInputs];
      for (size_t i = 0; i < k; ++i) in_row[i] = reinterpret_cast<const float*>(src_bytes[i]) + p * in_channels_[i];
      for (size_t j = 0; j < tables_.size(); ++j) {
        const std::vector<ChannelSource>& table = tables_[j];
        float* out = reinterpret_cast<float*>(dst_bytes[j]) + p * out_channels_[j];
        if (interleaved_[j]) {
          Interleave(in_row[table[0].input] + table[0].channel, in_row[table[1].input] + table[1].channel,
                     out_channels_[j] / 2, out);
        } else {
          for (int64_t c = 0; c < out_channels_[j]; ++c) out[c] = in_row[table[c].input][table[c].channel];
        }
      }
    }
  }

  bool nhwc_;
  size_t element_bytes_;
  int64_t batch_, inner_;
  std::vector<int64_t> in_channels_, out_channels_;
  std::vector<std::vector<ChannelSource>> tables_;
  std::vector<char> interleaved_;
};

// ---------------------------------------------------------------------------------------------------------------
// The box a Slice of a rank-4 float32 tensor reads, when every step is 1: the first index and the count per axis (ONNX
// order), from the arguments' compile-time values. False when one is known only at run time, or a step is not 1.
bool SliceBox(const KernelBuildContext& ctx, std::array<int64_t, 4>* first, std::array<int64_t, 4>* count) {
  if (ctx.input_shapes.empty() || ctx.output_shapes.size() != 1 || !ctx.present[0]) return false;
  const Shape& in = ctx.input_shapes[0];
  if (!IsF32Rank4(ctx.input_dtypes[0], in)) return false;
  auto known = [&](int i) { return i < static_cast<int>(ctx.present.size()) && ctx.present[i]; };
  for (int i = 1; i < static_cast<int>(ctx.present.size()); ++i)
    if (known(i) && ctx.input_values[i] == nullptr) return false;
  SliceArgs args;
  if (!ReadSliceArgs(ctx.node, ctx.opset, [&](int i) { return known(i) ? ctx.input_values[i] : nullptr; }, &args))
    return false;
  SliceRange range;
  try {
    range = ResolveSlice(in, args, ctx.node);
  } catch (const Error&) {
    return false;  // the reference kernel reports it
  }
  for (int d = 0; d < 4; ++d) {
    if (range.step[d] != 1 || range.out[d] < 1) return false;
    (*first)[d] = range.first[d], (*count)[d] = range.out[d];
  }
  return range.out == ctx.output_shapes[0];
}

// Channel ranges [first, first + count) read by a Slice whose only cut is along axis 1 of a rank-4 float32 tensor
// (SliceBox with the batch, H and W whole). False for any other Slice.
bool SliceChannelRange(const KernelBuildContext& ctx, int64_t* first, int64_t* count) {
  std::array<int64_t, 4> box_first{}, box_count{};
  if (!SliceBox(ctx, &box_first, &box_count)) return false;
  const Shape& in = ctx.input_shapes[0];
  for (int d : {0, 2, 3})
    if (box_first[d] != 0 || box_count[d] != in[d]) return false;
  *first = box_first[1], *count = box_count[1];
  return true;
}

// A Slice box (SliceBox) of channels-last data: per output row (n, y), one run of w * C floats when every channel is
// kept, else w runs of the kept channels.
class SliceBoxNhwc final : public Kernel {
 public:
  SliceBoxNhwc(Shape in, std::array<int64_t, 4> first, std::array<int64_t, 4> count)
      : in_(std::move(in)), first_(first), count_(count) {}
  const char* Name() const override { return "SliceF32Nhwc"; }
  void Run(KernelContext& ctx) override {
    const int64_t c = in_[1], h = in_[2], w = in_[3];
    const int64_t oc = count_[1], oh = count_[2], ow = count_[3], rows = count_[0] * oh;
    CheckBytes(ctx.node, Name(), "input", ctx.In(0), in_[0] * c * h * w * sizeof(float));
    CheckBytes(ctx.node, Name(), "output", ctx.Out(0), rows * ow * oc * sizeof(float));
    const float* src = ctx.In(0).data<float>();
    float* dst = ctx.Out(0).data<float>();
    const bool parallel = rows * ow * oc * static_cast<int64_t>(sizeof(float)) >= kMinParallelBytes;
#pragma omp parallel for schedule(static) if (parallel && rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = first_[0] + r / oh, y = first_[2] + r % oh;
      const float* s = src + ((n * h + y) * w + first_[3]) * c + first_[1];
      float* d = dst + r * ow * oc;
      if (oc == c) {
        std::memcpy(d, s, static_cast<size_t>(ow * c) * sizeof(float));
        continue;
      }
      for (int64_t x = 0; x < ow; ++x) std::memcpy(d + x * oc, s + x * c, static_cast<size_t>(oc) * sizeof(float));
    }
  }

 private:
  Shape in_;
  std::array<int64_t, 4> first_, count_;
};

// Channel ranges of a Split along axis 1 of a rank-4 float32 tensor with every output present.
bool SplitChannelRanges(const KernelBuildContext& ctx, std::vector<int64_t>* first, std::vector<int64_t>* count) {
  if (ctx.input_shapes.empty() || !ctx.present[0]) return false;
  const Shape& in = ctx.input_shapes[0];
  if (!IsF32Rank4(ctx.input_dtypes[0], in)) return false;
  int64_t axis = ctx.node.GetInt("axis", 0);
  if (axis < 0) axis += 4;
  if (axis != 1) return false;
  int64_t offset = 0;
  for (size_t j = 0; j < ctx.node.outputs.size(); ++j) {
    if (ctx.node.outputs[j] < 0 || j >= ctx.output_shapes.size()) return false;
    first->push_back(offset);
    count->push_back(ctx.output_shapes[j][1]);
    offset += ctx.output_shapes[j][1];
  }
  return offset == in[1];
}

// A float32 Concat along the channels of rank-4 or rank-5 tensors (a 3-D U-Net's skip connections).
bool IsChannelConcat(const KernelBuildContext& ctx) {
  if (ctx.input_shapes.empty() || ctx.output_shapes.size() != 1) return false;
  const size_t rank = ctx.output_shapes[0].size();
  if (!ChannelsLastRank(rank)) return false;
  for (size_t i = 0; i < ctx.input_shapes.size(); ++i)
    if (!ctx.present[i] || ctx.input_dtypes[i] != DType::kF32 || ctx.input_shapes[i].size() != rank) return false;
  const int64_t axis = ctx.node.GetInt("axis", 0);
  return axis == 1 || axis == 1 - static_cast<int64_t>(rank);
}

bool IsChannelShuffleF32(const KernelBuildContext& ctx) {
  if (ctx.input_shapes.empty() || ctx.input_shapes.size() > kMaxShuffleInputs) return false;
  for (size_t i = 0; i < ctx.input_shapes.size(); ++i)
    if (!ctx.present[i] || !IsF32Rank4(ctx.input_dtypes[i], ctx.input_shapes[i])) return false;
  for (int v : ctx.node.outputs)
    if (v < 0) return false;
  return true;
}

std::unique_ptr<Kernel> CreateConcat(const KernelBuildContext& ctx) {
  bool nhwc = false;
  if (ctx.input_shapes.empty() || !UniformLayout(ctx, ctx.input_shapes.size(), &nhwc)) return nullptr;
  for (bool present : ctx.present)
    if (!present) return nullptr;
  if (nhwc) {
    if (!IsChannelConcat(ctx)) return nullptr;
    const Shape& s = ctx.input_shapes[0];
    std::vector<int64_t> channels;
    for (const Shape& in : ctx.input_shapes) channels.push_back(in[1]);
    int64_t pixels = s[0];
    for (size_t d = 2; d < s.size(); ++d) pixels *= s[d];
    return std::make_unique<ConcatNhwc>(std::move(channels), pixels);
  }
  const Shape& out = ctx.output_shapes[0];
  const int64_t rank = static_cast<int64_t>(out.size());
  if (rank == 0) return nullptr;
  const int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", 0), rank, ctx.node);
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= out[d];
  const size_t es = DTypeSize(ctx.output_dtypes[0]);
  std::vector<size_t> part_bytes;
  for (const Shape& in : ctx.input_shapes) {
    if (static_cast<int64_t>(in.size()) != rank) return nullptr;
    size_t elements = 1;
    for (int64_t d = axis; d < rank; ++d) elements *= static_cast<size_t>(in[d]);
    part_bytes.push_back(elements * es);
  }
  return std::make_unique<PlainBlocks>(false, std::move(part_bytes), outer);
}

std::unique_ptr<Kernel> CreateChannelShuffle(const KernelBuildContext& ctx) {
  bool nhwc = false;
  if (ctx.input_shapes.empty() || !UniformLayout(ctx, ctx.input_shapes.size(), &nhwc)) return nullptr;
  for (bool present : ctx.present)
    if (!present) return nullptr;
  for (int v : ctx.node.outputs)
    if (v < 0) return nullptr;
  if (nhwc && !IsChannelShuffleF32(ctx)) return nullptr;
  const Shape& s = ctx.input_shapes[0];
  if (s.size() < 2) return nullptr;
  int64_t inner = 1;
  for (size_t d = 2; d < s.size(); ++d) inner *= s[d];
  std::vector<int64_t> in_channels, out_channels;
  int64_t total = 0;
  for (const Shape& in : ctx.input_shapes) {
    in_channels.push_back(in[1]);
    total += in[1];
  }
  for (const Shape& out : ctx.output_shapes) out_channels.push_back(out[1]);
  const int64_t groups = ctx.node.GetInt("groups", 0);
  if (groups < 1 || total % groups != 0) return nullptr;  // the schema rejects this; the reference kernel reports it
  return std::make_unique<ChannelShuffle>(nhwc, DTypeSize(ctx.input_dtypes[0]), s[0], inner, std::move(in_channels),
                                          std::move(out_channels), groups);
}

// Any other Slice of plain data (any rank, dtype and steps, arguments known when compiled): the strided view it
// reads, with output dims of size 1 dropped and adjacent dims merged where the view walks them as one, copied one run
// of the innermost dim at a time: a memcpy at step 1 (a fixed-size copy for runs of up to 16 bytes: the xy and wh
// halves of an SSD's [N, anchors, 4] boxes are 8-byte runs), element by element at other steps.
class SlicePlain final : public Kernel {
 public:
  SlicePlain(const Shape& in, const SliceRange& range, size_t es) : es_(static_cast<int64_t>(es)) {
    const int64_t rank = static_cast<int64_t>(in.size());
    std::vector<int64_t> strides(rank);
    int64_t s = 1;
    for (int64_t d = rank - 1; d >= 0; --d) strides[d] = s, s *= in[d];
    in_bytes_ = s * es_;
    out_bytes_ = es_;
    for (int64_t d = 0; d < rank; ++d) {
      base_ += range.first[d] * strides[d];
      out_bytes_ *= range.out[d];
      if (range.out[d] == 1) continue;
      const int64_t step = strides[d] * range.step[d];
      if (!dims_.empty() && stride_.back() == step * range.out[d]) {
        dims_.back() *= range.out[d];
        stride_.back() = step;
      } else {
        dims_.push_back(range.out[d]);
        stride_.push_back(step);
      }
    }
    if (dims_.empty()) dims_ = {1}, stride_ = {1};
    inner_ = dims_.back();
    rows_ = inner_ > 0 ? out_bytes_ / es_ / inner_ : 0;
  }
  const char* Name() const override { return "SlicePlain"; }

  void Run(KernelContext& ctx) override {
    const Tensor& x = ctx.In(0);
    Tensor& y = ctx.Out(0);
    if (static_cast<int64_t>(x.nbytes()) != in_bytes_ || static_cast<int64_t>(y.nbytes()) != out_bytes_)
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": SlicePlain: tensor sizes changed");
    if (out_bytes_ == 0) return;
    const char* src = static_cast<const char*>(x.raw()) + base_ * es_;
    char* dst = static_cast<char*>(y.raw());
    const int64_t chunks = std::min<int64_t>(rows_, std::max<int64_t>(1, out_bytes_ / (kMinParallelBytes / 4)));
#pragma omp parallel for schedule(static) if (out_bytes_ >= kMinParallelBytes && chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) CopyRows(src, dst, rows_ * c / chunks, rows_ * (c + 1) / chunks);
  }

 private:
  // n runs of `run` bytes to dst, run i read at src + offset(i).
  template <class Offset>
  static void Runs(int64_t run, const char* src, char* dst, int64_t n, Offset offset) {
    CopyRuns(
        run, n, [&](int64_t i) { return src + offset(i); }, [&](int64_t i) { return dst + i * run; });
  }

  // Output rows [r0, r1): with one outer dim, rows at a fixed input step; else their input offsets (bytes) in blocks
  // of 256, then the runs.
  void CopyRows(const char* src, char* dst, int64_t r0, int64_t r1) const {
    const int64_t outer = static_cast<int64_t>(dims_.size()) - 1, run = inner_ * es_;
    if (outer == 1 && stride_.back() == 1) {
      const int64_t step = stride_[0] * es_;
      return Runs(run, src + r0 * step, dst + r0 * run, r1 - r0, [step](int64_t i) { return i * step; });
    }
    std::array<int64_t, 256> offsets;
    std::vector<int64_t> counter(outer);
    int64_t offset = 0, rest = r0;
    for (int64_t d = outer - 1; d >= 0; --d) {
      counter[d] = rest % dims_[d];
      rest /= dims_[d];
      offset += counter[d] * stride_[d];
    }
    for (int64_t r = r0; r < r1;) {
      const int64_t n = std::min<int64_t>(256, r1 - r);
      for (int64_t i = 0; i < n; ++i) {
        offsets[i] = offset * es_;
        for (int64_t d = outer - 1; d >= 0; --d) {
          offset += stride_[d];
          if (++counter[d] < dims_[d]) break;
          offset -= stride_[d] * dims_[d];
          counter[d] = 0;
        }
      }
      char* out = dst + r * run;
      if (stride_.back() != 1) {
        for (int64_t i = 0; i < n; ++i)
          for (int64_t k = 0; k < inner_; ++k)
            std::memcpy(out + i * run + k * es_, src + offsets[i] + k * stride_.back() * es_, es_);
      } else {
        Runs(run, src, out, n, [&offsets](int64_t i) { return offsets[i]; });
      }
      r += n;
    }
  }

  int64_t es_, base_ = 0, inner_ = 1, rows_ = 1, in_bytes_ = 0, out_bytes_ = 0;
  std::vector<int64_t> dims_, stride_;  // merged output dims and the input element stride of each
};

// The resolved Slice of a plain tensor whose arguments are all known when compiled, or false.
bool PlainSliceRange(const KernelBuildContext& ctx, SliceRange* range) {
  if (ctx.input_shapes.empty() || ctx.output_shapes.size() != 1 || !ctx.present[0]) return false;
  if (ctx.InLayout(0) != Layout::kPlain || ctx.OutLayout(0) != Layout::kPlain) return false;
  const size_t es = DTypeSize(ctx.input_dtypes[0]);
  if (es == 0 || ctx.input_shapes[0].empty()) return false;
  auto known = [&](int i) { return i < static_cast<int>(ctx.present.size()) && ctx.present[i]; };
  for (int i = 1; i < static_cast<int>(ctx.present.size()); ++i)
    if (known(i) && ctx.input_values[i] == nullptr) return false;
  SliceArgs args;
  if (!ReadSliceArgs(
          ctx.node, ctx.opset, [&](int i) { return known(i) ? ctx.input_values[i] : nullptr; }, &args))
    return false;
  try {
    *range = ResolveSlice(ctx.input_shapes[0], args, ctx.node);
  } catch (const Error&) {
    return false;  // the reference kernel reports it
  }
  return range->out == ctx.output_shapes[0];
}

std::unique_ptr<Kernel> CreateSlice(const KernelBuildContext& ctx) {
  bool nhwc = false;
  int64_t first = 0, count = 0;
  if (!UniformLayout(ctx, 1, &nhwc)) return nullptr;
  if (SliceChannelRange(ctx, &first, &count))
    return std::make_unique<ChannelRanges>(nhwc ? "SliceChannelsF32Nhwc" : "SliceChannelsF32", nhwc,
                                           ctx.input_shapes[0], std::vector<int64_t>{first},
                                           std::vector<int64_t>{count});
  std::array<int64_t, 4> box_first{}, box_count{};
  if (nhwc) {  // other boxes of channels-last data
    if (!SliceBox(ctx, &box_first, &box_count)) return nullptr;
    return std::make_unique<SliceBoxNhwc>(ctx.input_shapes[0], box_first, box_count);
  }
  SliceRange range;
  if (!PlainSliceRange(ctx, &range)) return nullptr;
  return std::make_unique<SlicePlain>(ctx.input_shapes[0], range, DTypeSize(ctx.input_dtypes[0]));
}

std::unique_ptr<Kernel> CreateSplit(const KernelBuildContext& ctx) {
  bool nhwc = false;
  std::vector<int64_t> first, count;
  if (!UniformLayout(ctx, 1, &nhwc)) return nullptr;
  if (SplitChannelRanges(ctx, &first, &count))
    return std::make_unique<ChannelRanges>(nhwc ? "SplitChannelsF32Nhwc" : "SplitChannelsF32", nhwc,
                                           ctx.input_shapes[0], std::move(first), std::move(count));
  // Any other axis, rank or dtype: plain data, every output present, output shapes from the schema.
  if (nhwc || ctx.input_shapes.empty() || !ctx.present[0]) return nullptr;
  const Shape& in = ctx.input_shapes[0];
  const int64_t rank = static_cast<int64_t>(in.size());
  if (rank == 0 || ctx.output_shapes.size() != ctx.node.outputs.size()) return nullptr;
  const int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", 0), rank, ctx.node);
  int64_t outer = 1, inner = 1, total = 0;
  for (int64_t d = 0; d < axis; ++d) outer *= in[d];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= in[d];
  const size_t es = DTypeSize(ctx.input_dtypes[0]);
  std::vector<size_t> part_bytes;
  for (size_t j = 0; j < ctx.node.outputs.size(); ++j) {
    const Shape& out = ctx.output_shapes[j];
    if (ctx.node.outputs[j] < 0 || static_cast<int64_t>(out.size()) != rank) return nullptr;
    part_bytes.push_back(static_cast<size_t>(out[axis] * inner) * es);
    total += out[axis];
  }
  if (total != in[axis]) return nullptr;
  return std::make_unique<PlainBlocks>(true, std::move(part_bytes), outer);
}

// ---------------------------------------------------------------------------------------------------------------
// Gather of plain data along any axis, any dtype, int32 or int64 indices: data [outer, dim, inner] -> [outer, K,
// inner], one run of `inner` elements per (outer, index), copied as SlicePlain copies its runs (a fixed-size copy for
// runs of up to 16 bytes: the reference made a memcpy call per run, ~1 ms for the element gathers PyTorch's dynamo
// exporter writes for F.unfold, MobileViTV2's [1, 128, 2, 16, 32] along its last axis). Indices are checked (and
// negative ones wrapped) on every run, by the reference's rule (GatherIndex).
class GatherPlain final : public Kernel {
 public:
  explicit GatherPlain(int64_t axis) : axis_(axis) {}
  const char* Name() const override { return "GatherPlain"; }

  void Run(KernelContext& ctx) override {
    const Tensor& data = ctx.In(0);
    const Tensor& idx = ctx.In(1);
    Tensor& out = ctx.Out(0);
    const Shape& s = data.shape();
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis_; ++d) outer *= s[d];
    for (size_t d = static_cast<size_t>(axis_) + 1; d < s.size(); ++d) inner *= s[d];
    const int64_t dim = s[axis_], k = idx.numel(), zero_outside = ctx.node.GetInt(kGatherZeroOutside, 0);
    const int64_t run = inner * static_cast<int64_t>(DTypeSize(data.dtype()));
    CheckBytes(ctx.node, Name(), "output", out, static_cast<size_t>(outer * k * run));
    std::vector<int64_t> indices(static_cast<size_t>(k));
    bool zeros = false;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t v = idx.dtype() == DType::kI64 ? idx.data<int64_t>()[i] : idx.data<int32_t>()[i];
      indices[i] = GatherIndex(ctx.node, v, dim, zero_outside);
      zeros = zeros || indices[i] < 0;
    }
    if (out.nbytes() == 0) return;
    const char* src = static_cast<const char*>(data.raw());
    char* dst = static_cast<char*>(out.raw());
    const int64_t* at = indices.data();
    // Output runs [r0, r1) (run r: outer r / k, index r % k).
    auto copy = [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1;) {
        const int64_t o = r / k, i0 = r % k, n = std::min(k - i0, r1 - r);
        const char* base = src + o * dim * run;
        char* to = dst + r * run;
        if (zeros) {
          for (int64_t i = 0; i < n; ++i) {
            if (at[i0 + i] < 0)
              std::memset(to + i * run, 0, static_cast<size_t>(run));
            else
              std::memcpy(to + i * run, base + at[i0 + i] * run, static_cast<size_t>(run));
          }
        } else {
          CopyRuns(
              run, n, [&](int64_t i) { return base + at[i0 + i] * run; }, [&](int64_t i) { return to + i * run; });
        }
        r += n;
      }
    };
    const int64_t rows = outer * k, bytes = rows * run;
    if (bytes < kMinParallelBytes) return copy(0, rows);
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      copy(rows * t / threads, rows * (t + 1) / threads);
    }
  }

 private:
  int64_t axis_;
};

std::unique_ptr<Kernel> CreateGather(const KernelBuildContext& ctx) {
  bool nhwc = false;
  if (ctx.input_shapes.size() != 2 || ctx.output_shapes.size() != 1 || !ctx.present[0] || !ctx.present[1] ||
      !UniformLayout(ctx, 2, &nhwc) || nhwc || ctx.input_shapes[0].empty())
    return nullptr;
  if (ctx.input_dtypes[1] != DType::kI64 && ctx.input_dtypes[1] != DType::kI32) return nullptr;
  const int64_t rank = static_cast<int64_t>(ctx.input_shapes[0].size());
  return std::make_unique<GatherPlain>(NormalizeAxis(ctx.node.GetInt("axis", 0), rank, ctx.node));
}

}  // namespace

std::unique_ptr<Kernel> CreateChannelKernel(const KernelBuildContext& ctx) {
  const std::string& op = ctx.node.op_type;
  if (!ctx.node.domain.empty()) return nullptr;
  if (op == "Concat") return CreateConcat(ctx);
  if (op == kChannelShuffleOp) return CreateChannelShuffle(ctx);
  if (op == "Slice") return CreateSlice(ctx);
  if (op == "Split") return CreateSplit(ctx);
  if (op == "Gather") return CreateGather(ctx);
  return nullptr;
}

namespace cpu {
bool ResizeFollowsNhwc(const KernelBuildContext& ctx);  // resize_kernel.cc
}  // namespace cpu

bool CpuKernelFollowsNhwc(const KernelBuildContext& ctx) {
  const std::string& op = ctx.node.op_type;
  if (!ctx.node.domain.empty()) return false;
  int64_t first = 0, count = 0;
  std::vector<int64_t> firsts, counts;
  if (op == "Concat") return IsChannelConcat(ctx);
  if (op == kChannelShuffleOp) return IsChannelShuffleF32(ctx);
  std::array<int64_t, 4> box_first{}, box_count{};
  if (op == "Slice") return SliceChannelRange(ctx, &first, &count) || SliceBox(ctx, &box_first, &box_count);
  if (op == "Split") return SplitChannelRanges(ctx, &firsts, &counts);
  if (op == "Resize" || op == "Upsample") return cpu::ResizeFollowsNhwc(ctx);
  if (op == "Pad") return PadFollowsNhwc(ctx);
  return false;
}

}  // namespace osprey
