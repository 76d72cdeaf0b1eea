// Einsum (opset 12): the equation reader (einsum.h) and the schema.
#include "ops/einsum.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <map>

#include "ops/op_registry.h"

namespace osprey {
namespace {

[[noreturn]] void Bad(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, where + ": " + what);
}

// One term: its letters and where its ellipsis is (-1: none), spaces dropped.
struct Term {
  std::string letters;
  int ellipsis_at = -1;  // index into letters before which the ellipsis dims go
};

Term ReadTerm(const std::string& text, const std::string& where) {
  Term t;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ') continue;
    if (c == '.') {
      if (text.compare(i, 3, "...") != 0 || t.ellipsis_at >= 0) Bad(where, "malformed ellipsis in \"" + text + "\"");
      t.ellipsis_at = static_cast<int>(t.letters.size());
      i += 2;
      continue;
    }
    if (!std::isalpha(static_cast<unsigned char>(c))) Bad(where, std::string("unexpected '") + c + "' in equation");
    t.letters += c;
  }
  return t;
}

}  // namespace

Shape EinsumSpec::OutputShape() const {
  Shape s;
  for (int l : output) s.push_back(sizes[l]);
  return s;
}

int64_t EinsumSpec::Work() const {
  int64_t w = 1;
  for (int64_t s : sizes) {
    if (s == 0) return 0;
    if (w > INT64_MAX / s) return INT64_MAX;
    w *= s;
  }
  return w;
}

EinsumSpec ParseEinsum(const std::string& equation, const std::vector<Shape>& shapes, const std::string& where) {
  if (equation.size() > 4096) Bad(where, "equation longer than 4096 characters");
  const size_t arrow = equation.find("->");
  const std::string lhs = equation.substr(0, arrow);
  std::vector<Term> terms;
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    terms.push_back(ReadTerm(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start), where));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != shapes.size())
    Bad(where,
        "the equation has " + std::to_string(terms.size()) + " terms for " + std::to_string(shapes.size()) + " inputs");
  // Ellipsis dims: as many as the largest count any input gives it.
  size_t ellipsis_rank = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    const size_t named = terms[i].letters.size();
    if (terms[i].ellipsis_at < 0 ? shapes[i].size() != named : shapes[i].size() < named)
      Bad(where, "term " + std::to_string(i) + " names " + std::to_string(named) + " dims, input " + std::to_string(i) +
                     " has shape " + ShapeToString(shapes[i]));
    if (terms[i].ellipsis_at >= 0) ellipsis_rank = std::max(ellipsis_rank, shapes[i].size() - named);
  }
  EinsumSpec spec;
  std::map<char, int> label_of;
  std::map<char, int> count;  // over the inputs, for the implicit output
  auto letter_label = [&](char c) {
    auto [it, fresh] = label_of.emplace(c, static_cast<int>(spec.sizes.size()));
    if (fresh) spec.sizes.push_back(-1);
    return it->second;
  };
  for (const Term& t : terms)
    for (char c : t.letters) letter_label(c), ++count[c];
  const int first_ellipsis = static_cast<int>(spec.sizes.size());
  spec.sizes.resize(spec.sizes.size() + ellipsis_rank, -1);
  spec.strides.assign(shapes.size(), std::vector<int64_t>(spec.sizes.size(), 0));
  for (size_t i = 0; i < terms.size(); ++i) {
    const Term& t = terms[i];
    const Shape& shape = shapes[i];
    std::vector<int>& dims = spec.inputs.emplace_back();
    const size_t own_ellipsis = t.ellipsis_at < 0 ? 0 : shape.size() - t.letters.size();
    for (size_t k = 0; k <= t.letters.size(); ++k) {
      if (static_cast<int>(k) == t.ellipsis_at)
        for (size_t e = 0; e < own_ellipsis; ++e)
          dims.push_back(first_ellipsis + static_cast<int>(ellipsis_rank - own_ellipsis + e));
      if (k < t.letters.size()) dims.push_back(label_of[t.letters[k]]);
    }
    for (size_t d = 0; d < dims.size(); ++d)  // a diagonal takes equal dims (numpy does not broadcast inside it)
      for (size_t e = d + 1; e < dims.size(); ++e)
        if (dims[d] == dims[e] && shape[d] != shape[e])
          Bad(where, "input " + std::to_string(i) + " " + ShapeToString(shape) + " repeats a label over dims of size " +
                         std::to_string(shape[d]) + " and " + std::to_string(shape[e]));
    int64_t stride = 1;
    for (size_t d = shape.size(); d-- > 0;) {
      // A dim of 1 broadcasts against the label's size elsewhere (stride 0), as numpy does, letters and '...' alike.
      const int l = dims[d];
      int64_t& size = spec.sizes[l];
      if (shape[d] != 1) {
        if (size != -1 && size != 1 && size != shape[d])
          Bad(where, "a label has size " + std::to_string(size) + " in one place and " + std::to_string(shape[d]) +
                         " in another (input " + std::to_string(i) + " " + ShapeToString(shape) + ")");
        size = shape[d];
        spec.strides[i][l] += stride;
      }
      stride *= std::max<int64_t>(shape[d], 1);
    }
  }
  for (int64_t& size : spec.sizes) size = std::max<int64_t>(size, 1);  // only ever seen as 1 (or not at all)
  // Letters missing from the output are summed over.
  if (arrow == std::string::npos) {  // implicit: the ellipsis dims, then the letters seen once, alphabetically
    for (size_t e = 0; e < ellipsis_rank; ++e) spec.output.push_back(first_ellipsis + static_cast<int>(e));
    for (const auto& [c, n] : count)
      if (n == 1) spec.output.push_back(label_of[c]);
  } else {
    const Term out = ReadTerm(equation.substr(arrow + 2), where);
    if (out.ellipsis_at < 0 && ellipsis_rank > 0)  // numpy refuses this too
      Bad(where, "the inputs' '...' stands for " + std::to_string(ellipsis_rank) +
                     " dims; the output must keep them (write '...' in it)");
    for (size_t k = 0; k <= out.letters.size(); ++k) {
      if (static_cast<int>(k) == out.ellipsis_at)
        for (size_t e = 0; e < ellipsis_rank; ++e) spec.output.push_back(first_ellipsis + static_cast<int>(e));
      if (k == out.letters.size()) break;
      const auto it = label_of.find(out.letters[k]);
      if (it == label_of.end()) Bad(where, std::string("output label '") + out.letters[k] + "' is in no input");
      if (std::count(out.letters.begin(), out.letters.end(), out.letters[k]) > 1)
        Bad(where, std::string("output label '") + out.letters[k] + "' appears twice");
      spec.output.push_back(it->second);
    }
  }
  return spec;
}

namespace {

void InferEinsum(InferContext& ctx) {
  if (!ctx.node.Has("equation")) ctx.Fail("attribute 'equation' is required");
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.Has(i)) ctx.Fail("input " + std::to_string(i) + " is required");
    if (ctx.input_dtypes[i] != ctx.input_dtypes[0])
      ctx.Fail("inputs differ in dtype: " + std::string(DTypeName(ctx.input_dtypes[0])) + " and " +
               DTypeName(ctx.input_dtypes[i]));
  }
  const DType t = ctx.input_dtypes[0];
  if (t != DType::kF32 && t != DType::kI32 && t != DType::kI64)
    ctx.Fail(std::string("float32, int32 or int64 inputs only, got ") + DTypeName(t));
  const EinsumSpec spec = ParseEinsum(ctx.node.GetString("equation", ""), ctx.input_shapes, ctx.node.Describe());
  ctx.SetOutput(0, t, spec.OutputShape());
}

}  // namespace

void RegisterEinsumOps(OpRegistry& r) { r.Add(OpSchema{"Einsum", 1, 1 << 10, 1, 1, InferEinsum, {}}); }

}  // namespace osprey
