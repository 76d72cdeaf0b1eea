// Int8 convolution for QDQ models (src/runtime/fusion_qdq.cc, FuseInt8): a Conv node carrying `_int8` attributes
// computes DequantizeLinear(QuantizeLinear(Conv(DequantizeLinear(QuantizeLinear(x)), W, B))) with oneDNN's u8 x s8
// convolution. Activations in and out are float32 (plain or channels last), holding exact multiples of their scales,
// so everything around the convolution (residual Adds, pooling, the layout pass) is unchanged.
//
// Per run: x is quantised into a u8 NHWC buffer (round half to even of x / x_scale, plus zero point, saturated: what
// QuantizeLinear computes; an s8 activation is stored + 128 with its zero point + 128); the primitive sums
// (x_q - zp) * w_q in int32, scales by x_scale * w_scale[m] / y_scale, adds the bias scaled alike, rounds half to even,
// clips to the output type's range less its zero point and multiplies by y_scale: DequantizeLinear(QuantizeLinear(.))
// of the convolution, in post-ops.
//
// AVX2 without VNNI: oneDNN sums pairs of u8 x s8 products in 16 bits (vpmaddubsw), which saturates when two adjacent
// input channels (one pair) carry large same-signed weights and large activations (255 * 127 * 2 > 32767). For s8
// activations oneDNN would halve the weights instead (rounding every odd weight: about 9% of outputs one step off in
// the unit test). This kernel keeps the arithmetic exact: it always feeds u8 and places input channels in pairs whose
// same-signed weight magnitudes sum to at most 128 for every output channel and tap (255 * 128 < 32768), giving a
// channel with no such partner a zero channel. The placement is the quantising copy's gather; the extra channels cost
// K. With VNNI (vpdpbusd) or AMX the products are summed in 32 bits, exact: there the channels keep their order and
// the copy is one streaming pass (`OSPREY_INT8_PAIRING=1` forces the pairing, which the tests use to check it there).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/int8_pairing.h"
#include "kernels/cpu/quantise_u8.h"
#include "ops/conv_window.h"

namespace osprey {

// The ISA values are bit sets: avx2_vnni = avx2 | 0x8, avx512_core_vnni = avx512_core | 0x40, and AMX includes the
// latter.
bool Int8ProductsExact() {
  const char* force = std::getenv("OSPREY_INT8_PAIRING");
  if (force != nullptr && std::string(force) == "1") return false;
  const int isa = static_cast<int>(dnnl::get_effective_cpu_isa());
  const int avx2_vnni = static_cast<int>(dnnl::cpu_isa::avx2_vnni);
  const int avx512_vnni = static_cast<int>(dnnl::cpu_isa::avx512_core_vnni);
  return (isa & avx2_vnni) == avx2_vnni || (isa & avx512_vnni) == avx512_vnni;
}

namespace cpu {
namespace {

using dnnl::memory;
constexpr const char* kName = "ConvInt8Dnnl";

class ConvInt8Kernel final : public Kernel {
 public:
  const char* Name() const override { return kName; }
  const char* Implementation() const { return pd_.impl_info_str(); }

  bool Build(const KernelBuildContext& ctx) {
    const Node& node = ctx.node;
    if (ctx.input_shapes.size() < 2 || ctx.output_shapes.size() != 1) return false;
    for (size_t i = 0; i < ctx.input_layouts.size(); ++i)
      if (i != 0 && ctx.input_layouts[i] != Layout::kPlain) return false;
    x_ = ctx.input_shapes[0];
    y_ = ctx.output_shapes[0];
    x_given_ = x_;
    y_given_ = y_;
    threads_ = std::max(1, ctx.num_threads);
    const Tensor* w = ctx.input_values.size() > 1 ? ctx.input_values[1] : nullptr;
    const bool has_bias = ctx.present.size() > 2 && ctx.present[2];
    const Tensor* b = has_bias && ctx.input_values.size() > 2 ? ctx.input_values[2] : nullptr;
    if (w == nullptr || w->raw() == nullptr || (has_bias && (b == nullptr || b->raw() == nullptr))) return false;
    if (ctx.input_dtypes[0] != DType::kF32 || w->dtype() != DType::kF32 || ctx.output_dtypes[0] != DType::kF32)
      return false;
    if (node.GetInt("group", 1) != 1 || !node.GetString("_activation", "").empty() || node.Has("_residual"))
      return false;
    Shape ws = w->shape();
    // A 1-D convolution (audio front ends: Whisper's) runs as a 2-D one of height 1: [N, C, L] is [N, C, 1, L].
    const bool one_d = x_.size() == 3 && ws.size() == 3 && y_.size() == 3;
    if (one_d && ctx.input_layouts[0] != Layout::kPlain) return false;
    std::optional<ConvWindow> window_1d;
    if (one_d) {
      const std::vector<int64_t> kernel = node.GetInts("kernel_shape", {ws[2]});
      if (kernel != std::vector<int64_t>{ws[2]}) return false;
      window_1d = ResolveConvWindow(node, x_, kernel, /*ceil_mode=*/false);
      x_ = {x_[0], x_[1], 1, x_[2]};
      y_ = {y_[0], y_[1], 1, y_[2]};
      ws = {ws[0], ws[1], 1, ws[2]};
    }
    if (x_.size() != 4 || ws.size() != 4 || y_.size() != 4 || ws[1] != x_[1] || y_[1] != ws[0] || y_[0] != x_[0])
      return false;
    const int64_t out_c = ws[0], in_c = ws[1], taps = ws[2] * ws[3];
    x_scale_ = node.GetFloat("_int8_x_scale", 0.f);
    const float y_scale = node.GetFloat("_int8_y_scale", 0.f);
    const int32_t x_zp = static_cast<int32_t>(node.GetInt("_int8_x_zero_point", 0));
    const int32_t y_zp = static_cast<int32_t>(node.GetInt("_int8_y_zero_point", 0));
    x_signed_ = node.GetInt("_int8_x_signed", 0) != 0;
    const bool y_signed = node.GetInt("_int8_y_signed", 0) != 0;
    const std::vector<float> w_scale = node.GetFloats("_int8_w_scale", {});
    if (!(x_scale_ > 0.f) || !(y_scale > 0.f) || (w_scale.size() != 1 && static_cast<int64_t>(w_scale.size()) != out_c))
      return false;
    // u8 storage of the quantised input: q + 128 for s8.
    zp_u8_ = x_zp + (x_signed_ ? 128 : 0);
    if (zp_u8_ < 0 || zp_u8_ > 255) return false;

    // Geometry.
    ConvWindow win;
    if (one_d) {  // height: one tap, no stride or padding
      const ConvWindow& w1 = *window_1d;
      win.kernel = {1, w1.kernel[0]};
      win.strides = {1, w1.strides[0]};
      win.dilations = {1, w1.dilations[0]};
      win.pad_begin = {0, w1.pad_begin[0]};
      win.pad_end = {0, w1.pad_end[0]};
    } else {
      const std::vector<int64_t> kernel = node.GetInts("kernel_shape", {ws[2], ws[3]});
      if (kernel != std::vector<int64_t>{ws[2], ws[3]}) return false;
      win = ResolveConvWindow(node, x_, kernel, /*ceil_mode=*/false);
    }
    memory::dims st, di, pl, pr;
    for (int i = 0; i < 2; ++i) {
      const int64_t in = x_[2 + i], s = win.strides[i], d = win.dilations[i];
      const int64_t k_eff = win.EffectiveKernel(i);
      const int64_t l = win.pad_begin[i], r = win.pad_end[i];
      if (l < 0 || r < 0) return false;
      const int64_t span = in + l + r - k_eff;
      if (span < 0 || span / s + 1 != y_[2 + i]) return false;
      st.push_back(s);
      di.push_back(d - 1);
      pl.push_back(l);
      pr.push_back(r);
    }

    // The int8 weights (W = w_q * w_scale[m] exactly) in [C][M * taps] order for the pairing test, and the bias.
    std::vector<int8_t> by_channel(static_cast<size_t>(in_c * out_c * taps));
    const float* wf = w->data<float>();
    for (int64_t m = 0; m < out_c; ++m) {
      const float s = w_scale[w_scale.size() == 1 ? 0 : m];
      for (int64_t c = 0; c < in_c; ++c)
        for (int64_t t = 0; t < taps; ++t) {
          const float v = wf[(m * in_c + c) * taps + t];
          const float q = std::nearbyint(v / s);
          if (q < -128.f || q > 127.f || std::fabs(q * s - v) > 1e-6f * std::fabs(v) + 1e-30f) return false;
          by_channel[(c * out_c + m) * taps + t] = static_cast<int8_t>(q);
        }
    }
    std::vector<int32_t> bias_q(static_cast<size_t>(out_c), 0);
    if (b) {
      for (int64_t m = 0; m < out_c; ++m) {
        const double step = static_cast<double>(x_scale_) * w_scale[w_scale.size() == 1 ? 0 : m];
        const double v = b->data<float>()[m], q = std::nearbyint(v / step);
        if (std::fabs(q) > 2e9 || std::fabs(q * step - v) > 1e-3 * step + 1e-6 * std::fabs(v)) return false;
        bias_q[m] = static_cast<int32_t>(q);
      }
    }

    // Channel placement: in order where the products are exact, else pairs (PairInputChannels).
    slot_channel_.clear();
    if (Int8ProductsExact()) {
      for (int64_t c = 0; c < in_c; ++c) slot_channel_.push_back(static_cast<int32_t>(c));
    } else {
      slot_channel_ = PairInputChannels(by_channel, out_c * taps);
    }
    const int64_t slots = static_cast<int64_t>(slot_channel_.size());
    // Runs of consecutive channels in consecutive slots, for the vectorised quantising copy.
    runs_.clear();
    for (int64_t s = 0; s < slots; ++s) {
      if (slot_channel_[s] < 0) continue;
      if (!runs_.empty() && runs_.back().slot + runs_.back().length == s &&
          runs_.back().channel + runs_.back().length == slot_channel_[s])
        ++runs_.back().length;
      else
        runs_.push_back({s, slot_channel_[s], 1});
    }
    slots_ = slots;
    gather_ = static_cast<int64_t>(runs_.size()) * 16 > slots;
    gather_index_.resize(static_cast<size_t>(slots));
    for (int64_t k = 0; k < slots; ++k) gather_index_[k] = slot_channel_[k] < 0 ? static_cast<int32_t>(in_c) : slot_channel_[k];

    // Weights [M, slots, kh, kw], zero in empty slots.
    Tensor wq(DType::kI8, {out_c, slots, ws[2], ws[3]});
    std::memset(wq.raw(), 0, static_cast<size_t>(wq.numel()));
    for (int64_t m = 0; m < out_c; ++m)
      for (int64_t s = 0; s < slots; ++s) {
        if (slot_channel_[s] < 0) continue;
        for (int64_t t = 0; t < taps; ++t)
          wq.data<int8_t>()[(m * slots + s) * taps + t] = by_channel[(slot_channel_[s] * out_c + m) * taps + t];
      }

    const memory::dims src_dims{x_[0], slots, x_[2], x_[3]};
    src_md_ = memory::desc(src_dims, memory::data_type::u8, memory::format_tag::nhwc);
    dst_layout_ = ctx.OutLayout(0);
    src_layout_ = ctx.InLayout(0);
    user_dst_md_ = ActivationDesc(y_, dst_layout_);
    conv_dst_md_ = memory::desc(ToDims(y_), memory::data_type::f32, memory::format_tag::nhwc);
    const memory::desc w_any({out_c, slots, ws[2], ws[3]}, memory::data_type::s8, memory::format_tag::any);
    bias_md_ = memory::desc({out_c}, memory::data_type::f32, memory::format_tag::x);
    // oneDNN 3 scales the int32 sum (weights' scales, per output channel: x_scale * w_scale[m] / y_scale), then adds
    // the bias in float: the int32 bias is scaled the same way here.
    scales_.resize(w_scale.size());
    for (size_t m = 0; m < w_scale.size(); ++m) scales_[m] = x_scale_ * w_scale[m] / y_scale;
    std::vector<float> bias_f(static_cast<size_t>(out_c));
    for (int64_t m = 0; m < out_c; ++m)
      bias_f[m] = static_cast<float>(bias_q[m]) * scales_[scales_.size() == 1 ? 0 : m];
    bias_ = Tensor::FromVector<float>({out_c}, bias_f);
    const float lo = static_cast<float>((y_signed ? -128 : 0) - y_zp), hi = static_cast<float>((y_signed ? 127 : 255) - y_zp);
    dnnl::primitive_attr attr = BaseAttr();
    attr.set_scales_mask(DNNL_ARG_WEIGHTS, scales_.size() == 1 ? 0 : 1 << 0);
    if (zp_u8_ != 0) attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
    dnnl::post_ops ops;
    ops.append_eltwise(dnnl::algorithm::eltwise_round, 0.f, 0.f);
    ops.append_eltwise(dnnl::algorithm::eltwise_clip, lo, hi);
    ops.append_eltwise(dnnl::algorithm::eltwise_linear, y_scale, 0.f);
    attr.set_post_ops(ops);
    try {
      dnnl::convolution_forward::primitive_desc pd(CpuEngine(), dnnl::prop_kind::forward_inference,
                                                   dnnl::algorithm::convolution_direct, src_md_, w_any, bias_md_,
                                                   conv_dst_md_, st, di, pl, pr, attr, /*allow_empty=*/true);
      if (pd && !IsReferenceImpl(pd)) pd_ = pd;
    } catch (const dnnl::error&) {
    }
    if (!pd_) return false;
    conv_ = dnnl::convolution_forward(pd_);
    const memory::desc w_plain({out_c, slots, ws[2], ws[3]}, memory::data_type::s8, memory::format_tag::oihw);
    weight_ = PackWeight(ctx, w_plain, wq, pd_.weights_desc());
    reorder_dst_ = user_dst_md_ != conv_dst_md_;
    if (reorder_dst_)
      dst_reorder_ = dnnl::reorder(dnnl::reorder::primitive_desc(CpuEngine(), conv_dst_md_, CpuEngine(), user_dst_md_));
    src_bytes_ = ThreadScratch::Align(src_md_.get_size());
    dst_bytes_ = reorder_dst_ ? ThreadScratch::Align(conv_dst_md_.get_size()) : 0;
    scratch_md_ = pd_.scratchpad_desc();
    scratch_bytes_ = ThreadScratch::Align(scratch_md_.get_size());
    return true;
  }

  void Run(KernelContext& ctx) override {
    const Node& node = ctx.node;
    CheckActivation(node, kName, "input", ctx.In(0), x_given_, src_layout_);
    CheckActivation(node, kName, "output", ctx.Out(0), y_given_, dst_layout_);
    RunDnnl(node, kName, [&] {
      dnnl::stream& stream = ThreadStream();
      char* scratch = ThreadScratch::Reserve(src_bytes_ + dst_bytes_ + scratch_bytes_);
      Quantise(ctx.In(0).data<float>(), reinterpret_cast<uint8_t*>(scratch));
      const auto run = run_states_.Acquire([this] { return MakeRunState(); });
      Point(run->src, scratch);
      Point(run->user_dst, ctx.Out(0).raw());
      if (reorder_dst_) Point(run->dst, scratch + src_bytes_);
      Point(run->scratchpad, scratch + src_bytes_ + dst_bytes_);
      run->conv.Execute(conv_, stream);
      if (reorder_dst_) run->dst_reorder.Execute(dst_reorder_, stream);
      stream.wait();
    });
  }

 private:
  // The memories and argument arrays of one run (one set per concurrent caller, PerCaller). The zero point and the
  // scales are the kernel's own (fixed) buffers.
  struct RunState {
    memory src, user_dst, dst, scratchpad;
    ExecArgs conv, dst_reorder;
  };
  RunState MakeRunState() const {
    RunState r;
    r.src = UnboundMemory(src_md_);
    r.user_dst = UnboundMemory(user_dst_md_);
    r.dst = reorder_dst_ ? UnboundMemory(conv_dst_md_) : r.user_dst;
    r.scratchpad = UnboundMemory(scratch_md_);
    r.conv.Add(DNNL_ARG_SRC, r.src)
        .Add(DNNL_ARG_WEIGHTS, weight_.memory)
        .Add(DNNL_ARG_BIAS, WrapMemory(bias_md_, bias_.raw()))
        .Add(DNNL_ARG_DST, r.dst)
        .Add(DNNL_ARG_SCRATCHPAD, r.scratchpad);
    if (zp_u8_ != 0)
      r.conv.Add(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC,
                 WrapMemory(memory::desc({1}, memory::data_type::s32, memory::format_tag::x), &zp_u8_));
    r.conv.Add(DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS,
               WrapMemory(memory::desc({static_cast<memory::dim>(scales_.size())}, memory::data_type::f32,
                                       memory::format_tag::x),
                          scales_.data()));
    if (reorder_dst_) r.dst_reorder.Add(DNNL_ARG_FROM, r.dst).Add(DNNL_ARG_TO, r.user_dst);
    return r;
  }

  struct Span {
    int64_t slot, channel, length;
  };

  // x (float32, plain or NHWC) -> u8 NHWC with slots_ channels: QuantizeLinear's round(x / scale) + zero point,
  // saturated to the activation type, stored + 128 for s8; empty slots 0.
  void Quantise(const float* x, uint8_t* out) const {
    const int64_t n = x_[0], c = x_[1], hw = x_[2] * x_[3];
    const float lo = 0.f, hi = 255.f;  // u8 storage (s8 shifted by 128)
    const float zp = static_cast<float>(zp_u8_);
    const float s = x_scale_;
    auto one = [&](float v) -> uint8_t {
      const float q = std::nearbyint(v / s) + zp;
      return static_cast<uint8_t>(std::min(std::max(q, lo), hi));
    };
    const bool nhwc = src_layout_ == Layout::kNhwc;
    static const bool avx2 = __builtin_cpu_supports("avx2");
    if (nhwc && avx2 && runs_.size() == 1 && slots_ == c) {  // channels in order: one streaming pass
      const int64_t total = n * hw * c, parts = total >= (1 << 15) ? threads_ : 1;
      const int64_t step = (total / parts + 63) / 64 * 64;
#pragma omp parallel for num_threads(threads_) schedule(static) if (parts > 1)
      for (int64_t part = 0; part < parts; ++part) {
        const int64_t j0 = std::min(total, part * step), j1 = std::min(total, j0 + step);
        Quantise8(x + j0, out + j0, j1 - j0, s, zp);
      }
      return;
    }
    const __m128 vs = _mm_set1_ps(s), vzp = _mm_set1_ps(zp), vlo = _mm_set1_ps(lo), vhi = _mm_set1_ps(hi);
    // Pixels split between the plan's threads (the primitive runs on them too) in blocks of 64.
    const int64_t blocks = n * ((hw + 63) / 64), per_image = (hw + 63) / 64;
#pragma omp parallel for num_threads(threads_) schedule(static) if (threads_ > 1 && n * hw * c >= (1 << 15))
    for (int64_t blk = 0; blk < blocks; ++blk) {
      std::vector<uint8_t> tmp(static_cast<size_t>(c + 1), 0);
      const int64_t b = blk / per_image, p0 = (blk % per_image) * 64, p1 = std::min(hw, p0 + 64);
      const float* xb = x + b * c * hw;
      uint8_t* ob = out + b * slots_ * hw;
      for (int64_t p = p0; p < p1; ++p) {
        uint8_t* o = ob + p * slots_;
        if (slots_ != c && !gather_) std::memset(o, 0, static_cast<size_t>(slots_));
        if (!nhwc) {
          for (const Span& r : runs_)
            for (int64_t j = 0; j < r.length; ++j) o[r.slot + j] = one(xb[(r.channel + j) * hw + p]);
          continue;
        }
        const float* xp = xb + p * c;
        if (gather_) {  // short runs: quantise the pixel in order, then place the bytes
          uint8_t* t = tmp.data();
          QuantiseU8(xp, t, c, s, zp);
          for (int64_t k = 0; k < slots_; ++k) o[k] = t[gather_index_[k]];
          continue;
        }
        for (const Span& r : runs_) {
          const float* src = xp + r.channel;
          uint8_t* dst = o + r.slot;
          if (avx2) {
            Quantise8(src, dst, r.length, s, zp);
            continue;
          }
          int64_t j = 0;
          for (; j + 4 <= r.length; j += 4) {
            __m128 q = _mm_div_ps(_mm_loadu_ps(src + j), vs);
            q = _mm_round_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q = _mm_min_ps(_mm_max_ps(_mm_add_ps(q, vzp), vlo), vhi);
            const __m128i i32 = _mm_cvtps_epi32(q);
            const __m128i u8 = _mm_packus_epi16(_mm_packs_epi32(i32, i32), i32);
            const int32_t bytes = _mm_cvtsi128_si32(u8);
            std::memcpy(dst + j, &bytes, 4);
          }
          for (; j < r.length; ++j) dst[j] = one(src[j]);
        }
      }
    }
  }

  Shape x_, y_;              // 4-D (a 1-D convolution's with height 1)
  Shape x_given_, y_given_;  // the tensors' own shapes
  int threads_ = 1;
  float x_scale_ = 1.f;
  bool x_signed_ = false, reorder_dst_ = false;
  int32_t zp_u8_ = 0;
  int64_t slots_ = 0;
  std::vector<int32_t> slot_channel_, gather_index_;
  bool gather_ = false;
  std::vector<Span> runs_;
  Layout src_layout_ = Layout::kPlain, dst_layout_ = Layout::kPlain;
  dnnl::convolution_forward::primitive_desc pd_;
  dnnl::convolution_forward conv_;
  dnnl::reorder dst_reorder_;
  memory::desc src_md_, user_dst_md_, conv_dst_md_, bias_md_, scratch_md_;
  PackedWeight weight_;
  Tensor bias_;
  std::vector<float> scales_;  // per output channel (or one): x_scale * w_scale[m] / y_scale
  size_t src_bytes_ = 0, dst_bytes_ = 0, scratch_bytes_ = 0;
  PerCaller<RunState> run_states_;
};

}  // namespace

std::unique_ptr<Kernel> CreateDnnlConvInt8(const KernelBuildContext& ctx) {
  OmpThreadsGuard threads(ctx.num_threads);
  auto kernel = std::make_unique<ConvInt8Kernel>();
  try {
    if (!kernel->Build(ctx)) return nullptr;
  } catch (const dnnl::error&) {
    return nullptr;
  }
  return kernel;
}

bool DnnlConvInt8SupportsNhwc(const KernelBuildContext& ctx) {
  if (ctx.input_shapes.empty() || ctx.input_shapes[0].size() != 4) return false;
  KernelBuildContext nhwc = ctx;
  nhwc.input_layouts.assign(ctx.input_shapes.size(), Layout::kPlain);
  nhwc.input_layouts[0] = Layout::kNhwc;
  nhwc.output_layouts = {Layout::kNhwc};
  return CreateDnnlConvInt8(nhwc) != nullptr;
}

const char* DnnlConvInt8Implementation(const Kernel& kernel) {
  const auto* k = dynamic_cast<const ConvInt8Kernel*>(&kernel);
  return k ? k->Implementation() : "";
}

}  // namespace cpu
}  // namespace osprey
