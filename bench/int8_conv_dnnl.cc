// Does int8 pay on this CPU? oneDNN convolutions of ResNet-50's shapes at batch 1, fp32 vs u8s8 (u8 out, per-tensor
// output scale, fused ReLU), channels-last activations, weights in oneDNN's chosen layout (prepacked, untimed): whether
// osprey's QDQ path should run int8 convolutions. Figures in docs/performance.md.
// Usage (oneDNN 3 from scripts/setup's .venv): g++ -O2 -std=c++17 bench/int8_conv_dnnl.cc -I.venv/include -L.venv/lib
//        -Wl,-rpath,$PWD/.venv/lib -ldnnl -o /tmp/int8_conv_dnnl && OMP_NUM_THREADS=1 /tmp/int8_conv_dnnl [iters]. One thread gives clean figures on a shared machine; with two, a descheduled thread stalls every run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"

using namespace dnnl;

struct Shape {
  int c, k, hw, r, stride;
};

// The fastest run: on a shared machine the median measures the neighbours (4 ms scheduler slices), the minimum the
// kernel.
double MinMs(const std::vector<double>& t) { return *std::min_element(t.begin(), t.end()); }

double Time(engine& eng, stream& s, const Shape& sh, bool int8, int iters) {
  const int pad = sh.r / 2, out_hw = (sh.hw + 2 * pad - sh.r) / sh.stride + 1;
  const memory::data_type src_t = int8 ? memory::data_type::u8 : memory::data_type::f32;
  const memory::data_type wei_t = int8 ? memory::data_type::s8 : memory::data_type::f32;
  const memory::data_type bias_t = int8 ? memory::data_type::s32 : memory::data_type::f32;
  memory::desc src({1, sh.c, sh.hw, sh.hw}, src_t, memory::format_tag::nhwc);
  memory::desc dst({1, sh.k, out_hw, out_hw}, src_t, memory::format_tag::nhwc);
  memory::desc wei({sh.k, sh.c, sh.r, sh.r}, wei_t, memory::format_tag::any);
  memory::desc bias({sh.k}, bias_t, memory::format_tag::x);
  primitive_attr attr;
  if (int8) attr.set_scales_mask(DNNL_ARG_DST, 0);
  post_ops po;
  po.append_eltwise(algorithm::eltwise_relu, 0.f, 0.f);
  attr.set_post_ops(po);
  convolution_forward::primitive_desc pd(eng, prop_kind::forward_inference, algorithm::convolution_direct, src, wei,
                                         bias, dst, {sh.stride, sh.stride}, {pad, pad}, {pad, pad}, attr);
  memory m_src(pd.src_desc(), eng), m_dst(pd.dst_desc(), eng), m_wei(pd.weights_desc(), eng), m_bias(bias, eng);
  std::fill_n(static_cast<char*>(m_src.get_data_handle()), pd.src_desc().get_size(), 3);
  std::fill_n(static_cast<char*>(m_wei.get_data_handle()), pd.weights_desc().get_size(), 1);
  std::fill_n(static_cast<char*>(m_bias.get_data_handle()), bias.get_size(), 0);
  convolution_forward conv(pd);
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, m_src}, {DNNL_ARG_WEIGHTS, m_wei}, {DNNL_ARG_BIAS, m_bias}, {DNNL_ARG_DST, m_dst}};
  float dst_scale = 100.f;  // dst = conv / 100
  if (int8) args.emplace(DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST, memory({{1}, memory::data_type::f32, memory::format_tag::x}, eng, &dst_scale));
  std::vector<double> times;
  for (int i = 0; i < iters + 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    conv.execute(s, args);
    s.wait();
    auto t1 = std::chrono::steady_clock::now();
    if (i >= 3) times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::printf("    %s impl %s\n", int8 ? "int8" : "fp32", pd.impl_info_str());
  return MinMs(times);
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 50;
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const Shape shapes[] = {{64, 64, 56, 3, 1},  {64, 256, 56, 1, 1},   {128, 128, 28, 3, 1},
                          {256, 256, 14, 3, 1}, {256, 1024, 14, 1, 1}, {512, 512, 7, 3, 1}};
  double total_f = 0, total_q = 0;
  for (const Shape& sh : shapes) {
    const double f = Time(eng, s, sh, false, iters), q = Time(eng, s, sh, true, iters);
    total_f += f;
    total_q += q;
    std::printf("conv %4d->%4d %dx%d @%3d: fp32 %7.3f ms  int8 %7.3f ms  int8 speed-up %.2fx\n", sh.c, sh.k, sh.r, sh.r,
                sh.hw, f, q, f / q);
  }
  std::printf("sum of the six: fp32 %.3f ms, int8 %.3f ms, int8 speed-up %.2fx\n", total_f, total_q, total_f / total_q);
  return 0;
}
