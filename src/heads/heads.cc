// Tenants as heads: find the backbone's classifier, extract features, fit a softmax head, write the new version.
#include "osprey/heads.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "osprey/augment.h"
#include "osprey/classify.h"
#include "osprey/image.h"
#include "osprey/model_dir.h"
#include "osprey/npy.h"
#include "osprey/onnx.h"
#include "osprey/runtime.h"

namespace osprey::heads {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const Node* Producer(const Graph& g, int value) {
  for (const Node& n : g.nodes)
    for (int o : n.outputs)
      if (o == value) return &n;
  return nullptr;
}

bool IsConstant(const Graph& g, int value) { return value >= 0 && g.constants.count(value) != 0; }

// 1, or the product of the dims after the first (the per-image feature size).
int64_t PerRow(const Shape& s) {
  int64_t n = 1;
  for (size_t i = 1; i < s.size(); ++i) n *= s[i];
  return n;
}

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

HeadInfo FindHead(const Graph& g, const std::string& feature) {
  if (g.outputs.empty()) throw Error(ErrorCode::kInvalidArgument, "the backbone has no outputs");
  HeadInfo h;
  h.output = g.value_names[g.outputs[0]];
  int value = g.outputs[0];
  const Node* n = nullptr;
  static const std::set<std::string> kValueKeeping = {"Softmax", "LogSoftmax", "Identity", "Flatten",
                                                      "Reshape", "Squeeze",    "Cast"};
  for (int hops = 0; hops < 16; ++hops) {
    n = Producer(g, value);
    if (!n || !n->domain.empty() || !kValueKeeping.count(n->op_type) || n->inputs.empty()) break;
    value = n->inputs[0];
  }
  auto fail = [&](const std::string& why) -> HeadInfo {
    throw Error(ErrorCode::kInvalidArgument,
                "cannot find the backbone's classifier: " + why +
                    " (osprey looks from the first output back through Softmax/Identity/Flatten/Reshape for a Gemm, "
                    "MatMul (+ Add) or 1x1 Conv with constant weights; name the feature tensor with --features)");
  };
  if (!n) return fail("the first output is not computed by any node");
  h.logits = g.value_names[value];
  if (n->op_type == "Gemm" && n->inputs.size() >= 2 && IsConstant(g, n->inputs[1])) {
    if (n->GetInt("transA", 0) != 0) return fail("the Gemm transposes its data input");
    const Tensor& w = g.constants.at(n->inputs[1]);
    h.kind = "Gemm";
    h.transposed = n->GetInt("transB", 0) != 0;
    h.weight = g.value_names[n->inputs[1]];
    h.feature = g.value_names[n->inputs[0]];
    h.classes = h.transposed ? w.dim(0) : w.dim(1);
    h.feature_dim = h.transposed ? w.dim(1) : w.dim(0);
    if (n->inputs.size() >= 3 && n->inputs[2] >= 0) {
      if (!IsConstant(g, n->inputs[2])) return fail("the Gemm's bias is not a constant");
      h.bias = g.value_names[n->inputs[2]];
    }
  } else if (n->op_type == "Add" && n->inputs.size() == 2) {
    const int bias = IsConstant(g, n->inputs[1]) ? 1 : IsConstant(g, n->inputs[0]) ? 0 : -1;
    const Node* mm = bias >= 0 ? Producer(g, n->inputs[1 - bias]) : nullptr;
    if (!mm || mm->op_type != "MatMul" || !IsConstant(g, mm->inputs[1]))
      return fail("the output comes from an Add that does not follow a MatMul with constant weights");
    const Tensor& w = g.constants.at(mm->inputs[1]);
    if (w.rank() != 2) return fail("the MatMul weight is not a matrix");
    h.kind = "MatMul+Add";
    h.transposed = false;
    h.weight = g.value_names[mm->inputs[1]];
    h.bias = g.value_names[n->inputs[bias]];
    h.feature = g.value_names[mm->inputs[0]];
    h.feature_dim = w.dim(0), h.classes = w.dim(1);
  } else if (n->op_type == "Conv" && n->inputs.size() >= 2 && IsConstant(g, n->inputs[1])) {
    const Tensor& w = g.constants.at(n->inputs[1]);
    if (w.rank() != 4 || w.dim(2) != 1 || w.dim(3) != 1 || n->GetInt("group", 1) != 1)
      return fail("the last Conv is not a plain 1x1 convolution");
    h.kind = "Conv";
    h.weight = g.value_names[n->inputs[1]];
    h.feature = g.value_names[n->inputs[0]];
    h.classes = w.dim(0), h.feature_dim = w.dim(1);
    if (n->inputs.size() >= 3 && n->inputs[2] >= 0) h.bias = g.value_names[n->inputs[2]];
  } else {
    return fail("the first output comes from " + n->Describe());
  }
  if (h.bias.empty())
    throw Error(ErrorCode::kUnsupported, "the backbone's classifier (" + h.kind + " on '" + h.feature +
                                             "') has no bias; osprey writes heads into an existing weight and bias");
  if (!feature.empty() && feature != h.feature)
    throw Error(ErrorCode::kInvalidArgument, "--features '" + feature + "' is not the classifier's input: the " +
                                                 h.kind + " computing the first output reads '" + h.feature + "'");
  return h;
}

Graph TruncateAt(const Graph& graph, const std::string& value) {
  const int id = graph.FindValue(value);
  if (id < 0) throw Error(ErrorCode::kInvalidArgument, "the backbone has no value named '" + value + "'");
  Graph g = graph;
  std::vector<bool> needed(g.num_values(), false);
  needed[id] = true;
  std::vector<Node> kept;
  for (auto it = g.nodes.rbegin(); it != g.nodes.rend(); ++it) {
    bool use = false;
    for (int o : it->outputs) use = use || (o >= 0 && needed[o]);
    if (!use) continue;
    for (int in : it->inputs)
      if (in >= 0) needed[in] = true;
    kept.push_back(*it);
  }
  std::reverse(kept.begin(), kept.end());
  g.nodes = std::move(kept);
  for (auto it = g.constants.begin(); it != g.constants.end();) it = needed[it->first] ? std::next(it) : g.constants.erase(it);
  g.outputs = {id};
  ValueInfo info;
  info.name = value;
  g.output_infos = {info};
  g.Validate();
  return g;
}

ImageFolder ReadImageFolder(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(ErrorCode::kNotFound, "dataset folder '" + dir + "' does not exist (expected one sub-folder per class)");
  ImageFolder out;
  std::vector<fs::path> class_dirs;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string()[0] != '.') class_dirs.push_back(e.path());
  std::sort(class_dirs.begin(), class_dirs.end());
  static const std::set<std::string> kExt = {".jpg", ".jpeg", ".png", ".webp", ".bmp"};
  for (const fs::path& c : class_dirs) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(c)) {
      std::string ext = e.path().extension().string();
      std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return std::tolower(ch); });
      if (e.is_regular_file() && kExt.count(ext)) files.push_back(e.path());
    }
    if (files.empty()) continue;
    std::sort(files.begin(), files.end());
    const int label = static_cast<int>(out.classes.size());
    out.classes.push_back(c.filename().string());
    for (const fs::path& f : files) out.files.push_back(f.string()), out.labels.push_back(label);
  }
  if (out.classes.size() < 2)
    throw Error(ErrorCode::kInvalidArgument, "dataset folder '" + dir + "' has " +
                                                 std::to_string(out.classes.size()) +
                                                 " class folder(s) with images; a head needs at least two");
  return out;
}

TrainResult Train(const std::string& backbone, const std::string& data_dir, const std::string& output,
                  const TrainOptions& options, const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  const auto start = std::chrono::steady_clock::now();
  if (!(options.val_split >= 0 && options.val_split < 1))
    throw Error(ErrorCode::kInvalidArgument, "--val-split must be in [0, 1)");
  ModelDirectory md = OpenModelDirectory(backbone);
  const HeadInfo head = FindHead(md.graph, options.features);
  ImageFolder data = ReadImageFolder(data_dir);
  say("backbone " + md.name + ": classifier " + head.kind + " on '" + head.feature + "' (" +
      std::to_string(head.feature_dim) + " features); " + std::to_string(data.files.size()) + " images in " +
      std::to_string(data.classes.size()) + " classes");

  // Features: the backbone's preprocessing, then the graph truncated at the classifier's input.
  ModelOptions mo;
  mo.compile.num_threads = options.threads;
  // oneDNN's first choice of each kernel, not the fastest by timing: timings differ between runs (more so under load,
  // docs/architecture.md), and another kernel sums in another order, so the features (and the head) would differ in
  // their last bits. Training is reproducible instead: the same data and seed give the same bytes.
  mo.compile.tune = false;
  Model model(TruncateAt(md.graph, head.feature), mo);
  ImagePreprocessor pre(md.preprocess, mo.compile);
  const DecodeOptions decode = DecodeOptionsFor(md.preprocess);
  const ValueInfo& in = md.graph.input_infos.at(0);
  const int64_t fixed_batch = (in.has_shape && !in.dims.empty() && in.dims[0].value > 0) ? in.dims[0].value : -1;
  const int64_t batch = fixed_batch > 0 ? fixed_batch : std::max<int64_t>(1, options.batch_size);
  std::vector<float> features;
  std::vector<int> labels;
  std::vector<std::string> kept_files;
  json bad = json::array();
  // Features of preprocessed images, `per image` values each (a fixed batch dim is filled with repeats).
  auto run_features = [&](std::vector<Tensor>& items) {
    const size_t real = items.size();
    while (static_cast<int64_t>(items.size()) < batch && fixed_batch > 0) items.push_back(items.back());
    auto out = model.Run({{md.preprocess.input, StackTensors(items)}});
    const Tensor& f = out.at(0).second;
    const int64_t per = PerRow(f.shape());
    if (per != head.feature_dim)
      throw Error(ErrorCode::kInternal, "feature tensor has " + std::to_string(per) + " values per image, the " +
                                            "classifier expects " + std::to_string(head.feature_dim));
    const float* p = f.data<float>();
    items.clear();
    return std::vector<float>(p, p + per * static_cast<int64_t>(real));
  };
  std::vector<Tensor> pending;
  std::vector<size_t> pending_index;
  auto flush = [&] {
    if (pending.empty()) return;
    const std::vector<float> f = run_features(pending);
    features.insert(features.end(), f.begin(), f.end());
    for (size_t i : pending_index) {
      labels.push_back(data.labels[i]);
      kept_files.push_back(data.files[i]);
    }
    pending_index.clear();
  };
  const auto t_features = std::chrono::steady_clock::now();
  for (size_t i = 0; i < data.files.size(); ++i) {
    try {
      pending.push_back(pre.Run(ReadImageFile(data.files[i], decode)));
      pending_index.push_back(i);
    } catch (const Error& e) {
      bad.push_back({{"file", data.files[i]}, {"error", e.what()}});
      continue;
    }
    if (static_cast<int64_t>(pending.size()) == batch) flush();
    if ((i + 1) % 200 == 0) say("features: " + std::to_string(i + 1) + " / " + std::to_string(data.files.size()));
  }
  flush();
  const double features_s = Seconds(t_features);
  const int64_t n = static_cast<int64_t>(labels.size()), d = head.feature_dim;
  const int64_t k = static_cast<int64_t>(data.classes.size());
  say("features: " + std::to_string(n) + " images in " + std::to_string(features_s) + " s (" +
      std::to_string(bad.size()) + " unreadable)");

  // Stratified split: per class, a seeded shuffle; the first round(val_split * count) are held out.
  std::vector<uint8_t> validation(n, 0);
  uint64_t state = options.seed;
  for (int64_t c = 0; c < k; ++c) {
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < n; ++i)
      if (labels[i] == c) idx.push_back(i);
    for (size_t i = idx.size(); i > 1; --i) std::swap(idx[i - 1], idx[SplitMix(state) % i]);
    int64_t held = std::llround(options.val_split * static_cast<double>(idx.size()));
    if (options.val_split > 0 && idx.size() >= 2) held = std::clamp<int64_t>(held, 1, idx.size() - 1);
    for (int64_t i = 0; i < held; ++i) validation[idx[i]] = 1;
  }
  std::vector<float> xtrain;
  std::vector<int> ytrain;
  for (int64_t i = 0; i < n; ++i)
    if (!validation[i]) xtrain.insert(xtrain.end(), features.begin() + i * d, features.begin() + (i + 1) * d),
          ytrain.push_back(labels[i]);
  // Feature augmentation: `copies` augmented versions of every training image (never of held-out ones), each seeded
  // by (seed, image, copy) as `osprey augment` does.
  int64_t augmented = 0;
  if (!options.augment.empty() && options.copies > 0) {
    const augment::Pipeline pipeline = augment::Pipeline::FromFile(options.augment);
    const auto t_aug = std::chrono::steady_clock::now();
    std::vector<Tensor> items;
    std::vector<int> item_labels;
    auto flush_aug = [&] {
      if (items.empty()) return;
      const std::vector<float> f = run_features(items);
      xtrain.insert(xtrain.end(), f.begin(), f.end());
      ytrain.insert(ytrain.end(), item_labels.begin(), item_labels.end());
      augmented += static_cast<int64_t>(item_labels.size());
      item_labels.clear();
    };
    for (int64_t i = 0; i < n; ++i) {
      if (validation[i]) continue;
      const Tensor image = ReadImageFile(kept_files[i], decode);
      for (int64_t copy = 1; copy <= options.copies; ++copy) {
        augment::Sample sample;
        sample.image = image;
        const Tensor out = pipeline.Apply(sample, augment::ItemSeed(options.seed, i, copy)).image;
        if (out.dim(2) != image.dim(2))
          throw Error(ErrorCode::kInvalidArgument, "--augment: the pipeline changes the image's channels (" +
                                                       std::to_string(image.dim(2)) + " -> " +
                                                       std::to_string(out.dim(2)) + "); the backbone needs " +
                                                       std::to_string(image.dim(2)));
        items.push_back(pre.Run(out));
        item_labels.push_back(labels[i]);
        if (static_cast<int64_t>(items.size()) == batch) flush_aug();
      }
    }
    flush_aug();
    say("augmentation: " + std::to_string(augmented) + " augmented training images in " +
        std::to_string(Seconds(t_aug)) + " s");
  }
  const auto t_fit = std::chrono::steady_clock::now();
  const SoftmaxFit fit = FitSoftmax(xtrain, static_cast<int64_t>(ytrain.size()), d, ytrain, k, options.c,
                                    options.max_iter);
  const double fit_s = Seconds(t_fit);
  say("fit: " + std::to_string(fit.iterations) + " L-BFGS iterations in " + std::to_string(fit_s) + " s" +
      (fit.converged ? "" : " (max_iter reached)"));

  // Held-out evaluation.
  std::vector<std::vector<int64_t>> confusion(k, std::vector<int64_t>(k, 0));
  int64_t correct = 0, held = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!validation[i]) continue;
    int best = 0;
    double best_z = -INFINITY;
    for (int64_t c = 0; c < k; ++c) {
      double z = fit.bias[c];
      for (int64_t j = 0; j < d; ++j) z += double(fit.weight[c * d + j]) * features[i * d + j];
      if (z > best_z) best_z = z, best = static_cast<int>(c);
    }
    ++confusion[labels[i]][best];
    correct += best == labels[i];
    ++held;
  }
  json per_class = json::array();
  for (int64_t c = 0; c < k; ++c) {
    int64_t tp = confusion[c][c], support = 0, predicted = 0;
    for (int64_t j = 0; j < k; ++j) support += confusion[c][j], predicted += confusion[j][c];
    per_class.push_back({{"label", data.classes[c]},
                         {"precision", predicted ? double(tp) / predicted : 0.0},
                         {"recall", support ? double(tp) / support : 0.0},
                         {"support", support}});
  }

  // The new version: the backbone's file with the head's weight and bias replaced.
  std::error_code ec;
  fs::create_directories(output, ec);
  if (ec) throw Error(ErrorCode::kUnavailable, "cannot create '" + output + "': " + ec.message());
  int64_t version = 0;
  for (const auto& e : fs::directory_iterator(output)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && !name.empty() && std::all_of(name.begin(), name.end(), ::isdigit) && name.size() < 18)
      version = std::max<int64_t>(version, std::stoll(name));
  }
  ++version;
  const fs::path tmp = fs::path(output) / (".training-" + std::to_string(version));
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);
  Tensor w, b(DType::kF32, {k});
  std::copy(fit.bias.begin(), fit.bias.end(), b.data<float>());
  if (head.kind == "Conv") {
    w = Tensor(DType::kF32, {k, d, 1, 1});
    std::copy(fit.weight.begin(), fit.weight.end(), w.data<float>());
  } else if (head.transposed) {
    w = Tensor(DType::kF32, {k, d});
    std::copy(fit.weight.begin(), fit.weight.end(), w.data<float>());
  } else {  // [d, k]
    w = Tensor(DType::kF32, {d, k});
    for (int64_t c = 0; c < k; ++c)
      for (int64_t j = 0; j < d; ++j) w.data<float>()[j * k + c] = fit.weight[c * d + j];
  }
  WriteOnnxWithInitializers(md.model_path, (tmp / "model.onnx").string(), {{head.weight, w}, {head.bias, b}},
                            head.output, k);
  {
    std::ofstream labels_file(tmp / "labels.txt");
    for (const std::string& c : data.classes) labels_file << c << "\n";
  }
  if (!md.config_path.empty()) fs::copy_file(md.config_path, tmp / "config.json");
  json report = {{"backbone", md.model_path},
                 {"classifier", {{"kind", head.kind}, {"feature", head.feature}, {"feature_dim", d}}},
                 {"classes", data.classes},
                 {"images", n},
                 {"train_images", static_cast<int64_t>(ytrain.size()) - augmented},
                 {"augmented_images", augmented},
                 {"validation_images", held},
                 {"unreadable", bad},
                 {"accuracy", held ? double(correct) / held : 0.0},
                 {"per_class", per_class},
                 {"confusion", confusion},
                 {"fit", {{"solver", "lbfgs"}, {"C", options.c}, {"iterations", fit.iterations},
                          {"converged", fit.converged}, {"loss", fit.loss}}},
                 {"seed", options.seed},
                 {"val_split", options.val_split},
                 {"seconds", {{"features", features_s}, {"fit", fit_s}, {"total", Seconds(start)}}}};
  const std::string report_text = report.dump(2) + "\n";
  std::ofstream(tmp / "train_report.json") << report_text;
  if (!options.features_out.empty()) {
    fs::create_directories(options.features_out);
    Tensor tf(DType::kF32, {n, d});
    std::copy(features.begin(), features.end(), tf.data<float>());
    Tensor tl(DType::kI64, {n});
    Tensor tv(DType::kU8, {n});
    for (int64_t i = 0; i < n; ++i) tl.data<int64_t>()[i] = labels[i], tv.data<uint8_t>()[i] = validation[i];
    WriteNpy((fs::path(options.features_out) / "features.npy").string(), tf);
    WriteNpy((fs::path(options.features_out) / "labels.npy").string(), tl);
    WriteNpy((fs::path(options.features_out) / "validation.npy").string(), tv);
  }
  const fs::path final_dir = fs::path(output) / std::to_string(version);
  fs::rename(tmp, final_dir, ec);
  if (ec) throw Error(ErrorCode::kUnavailable, "cannot move the new version into '" + final_dir.string() + "': " +
                                                   ec.message() + " (another training finished first? run again)");
  say("wrote " + final_dir.string() + ": held-out accuracy " + std::to_string(report["accuracy"].get<double>()));
  return {final_dir.string(), report_text};
}

}  // namespace osprey::heads
