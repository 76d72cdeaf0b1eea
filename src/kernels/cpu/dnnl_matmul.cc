// MatMul (numpy semantics: 1-D promotion, broadcast batch dims) and Gemm (transA/transB, alpha, beta, C broadcast)
// on oneDNN's matmul primitive. A constant B is reordered once into the layout oneDNN prefers (with Gemm's alpha
// folded in; plain rows a multiple of 256 elements long get a padded stride, PaddedRows); a constant C becomes a bias
// (row vector) or a binary-add post-op; `_activation` is a post-op (SiLU and tanh GELU: a pass after the
// primitive, OwnSiluActivation, OwnGeluActivation). A MatMul with `_bias` = 1 (fused by the runtime
// from MatMul + Add) takes its [N] input 2 as oneDNN's bias; one with `_residual` = 1 adds its input 3 (the output's
// shape) by a sum post-op before the activation, onto the residual in the output's buffer (in place, or copied there).
#include <omp.h>

#include <cstring>
#include <unordered_map>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dnnl_common.h"
#include "ops/matmul_views.h"

namespace osprey::cpu {
namespace {

using dnnl::memory;

// Where a second operand (B, bias, addend) comes from at run time.
enum class Source { kNone, kConstant, kInput };

class DnnlMatMulKernel final : public Kernel {
 public:
  DnnlMatMulKernel(const char* name, const char* bf16_name) : name_(name), bf16_name_(bf16_name) {}
  const char* Name() const override { return name_; }

  // What the factories fill before Finish().
  memory::desc a_md, b_md, dst_md;    // user layouts (b_md also describes a constant B before packing)
  Shape a_shape, b_shape, out_shape;  // run-time tensor shapes (ONNX shapes, before 1-D promotion)
  Source b_source = Source::kInput;
  const Tensor* b_constant = nullptr;
  float b_scale = 1.f;       // folded into a constant B while packing
  float linear_alpha = 1.f;  // post-op scale when it cannot be folded
  Source bias_source = Source::kNone, add_source = Source::kNone;
  memory::desc bias_md, add_md;        // bias: [1, N]; addend: broadcastable to the output
  Shape c_shape;                       // run-time shape of input 2 (bias or addend)
  bool residual = false;               // input 3, of the output's shape, summed before the activation
  size_t a_offset_bytes = 0, b_offset_bytes = 0;  // where A and B start in inputs 0 and 1 (_MatMulViews)
  std::shared_ptr<Buffer> c_constant;  // beta * C when C is a constant

  // Creates the primitive: float32, or with ctx.bf16 and a constant B a bf16 one (A reordered to bf16 per run, B packed
  // as bf16 once, fp32 accumulation, bias and output) where oneDNN has a fast one and, for Bf16Use::kIfFaster, where
  // it is faster and agrees (PreferBf16).
  bool Finish(const KernelBuildContext& ctx) {
    threads_ = ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads();
    dnnl::matmul::primitive_desc bf16_pd;
    std::string key;
    if (ctx.bf16 != Bf16Use::kNo && b_source == Source::kConstant)
      bf16_pd = TryBf16([&] { return MakePd(ctx, true, &key); });
    if (bf16_pd && ctx.bf16 == Bf16Use::kYes) return Commit(ctx, bf16_pd, true);
    dnnl::matmul::primitive_desc pd = MakePd(ctx, false, &key);
    if (bf16_pd && (!pd || TryBf16([&] { return PreferBf16(key, pd, bf16_pd, a_md, dst_md, b_md, b_constant->raw()); })))
      return Commit(ctx, bf16_pd, true);
    return pd && Commit(ctx, pd, false);
  }

  // The fastest primitive for this matmul in float32 or bf16 (empty when oneDNN has only a reference one); `key`
  // receives its tuning key.
  dnnl::matmul::primitive_desc MakePd(const KernelBuildContext& ctx, bool bf16, std::string* key) {
    const Node& node = ctx.node;
    const memory::data_type type = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
    const memory::desc src_md = WithDataType(a_md, type);
    dnnl::primitive_attr attr = BaseAttr();
    dnnl::post_ops ops;
    if (linear_alpha != 1.f) ops.append_eltwise(dnnl::algorithm::eltwise_linear, linear_alpha, 0.f);
    if (add_source != Source::kNone) {
      add_post_op_index_ = ops.len();
      ops.append_binary(dnnl::algorithm::binary_add, add_md);
    }
    if (residual) ops.append_sum(1.f);    // onto what the output holds when the primitive runs: the residual
    own_silu_ = OwnSiluActivation(node);  // applied after the primitive (Run) instead of as a post-op
    own_gelu_ = OwnGeluActivation(node);  // the same
    if (!own_silu_ && !own_gelu_ && !AppendFusedActivation(node, ops)) return {};
    attr.set_post_ops(ops);
    memory::desc weights_md =
        b_source == Source::kConstant ? memory::desc(b_md.get_dims(), type, memory::format_tag::any) : b_md;
    auto make_pd = [&](const memory::desc& weights) {
      return bias_source != Source::kNone
                 ? dnnl::matmul::primitive_desc(CpuEngine(), src_md, weights, bias_md, dst_md, attr, /*allow_empty=*/true)
                 : dnnl::matmul::primitive_desc(CpuEngine(), src_md, weights, dst_md, attr, /*allow_empty=*/true);
    };
    dnnl::matmul::primitive_desc pd = make_pd(weights_md);
    if (!pd || IsReferenceImpl(pd)) return {};
    if (pd.src_desc() != src_md || pd.dst_desc() != dst_md) return {};
    // Operands by size class where they vary with the input (TuningOperandKey): a model of free sequence length or
    // image width is not timed again at every length.
    const TuningDims rows = b_source == Source::kConstant ? TuningDims::kRowsByClass : TuningDims::kAllByClass;
    const TuningDims fixed = b_source == Source::kConstant ? TuningDims::kExact : TuningDims::kAllByClass;
    auto key_for = [&](const memory::desc& weights) {
      return "matmul2:" + TuningOperandKey(src_md, rows) + TuningOperandKey(weights, fixed) +
             TuningOperandKey(dst_md, rows) + TuningOperandKey(bias_md, fixed) + TuningOperandKey(add_md, rows) + "|" +
             std::to_string(static_cast<int>(bias_source)) + std::to_string(static_cast<int>(add_source)) +
             std::to_string(linear_alpha) + node.GetString("_activation", "") +
             std::to_string(node.GetFloat("_alpha", 0.f)) + std::to_string(node.GetFloat("_beta", 0.f)) +
             (own_silu_ ? ";own-silu" : "") + (own_gelu_ ? ";own-gelu" : "");
      // A residual (sum post-op) is left out: it costs about nothing, and with it in the key a product and the same
      // product fused with its residual were timed apart, and near-ties chose differently (ViT's MLP: brg with the
      // residual, gemm:jit without, the first 0.2 ms slower in the model with its weights not in the cache).
    };
    *key = key_for(weights_md);
    pd = FastestImpl<dnnl::matmul::primitive_desc>(ctx, [&] { return make_pd(weights_md); }, *key);
    if (b_source == Source::kConstant) {
      // A plain row-major B whose rows are a multiple of 1 KiB apart (N a multiple of 256 floats: 768, 3072, 4096...)
      // puts the rows the GEMM packs together into the same few cache sets (the classic power-of-two leading dimension
      // slowdown): on a 2-vCPU EPYC, 197x768 by 768x3072 took 24 ms instead of 11 ms on one thread. Where the chosen
      // implementation packs B row-major, the packed copy gets 16 spare floats per row instead (the arithmetic is
      // unchanged), if oneDNN runs it on that stride.
      const memory::desc padded = PaddedRows(pd.weights_desc());
      if (!padded.is_zero()) {
        const std::string padded_key = key_for(padded);
        dnnl::matmul::primitive_desc padded_pd =
            FastestImpl<dnnl::matmul::primitive_desc>(ctx, [&] { return make_pd(padded); }, padded_key);
        if (padded_pd && !IsReferenceImpl(padded_pd) && padded_pd.weights_desc() == padded) {
          pd = padded_pd;
          *key = padded_key;
        }
      }
    }
    return pd;
  }

  bool Commit(const KernelBuildContext& ctx, const dnnl::matmul::primitive_desc& pd, bool bf16) {
    if (bf16) {
      dnnl::reorder::primitive_desc rpd(CpuEngine(), a_md, CpuEngine(), pd.src_desc(), BaseAttr());
      a_reorder_ = dnnl::reorder(rpd);
      a_reorder_scratch_md_ = rpd.scratchpad_desc();
      a_bf16_md_ = pd.src_desc();
      a_bf16_bytes_ = ThreadScratch::Align(a_bf16_md_.get_size());
      name_ = bf16_name_;
    }
    matmul_ = dnnl::matmul(pd);
    if (b_source == Source::kConstant) packed_b_ = PackWeight(ctx, b_md, *b_constant, pd.weights_desc(), b_scale);
    if (bias_source == Source::kConstant) bias_mem_ = memory(bias_md, CpuEngine(), c_constant->data());
    if (add_source == Source::kConstant) add_mem_ = memory(add_md, CpuEngine(), c_constant->data());
    scratch_md_ = pd.scratchpad_desc();
    b_constant = nullptr;  // only valid during creation
    return true;
  }

  void Run(KernelContext& ctx) override {
    const Node& node = ctx.node;
    CheckShape(node, name_, "input A", ctx.In(0), a_shape);
    if (b_source == Source::kInput) CheckShape(node, name_, "input B", ctx.In(1), b_shape);
    if (bias_source == Source::kInput || add_source == Source::kInput)
      CheckShape(node, name_, "input C", ctx.In(2), c_shape);
    CheckShape(node, name_, "output", ctx.Out(0), out_shape);
    if (residual) {
      CheckShape(node, name_, "residual", ctx.In(3), out_shape);
      // In place (MayOverwriteInput) the residual is where the sum post-op reads it already.
      if (ctx.In(3).raw() != ctx.Out(0).raw()) std::memcpy(ctx.Out(0).raw(), ctx.In(3).raw(), ctx.Out(0).nbytes());
    }
    RunDnnl(node, name_, [&] {
      dnnl::stream& stream = ThreadStream();
      const size_t scratch_bytes = ThreadScratch::Align(scratch_md_.get_size());
      char* scratch = ThreadScratch::Reserve(a_bf16_bytes_ + scratch_bytes + a_reorder_scratch_md_.get_size());
      const auto run = runs_.Acquire([this] { return MakeRunState(); });
      Point(run->user_a, static_cast<const char*>(ctx.In(0).raw()) + a_offset_bytes);
      Point(run->scratchpad, scratch);
      Point(run->dst, ctx.Out(0).raw());
      if (b_source == Source::kInput) Point(run->b, static_cast<const char*>(ctx.In(1).raw()) + b_offset_bytes);
      if (bias_source == Source::kInput) Point(run->bias, ctx.In(2).raw());
      if (add_source == Source::kInput) Point(run->add, ctx.In(2).raw());
      if (a_bf16_bytes_ > 0) {
        Point(run->a, scratch + scratch_bytes);
        Point(run->reorder_scratchpad, scratch + scratch_bytes + a_bf16_bytes_);
        run->a_reorder.Execute(a_reorder_, stream);
      }
      run->matmul.Execute(matmul_, stream);
      stream.wait();
    });
    if (own_silu_) SiluInPlace(ctx.Out(0).data<float>(), ctx.Out(0).numel(), threads_);
    if (own_gelu_) GeluTanhInPlace(ctx.Out(0).data<float>(), ctx.Out(0).numel(), threads_);
  }

  // The residual's buffer may become the output's: the sum post-op then adds it where it lies.
  bool MayOverwriteInput(int i) const override { return i == 3 && residual; }

 private:
  // The memories and argument arrays of one run (one set per concurrent caller, PerCaller); `a` is A itself unless
  // the kernel reorders it to bf16.
  struct RunState {
    memory user_a, a, b, bias, add, dst, scratchpad, reorder_scratchpad;
    ExecArgs a_reorder, matmul;
  };
  RunState MakeRunState() const {
    RunState r;
    r.user_a = UnboundMemory(a_md);
    r.a = a_bf16_bytes_ > 0 ? UnboundMemory(a_bf16_md_) : r.user_a;
    r.dst = UnboundMemory(dst_md);
    r.scratchpad = UnboundMemory(scratch_md_);
    if (a_bf16_bytes_ > 0) {
      r.reorder_scratchpad = UnboundMemory(a_reorder_scratch_md_);
      r.a_reorder.Add(DNNL_ARG_FROM, r.user_a).Add(DNNL_ARG_TO, r.a).Add(DNNL_ARG_SCRATCHPAD, r.reorder_scratchpad);
    }
    r.b = b_source == Source::kConstant ? packed_b_.memory : UnboundMemory(b_md);
    r.matmul.Add(DNNL_ARG_SRC, r.a).Add(DNNL_ARG_WEIGHTS, r.b).Add(DNNL_ARG_DST, r.dst).Add(DNNL_ARG_SCRATCHPAD,
                                                                                            r.scratchpad);
    if (bias_source != Source::kNone)
      r.matmul.Add(DNNL_ARG_BIAS, r.bias = bias_source == Source::kConstant ? bias_mem_ : UnboundMemory(bias_md));
    if (add_source != Source::kNone)
      r.matmul.Add(DNNL_ARG_ATTR_MULTIPLE_POST_OP(add_post_op_index_) | DNNL_ARG_SRC_1,
                   r.add = add_source == Source::kConstant ? add_mem_ : UnboundMemory(add_md));
    return r;
  }

  const char* name_;
  const char* bf16_name_;
  dnnl::matmul matmul_;
  dnnl::reorder a_reorder_;  // A fp32 -> bf16 (bf16 mode only)
  memory::desc a_bf16_md_, a_reorder_scratch_md_;
  size_t a_bf16_bytes_ = 0;
  PackedWeight packed_b_;
  memory bias_mem_, add_mem_;
  memory::desc scratch_md_;
  int add_post_op_index_ = 0;
  bool own_silu_ = false;  // the fused SiLU runs as SiluInPlace after the primitive (OwnSiluActivation)
  bool own_gelu_ = false;  // the fused tanh GELU runs as GeluTanhInPlace after the primitive (OwnGeluActivation)
  int threads_ = 1;
  PerCaller<RunState> runs_;
};

bool AllPositive(const Shape& s) {
  for (int64_t d : s)
    if (d <= 0) return false;
  return true;
}

bool IsConstant(const KernelBuildContext& ctx, int i) {
  return static_cast<int>(ctx.input_values.size()) > i && ctx.input_values[i] != nullptr &&
         ctx.input_values[i]->raw() != nullptr;
}

}  // namespace

std::unique_ptr<Kernel> CreateDnnlMatMul(const KernelBuildContext& ctx) {
  // Input 2 is the fused bias (`_bias` = 1, a [N] row vector), input 3 the fused residual (`_residual` = 1, the
  // output's shape, plain); see the MatMul schema.
  const bool has_bias = ctx.node.GetInt("_bias", 0) != 0, has_residual = ctx.node.GetInt("_residual", 0) != 0;
  const size_t num_inputs = has_residual ? 4 : has_bias ? 3 : 2;
  if (!AllFloat32(ctx) || ctx.input_shapes.size() != num_inputs || ctx.output_shapes.size() != 1) return nullptr;
  if ((has_bias && !ctx.present[2]) || (!has_bias && num_inputs > 2 && ctx.present[2])) return nullptr;
  if (has_residual && (!ctx.present[3] || ctx.input_shapes[3] != ctx.output_shapes[0] ||
                       ctx.InLayout(3) != Layout::kPlain || ctx.OutLayout(0) != Layout::kPlain))
    return nullptr;
  const Shape& a = ctx.input_shapes[0];
  const Shape& b = ctx.input_shapes[1];
  if (a.empty() || b.empty() || !AllPositive(a) || !AllPositive(b) || !AllPositive(ctx.output_shapes[0]))
    return nullptr;
  // numpy matmul: a 1-D A is a row [1, K], a 1-D B a column [K, 1]; those unit dims are dropped from the result.
  Shape a2 = a.size() == 1 ? Shape{1, a[0]} : a;
  Shape b2 = b.size() == 1 ? Shape{b[0], 1} : b;
  const int64_t k = a2.back();
  if (b2[b2.size() - 2] != k) return nullptr;
  const int64_t n = b2.back();
  Shape out2, expected;
  if (b2.size() == 2 && a2.size() > 2) {
    // Batched A times one matrix: rows of all batches form one [batch * M, K] matrix (same bytes, bigger GEMM).
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < a2.size(); ++i) rows *= a2[i];
    expected.assign(a2.begin(), a2.end() - 1);
    a2 = {rows, k};
    out2 = {rows, n};
  } else {
    const size_t rank = std::max(a2.size(), b2.size());
    if (rank > 6) return nullptr;
    a2.insert(a2.begin(), rank - a2.size(), 1);
    b2.insert(b2.begin(), rank - b2.size(), 1);
    for (size_t i = 0; i + 2 < rank; ++i) {
      if (a2[i] != b2[i] && a2[i] != 1 && b2[i] != 1) return nullptr;
      out2.push_back(std::max(a2[i], b2[i]));
    }
    expected = out2;
    expected.push_back(a2[rank - 2]);
    out2.push_back(a2[rank - 2]);
    out2.push_back(n);
  }
  if (b.size() > 1) expected.push_back(n);
  if (a.size() == 1) expected.erase(expected.end() - (b.size() > 1 ? 2 : 1));
  if (expected != ctx.output_shapes[0]) return nullptr;

  OmpThreadsGuard threads(ctx.num_threads);
  auto kernel = std::make_unique<DnnlMatMulKernel>("MatMulF32Dnnl", "MatMulBf16Dnnl");
  kernel->a_md = PlainDesc(ToDims(a2));
  kernel->b_md = PlainDesc(ToDims(b2));
  kernel->dst_md = PlainDesc(ToDims(out2));
  kernel->a_shape = a;
  kernel->b_shape = b;
  kernel->out_shape = ctx.output_shapes[0];
  kernel->residual = has_residual;
  if (IsConstant(ctx, 1)) {
    kernel->b_source = Source::kConstant;
    kernel->b_constant = ctx.input_values[1];
  }
  if (has_bias) {
    if (b.size() < 2 || ctx.input_shapes[2] != Shape{n}) return nullptr;
    // oneDNN's matmul bias has the destination's rank: [1, ..., 1, N], broadcast over every row of every batch.
    memory::dims bias_dims(out2.size(), 1);
    bias_dims.back() = n;
    kernel->bias_md = PlainDesc(bias_dims);
    kernel->c_shape = ctx.input_shapes[2];
    kernel->bias_source = Source::kInput;
    if (IsConstant(ctx, 2)) {
      kernel->bias_source = Source::kConstant;
      kernel->c_constant = Allocator::Host().Allocate(std::max<size_t>(n * sizeof(float), 64));
      std::memcpy(kernel->c_constant->data(), ctx.input_values[2]->raw(), n * sizeof(float));
    }
  }
  if (!kernel->Finish(ctx)) return nullptr;
  return kernel;
}

// _MatMulViews (ops/matmul_views.h; its schema checked the views): oneDNN's matmul reads strided operands and writes
// a strided output as they are (memory descriptors with those strides; `gemm:jit` where `brg` takes only dense ones).
std::unique_ptr<Kernel> CreateDnnlMatMulViews(const KernelBuildContext& ctx) {
  if (!AllFloat32(ctx) || ctx.input_shapes.size() != 2 || ctx.output_shapes.size() != 1 || IsConstant(ctx, 1))
    return nullptr;
  StridedView a = ReadView(ctx.node, "a"), b = ReadView(ctx.node, "b");
  const size_t rank = a.dims.size();
  for (StridedView* v : {&a, &b})  // an axis of extent 1 is never stepped along; oneDNN refuses a stride of 0 there
    for (size_t d = rank; d-- > 0;)
      if (v->dims[d] == 1 && v->strides[d] == 0) v->strides[d] = d + 1 < rank ? v->strides[d + 1] * v->dims[d + 1] : 1;
  const ViewProduct p = ProductOf(ctx.node, a, b);
  if (p.output != ctx.output_shapes[0]) return nullptr;

  OmpThreadsGuard threads(ctx.num_threads);
  auto kernel = std::make_unique<DnnlMatMulKernel>("MatMulF32Dnnl", "MatMulBf16Dnnl");
  kernel->a_md = memory::desc(ToDims(a.dims), memory::data_type::f32, ToDims(a.strides));
  kernel->b_md = memory::desc(ToDims(b.dims), memory::data_type::f32, ToDims(b.strides));
  kernel->dst_md = memory::desc(ToDims(p.dims), memory::data_type::f32, ToDims(p.output_strides));
  kernel->a_offset_bytes = static_cast<size_t>(a.offset) * sizeof(float);
  kernel->b_offset_bytes = static_cast<size_t>(b.offset) * sizeof(float);
  kernel->a_shape = ctx.input_shapes[0];
  kernel->b_shape = ctx.input_shapes[1];
  kernel->out_shape = p.output;
  kernel->linear_alpha = ctx.node.GetFloat("scale", 1.f);
  if (!kernel->Finish(ctx)) return nullptr;
  return kernel;
}

std::unique_ptr<Kernel> CreateDnnlGemm(const KernelBuildContext& ctx) {
  if (!AllFloat32(ctx) || ctx.input_shapes.size() < 2 || ctx.output_shapes.size() != 1) return nullptr;
  const Node& node = ctx.node;
  const Shape& a = ctx.input_shapes[0];
  const Shape& b = ctx.input_shapes[1];
  if (a.size() != 2 || b.size() != 2 || !AllPositive(a) || !AllPositive(b)) return nullptr;
  const bool trans_a = node.GetInt("transA", 0) != 0, trans_b = node.GetInt("transB", 0) != 0;
  const float alpha = node.GetFloat("alpha", 1.f), beta = node.GetFloat("beta", 1.f);
  const int64_t m = trans_a ? a[1] : a[0], k = trans_a ? a[0] : a[1];
  const int64_t n = trans_b ? b[0] : b[1];
  if ((trans_b ? b[1] : b[0]) != k || ctx.output_shapes[0] != Shape{m, n}) return nullptr;

  OmpThreadsGuard threads(ctx.num_threads);
  auto kernel = std::make_unique<DnnlMatMulKernel>("GemmF32Dnnl", "GemmBf16Dnnl");
  // Transposes are strides: A^T of a row-major [K, M] is [M, K] with strides {1, M}.
  kernel->a_md = memory::desc({m, k}, memory::data_type::f32, trans_a ? memory::dims{1, m} : memory::dims{k, 1});
  kernel->b_md = memory::desc({k, n}, memory::data_type::f32, trans_b ? memory::dims{1, k} : memory::dims{n, 1});
  kernel->dst_md = PlainDesc({m, n});
  kernel->a_shape = a;
  kernel->b_shape = b;
  kernel->out_shape = {m, n};
  if (IsConstant(ctx, 1)) {
    kernel->b_source = Source::kConstant;
    kernel->b_constant = ctx.input_values[1];
    kernel->b_scale = alpha;
  } else {
    kernel->linear_alpha = alpha;
  }

  const bool has_c = ctx.present.size() > 2 && ctx.present[2] && beta != 0.f;
  if (has_c) {
    const Shape& c = ctx.input_shapes[2];
    if (c.size() > 2) return nullptr;
    Shape c2 = c;
    c2.insert(c2.begin(), 2 - c2.size(), 1);
    if ((c2[0] != 1 && c2[0] != m) || (c2[1] != 1 && c2[1] != n)) return nullptr;
    kernel->c_shape = c;
    Source source = Source::kInput;
    const bool row_vector = c2[0] == 1 && c2[1] == n;
    if (IsConstant(ctx, 2)) {
      // beta * C, broadcast to the full [M, N] unless it is a row vector: oneDNN 2.6 has optimised binary post-ops
      // for a full operand but not for a column [M, 1].
      source = Source::kConstant;
      if (!row_vector) c2 = {m, n};
      const float* src = ctx.input_values[2]->data<float>();
      kernel->c_constant = Allocator::Host().Allocate(std::max<size_t>(NumElements(c2) * sizeof(float), 64));
      float* dst = static_cast<float*>(kernel->c_constant->data());
      const int64_t c_rows = c.size() == 2 ? c[0] : 1, c_cols = c.empty() ? 1 : c.back();
      for (int64_t i = 0; i < c2[0]; ++i)
        for (int64_t j = 0; j < c2[1]; ++j)
          dst[i * c2[1] + j] = beta * src[(c_rows == 1 ? 0 : i) * c_cols + (c_cols == 1 ? 0 : j)];
    } else if (beta != 1.f) {
      return nullptr;
    }
    // A row vector C is a bias, unless a scale post-op must run first (the bias is added before post-ops).
    if (row_vector && kernel->linear_alpha == 1.f) {
      kernel->bias_source = source;
      kernel->bias_md = PlainDesc({1, n});
    } else {
      kernel->add_source = source;
      kernel->add_md = PlainDesc(ToDims(c2));
    }
  }
  if (!kernel->Finish(ctx)) return nullptr;
  return kernel;
}

}  // namespace osprey::cpu
