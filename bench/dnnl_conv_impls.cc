// Every oneDNN implementation of ResNet-50's batch-1 convolutions (MOBILE=1: MobileNetV2's 1x1 ones), ReLU post-op,
// timed one by one (best of 3 x 40 runs): which implementation oneDNN picks first, which is fastest here, and what a
// oneDNN version gains (docs/performance.md, "oneDNN 3.2"). Builds against oneDNN 2.x or 3.x.
// Usage: g++ -O2 -std=c++17 bench/dnnl_conv_impls.cc -I.venv/include -L.venv/lib -Wl,-rpath,$PWD/.venv/lib -ldnnl
//          -o /tmp/dnnl_conv_impls && NHWC=1 ALL=1 OMP_NUM_THREADS=2 /tmp/dnnl_conv_impls
//        NHWC=1: channels-last tensors (what osprey's layout pass gives convolutions), else oneDNN's preferred layout;
//        ALL=1: every non-reference implementation (one line each), else oneDNN's first choice only. The TOTAL line
//        sums the fastest per layer times its count in the model.
#include <dnnl.hpp>
#include <chrono>
#include <cstdio>
#include <vector>
#include <string>
#include <cstdlib>
using namespace dnnl;
struct L { int ic, oc, k, s, hw, count; };
int main(int argc, char** argv) {
  int batch = argc > 1 ? atoi(argv[1]) : 1;
  setvbuf(stdout, nullptr, _IOLBF, 0);
  engine eng(engine::kind::cpu, 0); stream st(eng);
  std::vector<L> layers = getenv("MOBILE") ? std::vector<L>{
    {16,96,1,1,112,1},{96,24,1,1,56,1},{24,144,1,1,56,2},{144,24,1,1,56,1},{144,32,1,1,28,1},{32,192,1,1,28,3},{192,32,1,1,28,2},
    {192,64,1,1,14,1},{64,384,1,1,14,4},{384,64,1,1,14,3},{384,96,1,1,14,1},{96,576,1,1,14,3},{576,96,1,1,14,2},{576,160,1,1,7,1},
    {160,960,1,1,7,3},{960,160,1,1,7,2},{960,320,1,1,7,1},{320,1280,1,1,7,1}} : std::vector<L>{
    {3,64,7,2,224,1},
    {64,64,1,1,56,1},{64,64,3,1,56,3},{64,256,1,1,56,4},{256,64,1,1,56,2},
    {256,128,1,1,56,1},{128,128,3,2,56,1},{128,128,3,1,28,3},{128,512,1,1,28,4},{512,128,1,1,28,3},{256,512,1,2,56,1},
    {512,256,1,1,28,1},{256,256,3,2,28,1},{256,256,3,1,14,5},{256,1024,1,1,14,6},{1024,256,1,1,14,5},{512,1024,1,2,28,1},
    {1024,512,1,1,14,1},{512,512,3,2,14,1},{512,512,3,1,7,2},{512,2048,1,1,7,3},{2048,512,1,1,7,2},{1024,2048,1,2,14,1},
  };

  double total = 0;
  for (auto& l : layers) {
    int pad = l.k / 2; int ohw = (l.hw + 2 * pad - l.k) / l.s + 1;
    auto atag = getenv("NHWC") ? memory::format_tag::nhwc : memory::format_tag::any;
    memory::desc src({batch, l.ic, l.hw, l.hw}, memory::data_type::f32, atag);
    memory::desc wei({l.oc, l.ic, l.k, l.k}, memory::data_type::f32, memory::format_tag::any);
    memory::desc bia({l.oc}, memory::data_type::f32, memory::format_tag::x);
    memory::desc dst({batch, l.oc, ohw, ohw}, memory::data_type::f32, atag);
    post_ops po;
#if DNNL_VERSION_MAJOR >= 3
    po.append_eltwise(algorithm::eltwise_relu, 0.f, 0.f);
    primitive_attr attr; attr.set_post_ops(po);
    convolution_forward::primitive_desc pd(eng, prop_kind::forward_inference, algorithm::convolution_direct, src, wei, bia, dst,
        {l.s, l.s}, {pad, pad}, {pad, pad}, attr);
#else
    po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
    primitive_attr attr; attr.set_post_ops(po);
    convolution_forward::desc d(prop_kind::forward_inference, algorithm::convolution_direct, src, wei, bia, dst,
        {l.s, l.s}, {pad, pad}, {pad, pad});
    convolution_forward::primitive_desc pd(d, attr, eng);
#endif
    double lbest = 1e9; std::string lname;
    for (;;) {
    if (std::string(pd.impl_info_str()).find("ref") != std::string::npos) { if (!pd.next_impl()) break; continue; }
    memory s(pd.src_desc(), eng), w(pd.weights_desc(), eng), b(bia, eng), o(pd.dst_desc(), eng);
    convolution_forward c(pd);
    auto run = [&] { c.execute(st, {{DNNL_ARG_SRC, s}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_BIAS, b}, {DNNL_ARG_DST, o}}); st.wait(); };
    for (int i = 0; i < 5; ++i) run();
    int iters = 40; double best = 1e9;
    for (int r = 0; r < 3; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) run();
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
      if (ms < best) best = ms;
    }
    if (getenv("ALL")) printf("      %7.3f %s\n", best, pd.impl_info_str());
    if (best < lbest) { lbest = best; lname = pd.impl_info_str(); }
    if (!getenv("ALL") || !pd.next_impl()) break;
    }
    total += lbest * l.count;
    printf("%4d->%-4d k%d s%d %3d  %7.3f ms x%d  %s\n", l.ic, l.oc, l.k, l.s, l.hw, lbest, l.count, lname.c_str());
  }
  printf("TOTAL %.2f ms (oneDNN %d.%d)\n", total, dnnl_version()->major, dnnl_version()->minor);
}
