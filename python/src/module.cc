// osprey._osprey: the C++ engine, image decoding, classification and augmentation for Python (nanobind).
// The public, documented API is the Python layer in python/osprey/*.py; this module is its thin native core:
// - NumPy arrays in: C-contiguous arrays are read in place (Buffer::Borrow), others are converted once;
// - NumPy arrays out: an output tensor's buffer becomes the array's memory (a capsule holds the shared_ptr);
// - the GIL is released around every run, decode and augmentation;
// - osprey::Error becomes the osprey.Error subclass of its code, with the message the CLI prints.
#include <malloc.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "cli/common.h"
#include "osprey/augment.h"
#include "osprey/classify.h"
#include "osprey/error.h"
#include "osprey/image.h"
#include "osprey/model_dir.h"
#include "osprey/onnx.h"
#include "osprey/runtime.h"
#include "osprey/tensor.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace osprey::python {
namespace {

// ---- the GIL ---------------------------------------------------------------------------------------------------

// Releases the GIL for its scope. When a daemon thread takes the GIL back after the interpreter began to exit, CPython
// (before 3.14) ends the thread with pthread_exit, and the unwinding through C++ frames (this destructor is noexcept)
// aborted the process: "terminate called without an active exception", exit status 134, whenever a program ended
// while a daemon thread was running a model. So an atexit hook (RegisterExitHook) sets `g_exiting`, and a thread that
// comes back after it never takes the GIL: it waits for the process to end. The hook also waits (GIL released) for
// threads already on their way back (`g_returning`), so none is left waiting for a GIL that exit then hands it.
std::atomic<bool> g_exiting{false};
std::atomic<int> g_returning{0};

class ReleaseGil {
 public:
  ReleaseGil() : state_(PyEval_SaveThread()) {}
  ~ReleaseGil() {
    g_returning.fetch_add(1);
    if (g_exiting.load()) {
      g_returning.fetch_sub(1);
      nb::set_leak_warnings(false);  // this thread's objects stay: nanobind would list them at exit as leaks
      for (;;) pause();
    }
    PyEval_RestoreThread(state_);
    g_returning.fetch_sub(1);
  }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  PyThreadState* state_;
};

void RegisterExitHook() {
  nb::module_::import_("atexit").attr("register")(nb::cpp_function([] {
    g_exiting.store(true);
    PyThreadState* state = PyEval_SaveThread();
    for (int waited_ms = 0; g_returning.load() > 0 && waited_ms < 2000; ++waited_ms) usleep(1000);
    PyEval_RestoreThread(state);
  }));
}

// ---- errors ----------------------------------------------------------------------------------------------------

PyObject* g_errors[8] = {};  // indexed by ErrorCode (codes without a class here: osprey.Error)
PyObject* g_base_error = nullptr;

PyObject* ErrorClass(ErrorCode code) {
  int i = static_cast<int>(code);
  return (i >= 0 && i < static_cast<int>(std::size(g_errors)) && g_errors[i]) ? g_errors[i] : g_base_error;
}

void RegisterErrors(nb::module_& m) {
  g_base_error = PyErr_NewExceptionWithDoc("osprey.Error", "Base class of every error osprey raises.",
                                           PyExc_Exception, nullptr);
  m.attr("Error") = nb::handle(g_base_error);
  struct Kind {
    ErrorCode code;
    const char* name;
    PyObject* builtin;
    const char* doc;
  };
  const Kind kinds[] = {
      {ErrorCode::kInvalidArgument, "InvalidArgument", PyExc_ValueError, "Bad input: the message says what and why."},
      {ErrorCode::kNotFound, "NotFound", PyExc_FileNotFoundError, "A file, model or name that does not exist."},
      {ErrorCode::kUnsupported, "Unsupported", PyExc_NotImplementedError,
       "Valid input that osprey does not handle (an op, a transform, a setting)."},
      {ErrorCode::kResourceExhausted, "ResourceExhausted", PyExc_MemoryError,
       "Past a memory or size limit (osprey's or the machine's)."},
      {ErrorCode::kUnavailable, "Unavailable", PyExc_RuntimeError, "Temporarily unavailable; retrying may work."},
      {ErrorCode::kInternal, "Internal", PyExc_RuntimeError, "A bug in osprey (please report it)."},
      {ErrorCode::kDeadlineExceeded, "DeadlineExceeded", PyExc_TimeoutError,
       "A run stopped at its deadline (RunOptions.timeout) before its next step."},
      {ErrorCode::kCancelled, "Cancelled", PyExc_RuntimeError,
       "A run stopped before its next step because RunOptions.terminate was set."},
  };
  static_assert(std::size(g_errors) == static_cast<size_t>(ErrorCode::kCancelled) + 1, "a class slot per code");
  for (const Kind& k : kinds) {
    PyObject* bases = PyTuple_Pack(2, g_base_error, k.builtin);
    std::string qualified = std::string("osprey.") + k.name;
    PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), k.doc, bases, nullptr);
    Py_DECREF(bases);
    g_errors[static_cast<int>(k.code)] = cls;
    m.attr(k.name) = nb::handle(cls);
  }
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(ErrorClass(e.code()), e.what());
    } catch (const std::bad_alloc&) {
      PyErr_SetString(ErrorClass(ErrorCode::kResourceExhausted),
                      "out of memory: the input or a parameter asks for more memory than this machine has");
    }
  });
}

// ---- arrays <-> tensors ----------------------------------------------------------------------------------------

using InArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

DType DTypeFromDlpack(nb::dlpack::dtype t, std::string_view what) {
  using C = nb::dlpack::dtype_code;
  const auto code = static_cast<C>(t.code);
  if (t.lanes == 1) {
    if (code == C::Float && t.bits == 32) return DType::kF32;
    if (code == C::Float && t.bits == 16) return DType::kF16;
    if (code == C::Bfloat && t.bits == 16) return DType::kBF16;
    if (code == C::Int && t.bits == 8) return DType::kI8;
    if (code == C::UInt && t.bits == 8) return DType::kU8;
    if (code == C::Int && t.bits == 32) return DType::kI32;
    if (code == C::Int && t.bits == 64) return DType::kI64;
    if (code == C::Bool && t.bits == 8) return DType::kBool;
  }
  const char* kind = code == C::Float     ? "float"
                     : code == C::Int     ? "int"
                     : code == C::UInt    ? "uint"
                     : code == C::Bool    ? "bool"
                     : code == C::Complex ? "complex"
                                          : nullptr;
  const std::string name =
      kind ? kind + std::to_string(t.bits) : "code " + std::to_string(t.code) + ", " + std::to_string(t.bits) + " bits";
  throw Error(ErrorCode::kInvalidArgument,
              std::string(what) + ": " + name + (t.lanes == 1 ? "" : " x" + std::to_string(t.lanes)) +
                  " arrays are not supported; convert it (x.astype(...)) to float32, float16, int8, uint8, int32, "
                  "int64 or bool, whichever the model's input is");
}

nb::dlpack::dtype DlpackFromDType(DType d) {
  using C = nb::dlpack::dtype_code;
  auto make = [](C code, int bits) { return nb::dlpack::dtype{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1}; };
  switch (d) {
    case DType::kF32: return make(C::Float, 32);
    case DType::kF16: return make(C::Float, 16);
    case DType::kBF16: return make(C::Bfloat, 16);
    case DType::kI8: return make(C::Int, 8);
    case DType::kU8: return make(C::UInt, 8);
    case DType::kI32: return make(C::Int, 32);
    case DType::kI64: return make(C::Int, 64);
    case DType::kBool: return make(C::Bool, 8);
  }
  return make(C::Float, 32);
}

/// Any array-like -> a C-contiguous CPU ndarray (the same memory when it already is one; else NumPy converts it).
/// Something without a dtype of its own (a list, a Python number) becomes `untyped_as` when given (a model input's
/// dtype, as ONNX Runtime converts lists); an array keeps its dtype.
InArray AsArray(nb::handle obj, const std::string& what, const char* untyped_as = nullptr) {
  InArray a;
  if (nb::try_cast(obj, a, /*convert=*/true)) return a;
  nb::object np = nb::module_::import_("numpy");
  nb::object converted = untyped_as && !nb::hasattr(obj, "dtype")
                             ? np.attr("ascontiguousarray")(obj, "dtype"_a = untyped_as)
                             : np.attr("ascontiguousarray")(obj);
  if (nb::try_cast(converted, a, true)) return a;
  throw Error(ErrorCode::kInvalidArgument, what + ": expected a NumPy array (or something numpy.asarray accepts), got " +
                                               std::string(nb::type_name(obj.type()).c_str()));
}

/// A tensor over the array's memory (no copy). The caller keeps `a` alive while the tensor is used.
Tensor BorrowTensor(const InArray& a, std::string_view what) {
  DType dtype = DTypeFromDlpack(a.dtype(), what);
  Shape shape;
  for (size_t i = 0; i < a.ndim(); ++i) shape.push_back(static_cast<int64_t>(a.shape(i)));
  size_t bytes = static_cast<size_t>(NumBytes(dtype, shape));
  auto buffer = Buffer::Borrow(const_cast<void*>(a.data()), bytes);
  return Tensor::View(dtype, std::move(shape), std::move(buffer), 0);
}

/// A NumPy array that owns `t`'s buffer (no copy) when osprey holds it alone; a copy when the buffer is shared with
/// something that must not change (a model constant, a borrowed input).
nb::object ToArray(Tensor t) {
  if (!t.buffer() || t.buffer()->borrowed() || t.buffer().use_count() > 1) t = t.Clone();
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  auto* holder = new std::shared_ptr<Buffer>(t.buffer());
  nb::capsule owner(holder, [](void* p) noexcept { delete static_cast<std::shared_ptr<Buffer>*>(p); });
  nb::ndarray<nb::numpy> array(t.raw(), shape.size(), shape.data(), owner, nullptr, DlpackFromDType(t.dtype()));
  return array.cast();
}

std::string PathOf(nb::handle obj) { return nb::cast<std::string>(nb::str(nb::module_::import_("os").attr("fspath")(obj))); }

bool IsPathLike(nb::handle obj) {
  return nb::isinstance<nb::str>(obj) || nb::hasattr(obj, "__fspath__");
}

// ---- Model -----------------------------------------------------------------------------------------------------

nb::object DimsToPython(const ValueInfo& info) {
  if (!info.has_shape) return nb::none();
  nb::list dims;
  for (const Dim& d : info.dims) {
    if (d.value >= 0)
      dims.append(d.value);
    else if (!d.symbol.empty())
      dims.append(nb::str(d.symbol.c_str()));
    else
      dims.append(nb::none());
  }
  return nb::tuple(dims);
}

// After a model is freed: the process's idle execution arenas and kernel scratch (pooled for the next run of any
// model; in a server its housekeeping frees them, here nothing else would) and the heap's free pages, as the server's
// unload does.
void GiveMemoryBack() {
  TrimSharedArenas(0);
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

// Options of runs (ONNX Runtime's RunOptions): `timeout` in seconds (0: none) and `terminate`, which another thread
// sets to stop the runs using these options before their next step (RunDeadline; osprey.DeadlineExceeded,
// osprey.Cancelled).
struct PyRunOptions {
  std::atomic<bool> terminate{false};
  double timeout = 0;
};

class PyModel {
 public:
  static constexpr int64_t kTrimAfterBytes = int64_t{4} << 20;

  PyModel(nb::handle source, int threads, const std::string& precision, const std::string& device) {
    const DeviceSpec where = ParseDevice(device, "device");
    if (where.kind != Device::kHost) {
      InitDevices();
      RequireDevice(where);  // built without CUDA, or no GPU: says so (kUnsupported)
    }
    if (threads < 0) throw Error(ErrorCode::kInvalidArgument, "threads must be >= 0 (0 = all cores), got " +
                                                                   std::to_string(threads));
    ModelOptions options;
    options.compile.num_threads = threads;
    options.compile.precision = ParsePrecision(precision);
    options.compile.device = where;
    Graph graph;
    if (nb::isinstance<nb::bytes>(source)) {
      nb::bytes b = nb::borrow<nb::bytes>(source);
      const char* data = b.c_str();
      size_t size = b.size();
      ReleaseGil release;
      graph = ParseOnnxModel(data, size, "");
    } else {
      path_ = PathOf(source);
      ReleaseGil release;
      if (std::filesystem::is_directory(path_)) {
        directory_ = OpenModelDirectory(path_);
        graph = directory_->graph;
      } else {
        graph = LoadOnnxModel(path_);
      }
    }
    ReleaseGil release;
    model_ = std::make_unique<Model>(std::move(graph), options);
  }

  nb::dict Run(nb::args args, nb::kwargs kwargs) { return RunWith(nullptr, args, kwargs); }

  nb::dict RunWith(const PyRunOptions* options, nb::args args, nb::kwargs kwargs) {
    const Graph& g = model_->graph();
    std::vector<InArray> keep;  // the arrays whose memory the tensors borrow, alive until the run returns
    std::map<std::string, Tensor> inputs;
    auto add = [&](const std::string& name, nb::handle value) {
      // The common case (a C-contiguous array) builds no message strings: this is the per-call overhead.
      InArray a;
      if (!nb::try_cast(value, a, /*convert=*/true)) {
        const auto info = std::find_if(g.input_infos.begin(), g.input_infos.end(),
                                       [&](const ValueInfo& i) { return i.name == name; });
        a = AsArray(value, "input \"" + name + "\"",
                    info != g.input_infos.end() && info->dtype != DType::kBF16 ? DTypeName(info->dtype) : nullptr);
      }
      keep.push_back(std::move(a));
      inputs[name] = BorrowTensor(keep.back(), name);  // the input's name starts any dtype error
    };
    std::vector<nb::handle> positional;
    if (args.size() == 1 && nb::isinstance<nb::dict>(args[0])) {
      for (auto [k, v] : nb::borrow<nb::dict>(args[0])) add(nb::cast<std::string>(nb::str(k)), v);
    } else if (args.size() == 1 && (nb::isinstance<nb::list>(args[0]) || nb::isinstance<nb::tuple>(args[0])) &&
               g.inputs.size() != 1) {
      for (nb::handle h : args[0]) positional.push_back(h);
    } else {
      for (nb::handle h : args) positional.push_back(h);
    }
    if (positional.size() > g.input_infos.size())
      throw Error(ErrorCode::kInvalidArgument, "the model has " + std::to_string(g.input_infos.size()) +
                                                   " inputs, " + std::to_string(positional.size()) + " were given");
    for (size_t i = 0; i < positional.size(); ++i) add(g.input_infos[i].name, positional[i]);
    for (auto [k, v] : kwargs) add(nb::cast<std::string>(nb::str(k)), v);
    std::vector<std::pair<std::string, Tensor>> outputs;
    {
      ReleaseGil release;
      std::optional<RunDeadline> deadline;
      if (options) {
        char limit[48];
        std::snprintf(limit, sizeof limit, "RunOptions.timeout %g s", options->timeout);
        const auto at = options->timeout > 0
                            ? RunDeadline::Clock::now() + std::chrono::duration_cast<RunDeadline::Clock::duration>(
                                                              std::chrono::duration<double>(options->timeout))
                            : RunDeadline::Clock::time_point::max();
        deadline.emplace(
            at, limit, [options] { return options->terminate.load(std::memory_order_relaxed); },
            "RunOptions.terminate was set");
      }
      outputs = model_->Run(inputs);
    }
    nb::dict result;
    for (auto& [name, t] : outputs) result[nb::str(name.c_str())] = ToArray(std::move(t));
    return result;
  }

  nb::list Infos(bool outputs) const {
    const Graph& g = model_->graph();
    const auto& infos = outputs ? g.output_infos : g.input_infos;
    nb::list out;
    for (const ValueInfo& info : infos)
      out.append(nb::make_tuple(info.name, DTypeName(info.dtype), DimsToPython(info)));
    return out;
  }

  std::string Inspect() const {
    if (path_.empty())
      throw Error(ErrorCode::kInvalidArgument, "inspect() needs a model loaded from a file or directory");
    std::ostringstream out;
    cli::InspectOptions options;
    options.model = path_;
    cli::RunInspect(options, out);
    return out.str();
  }

  nb::dict Memory() const {
    nb::dict d;
    d["weight_bytes"] = model_->WeightBytes();
    d["shared_weight_bytes"] = model_->SharedWeightBytes();
    d["runtime_bytes"] = model_->RuntimeBytes();
    d["device_bytes"] = model_->DeviceBytes();
    return d;
  }

  // The ONNX file's own description of the model (ONNX Runtime's ModelMetadata fields). The file's strings are not
  // checked for UTF-8 when parsed: invalid bytes read as U+FFFD.
  nb::dict Metadata() const {
    const Graph& g = model_->graph();
    const ModelMetadata none;
    const ModelMetadata& m = g.metadata ? *g.metadata : none;
    auto text = [](const std::string& s) {
      PyObject* str = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
      if (!str) throw nb::python_error();  // out of memory
      return nb::steal<nb::str>(str);
    };
    nb::dict d, custom;
    d["producer_name"] = text(m.producer_name);
    d["producer_version"] = text(m.producer_version);
    d["graph_name"] = text(g.name);
    d["graph_description"] = text(m.graph_description);
    d["domain"] = text(m.domain);
    d["description"] = text(m.description);
    d["version"] = m.version;
    for (const auto& [key, value] : m.properties) custom[text(key)] = text(value);
    d["custom_metadata_map"] = custom;
    return d;
  }

  const std::string& path() const { return path_; }

  // `del model` gives the memory back: the model's weights and plans go with it, then GiveMemoryBack. Not for a small
  // model (a graph built per item, say): that trim costs ~0.25 ms, more than such an item's whole run, and its next
  // item reuses what is pooled.
  ~PyModel() {
    const bool large = model_ && model_->WeightBytes() + model_->RuntimeBytes() >= kTrimAfterBytes;
    model_.reset();
    directory_.reset();
    if (large) GiveMemoryBack();
  }

 private:
  std::string path_;
  std::optional<ModelDirectory> directory_;
  std::unique_ptr<Model> model_;
};

// ---- images ----------------------------------------------------------------------------------------------------

DecodeOptions MakeDecodeOptions(int channels, std::optional<std::pair<int64_t, int64_t>> min_size, int64_t max_pixels) {
  if (channels != 1 && channels != 3 && channels != 4)
    throw Error(ErrorCode::kInvalidArgument, "channels must be 1, 3 or 4, got " + std::to_string(channels));
  DecodeOptions o;
  o.channels = channels;
  if (max_pixels > 0) o.max_pixels = max_pixels;
  if (min_size) {
    o.min_width = min_size->first;
    o.min_height = min_size->second;
  }
  return o;
}

nb::object Decode(nb::handle source, int channels, std::optional<std::pair<int64_t, int64_t>> min_size,
                  int64_t max_pixels) {
  DecodeOptions options = MakeDecodeOptions(channels, min_size, max_pixels);
  Tensor t;
  if (nb::isinstance<nb::bytes>(source) || nb::isinstance<nb::bytearray>(source) ||
      nb::isinstance<nb::memoryview>(source)) {
    Py_buffer view;
    if (PyObject_GetBuffer(source.ptr(), &view, PyBUF_SIMPLE) != 0) throw nb::python_error();
    try {
      ReleaseGil release;
      t = DecodeImage(view.buf, static_cast<size_t>(view.len), options);
    } catch (...) {
      PyBuffer_Release(&view);
      throw;
    }
    PyBuffer_Release(&view);
  } else if (IsPathLike(source)) {
    std::string path = PathOf(source);
    ReleaseGil release;
    t = ReadImageFile(path, options);
  } else {
    throw Error(ErrorCode::kInvalidArgument, "decode(): expected bytes or a path, got " +
                                                 std::string(nb::type_name(source.type()).c_str()));
  }
  return ToArray(std::move(t));
}

/// uint8 [H, W, C] (or [H, W]) array -> tensor [H, W, C] over its memory.
Tensor ImageTensor(const InArray& a, const std::string& what) {
  Tensor t = BorrowTensor(a, what);
  if (t.dtype() != DType::kU8)
    throw Error(ErrorCode::kInvalidArgument, what + ": expected a uint8 image array, got " + DTypeName(t.dtype()));
  if (t.rank() == 2) return t.Reshaped({t.dim(0), t.dim(1), 1});
  if (t.rank() != 3)
    throw Error(ErrorCode::kInvalidArgument,
                what + ": expected an image array [height, width, channels] or [height, width], got shape " +
                    ShapeToString(t.shape()));
  return t;
}

// ---- classification ---------------------------------------------------------------------------------------------

class PyClassifier {
 public:
  PyClassifier(nb::handle source, int threads, int64_t batch_size) {
    if (threads < 0) throw Error(ErrorCode::kInvalidArgument, "threads must be >= 0 (0 = all cores)");
    if (batch_size < 1 || batch_size > 4096)  // the CLI's --batch-size range
      throw Error(ErrorCode::kInvalidArgument, "batch_size must be 1..4096, got " + std::to_string(batch_size));
    std::string path = PathOf(source);
    ClassifierOptions options;
    options.num_threads = threads;
    options.batch_size = batch_size;
    ReleaseGil release;
    classifier_ = std::make_unique<Classifier>(OpenModelDirectory(path), options);
  }
  ~PyClassifier() {
    classifier_.reset();
    GiveMemoryBack();
  }
  PyClassifier(const PyClassifier&) = delete;
  PyClassifier& operator=(const PyClassifier&) = delete;

  nb::object Preprocess(nb::handle image) {
    InArray a = AsArray(image, "image");
    Tensor t = ImageTensor(a, "image");
    Tensor out;
    {
      ReleaseGil release;
      out = classifier_->preprocessor().Run(t);
    }
    return ToArray(std::move(out));
  }

  /// Each item: a path, encoded bytes, or a decoded uint8 array. Returns per image a list of (index, label, p).
  std::vector<std::vector<std::tuple<int64_t, std::string, float>>> Classify(nb::handle images, int top_k) {
    const ModelDirectory& md = classifier_->directory();
    if (top_k <= 0) top_k = md.postprocess.top_k;
    std::vector<InArray> keep;
    std::vector<std::string> paths;
    std::vector<std::pair<size_t, Tensor>> decoded;  // (position, image tensor) for bytes and arrays
    std::vector<size_t> path_positions;
    size_t n = 0;
    DecodeOptions decode_options = DecodeOptionsFor(md.preprocess);
    for (nb::handle item : images) {
      if (IsPathLike(item)) {
        paths.push_back(PathOf(item));
        path_positions.push_back(n);
      } else if (nb::isinstance<nb::bytes>(item)) {
        nb::bytes b = nb::borrow<nb::bytes>(item);
        decoded.emplace_back(n, DecodeImage(b.c_str(), b.size(), decode_options));
      } else {
        keep.push_back(AsArray(item, "images[" + std::to_string(n) + "]"));
        decoded.emplace_back(n, ImageTensor(keep.back(), "images[" + std::to_string(n) + "]"));
      }
      ++n;
    }
    std::vector<std::vector<ClassScore>> results(n);
    {
      ReleaseGil release;
      if (!paths.empty()) {
        auto files = classifier_->ClassifyFiles(paths, top_k);
        for (size_t i = 0; i < files.size(); ++i) {
          if (!files[i].ok()) throw Error(ErrorCode::kInvalidArgument, files[i].error);
          results[path_positions[i]] = std::move(files[i].top_k);
        }
      }
      if (!decoded.empty()) {
        std::vector<Tensor> pixels;
        for (auto& [pos, img] : decoded) {
          if (img.dim(2) != md.preprocess.channels())
            throw Error(ErrorCode::kInvalidArgument,
                        "images[" + std::to_string(pos) + "]: the model takes " +
                            std::to_string(md.preprocess.channels()) + "-channel images, the array has " +
                            std::to_string(img.dim(2)));
          pixels.push_back(classifier_->preprocessor().Run(img));
        }
        auto scores = classifier_->ClassifyTensors(pixels, top_k);
        for (size_t i = 0; i < decoded.size(); ++i) results[decoded[i].first] = std::move(scores[i]);
      }
    }
    std::vector<std::vector<std::tuple<int64_t, std::string, float>>> out(n);
    for (size_t i = 0; i < n; ++i)
      for (const ClassScore& c : results[i]) out[i].emplace_back(c.index, c.label, c.probability);
    return out;
  }

  std::vector<std::string> Labels() const { return classifier_->directory().labels; }
  std::string PreprocessJson() const { return classifier_->directory().preprocess.ToJson(); }

 private:
  std::unique_ptr<Classifier> classifier_;
};

// ---- augmentation -----------------------------------------------------------------------------------------------

class PyPipeline {
 public:
  explicit PyPipeline(const std::string& json) : pipeline_(augment::Pipeline::FromJson(json)) {}

  /// image: uint8 [H, W, C]; boxes: float64 [N, 4] in `box_format`. Returns (image, boxes [M, 4] in the same format,
  /// kept: int64 [M] indices of the input boxes that survived, in output order).
  /// masks: a list of uint8 [H, W] or [H, W, C] arrays (returned in the same form, moved with the image).
  /// keypoints: float64 [K, 2] x, y in osprey's continuous pixel coordinates; returned as [K, 3] x, y, visible.
  nb::tuple Apply(nb::handle image, nb::handle boxes, const std::string& box_format, uint64_t seed, nb::handle masks,
                  nb::handle keypoints) {
    if (pipeline_.images_needed() > 1)
      throw Error(ErrorCode::kUnsupported,
                  "this pipeline starts with Mosaic, which needs four images; the Python call takes one (use the "
                  "`osprey augment` command for Mosaic datasets)");
    InArray image_array = AsArray(image, "image");
    augment::Sample sample;
    sample.image = ImageTensor(image_array, "image");
    const int64_t width = sample.image.dim(1), height = sample.image.dim(0);
    augment::BoxFormat format = augment::ParseBoxFormat(box_format);
    nb::object np = nb::module_::import_("numpy");
    nb::object box_array = np.attr("ascontiguousarray")(boxes, "dtype"_a = "float64");
    auto b = nb::cast<nb::ndarray<const double, nb::c_contig, nb::device::cpu>>(box_array);
    if (!(b.ndim() == 2 && b.shape(1) == 4) && !(b.ndim() == 1 && b.shape(0) == 0) &&
        !(b.ndim() == 2 && b.shape(0) == 0))
      throw Error(ErrorCode::kInvalidArgument, "bboxes: expected N boxes of 4 numbers");
    const size_t n = b.ndim() == 2 ? b.shape(0) : 0;
    for (size_t i = 0; i < n; ++i) {
      const double* r = b.data() + 4 * i;
      auto xyxy = augment::BoxToXyxy(format, {r[0], r[1], r[2], r[3]}, width, height);
      if (!(xyxy[0] <= xyxy[2] && xyxy[1] <= xyxy[3]))
        throw Error(ErrorCode::kInvalidArgument, "bboxes[" + std::to_string(i) + "]: the box has negative width or " +
                                                     "height in format " + box_format);
      augment::Object o;
      o.x0 = xyxy[0], o.y0 = xyxy[1], o.x1 = xyxy[2], o.y1 = xyxy[3];
      o.source_id = static_cast<int64_t>(i);
      sample.objects.push_back(std::move(o));
    }
    std::vector<InArray> mask_arrays;
    std::vector<bool> mask_2d;
    if (!masks.is_none()) {
      for (nb::handle m : masks) {
        const std::string what = "masks[" + std::to_string(mask_arrays.size()) + "]";
        mask_arrays.push_back(AsArray(m, what));
        mask_2d.push_back(mask_arrays.back().ndim() == 2);
        sample.masks.push_back(ImageTensor(mask_arrays.back(), what));
      }
    }
    if (!keypoints.is_none()) {
      nb::object kp_array = np.attr("ascontiguousarray")(keypoints, "dtype"_a = "float64");
      auto k = nb::cast<nb::ndarray<const double, nb::c_contig, nb::device::cpu>>(kp_array);
      if (!(k.ndim() == 2 && k.shape(1) == 2) && k.size() != 0)
        throw Error(ErrorCode::kInvalidArgument, "keypoints: expected K points of 2 numbers (x, y)");
      for (size_t i = 0; i < (k.ndim() == 2 ? k.shape(0) : 0); ++i)
        sample.keypoints.insert(sample.keypoints.end(), {k.data()[2 * i], k.data()[2 * i + 1], 2.0});
    }
    augment::Sample out;
    {
      ReleaseGil release;
      out = pipeline_.Apply(sample, seed);
    }
    const size_t kp = out.keypoints.size() / 3;
    auto* kp_data = new double[std::max<size_t>(1, kp * 3)];
    std::copy(out.keypoints.begin(), out.keypoints.end(), kp_data);
    nb::capsule kp_owner(kp_data, [](void* p) noexcept { delete[] static_cast<double*>(p); });
    size_t kp_shape[2] = {kp, 3};
    nb::object out_keypoints = nb::ndarray<nb::numpy, double>(kp_data, 2, kp_shape, kp_owner).cast();
    nb::list out_masks;
    for (size_t i = 0; i < out.masks.size(); ++i) {
      Tensor m = out.masks[i];
      if (mask_2d[i]) m = m.Reshaped({m.dim(0), m.dim(1)});
      out_masks.append(ToArray(std::move(m)));
    }
    const int64_t out_w = out.image.dim(1), out_h = out.image.dim(0);
    const size_t m = out.objects.size();
    auto* box_data = new double[std::max<size_t>(1, m * 4)];
    auto* kept = new int64_t[std::max<size_t>(1, m)];
    for (size_t i = 0; i < m; ++i) {
      const auto& o = out.objects[i];
      auto r = augment::BoxFromXyxy(format, {o.x0, o.y0, o.x1, o.y1}, out_w, out_h);
      for (int k = 0; k < 4; ++k) box_data[4 * i + k] = r[k];
      kept[i] = o.source_id;
    }
    nb::capsule box_owner(box_data, [](void* p) noexcept { delete[] static_cast<double*>(p); });
    nb::capsule kept_owner(kept, [](void* p) noexcept { delete[] static_cast<int64_t*>(p); });
    size_t box_shape[2] = {m, 4};
    size_t kept_shape[1] = {m};
    nb::object out_boxes = nb::ndarray<nb::numpy, double>(box_data, 2, box_shape, box_owner).cast();
    nb::object out_kept = nb::ndarray<nb::numpy, int64_t>(kept, 1, kept_shape, kept_owner).cast();
    Tensor img = out.image;
    if (image_array.ndim() == 2 && img.dim(2) == 1) img = img.Reshaped({img.dim(0), img.dim(1)});
    return nb::make_tuple(ToArray(std::move(img)), out_boxes, out_kept, out_masks, out_keypoints);
  }

  std::string Describe() const { return pipeline_.Describe(); }

 private:
  augment::Pipeline pipeline_;
};

int CliMain(const std::vector<std::string>& args) {
  std::vector<std::string> storage;
  storage.push_back("osprey");
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  ReleaseGil release;
  return cli::RunCommandLine(static_cast<int>(storage.size()), argv.data(), cli::InProcessServe());
}

}  // namespace
}  // namespace osprey::python

NB_MODULE(_osprey, m) {
  using namespace osprey::python;
  m.doc() = "osprey's native core; use the `osprey` package's API.";
  RegisterErrors(m);
  RegisterExitHook();
  m.attr("__version__") = osprey::kOspreyVersion;

  nb::class_<PyModel>(m, "Model")
      .def(nb::init<nb::handle, int, const std::string&, const std::string&>(), "source"_a, "threads"_a = 0,
           "precision"_a = "fp32", "device"_a = "cpu")
      .def("run", &PyModel::Run)
      .def("run_with", &PyModel::RunWith, "options"_a.none(), "args"_a, "kwargs"_a)
      .def("infos", &PyModel::Infos, "outputs"_a)
      .def("inspect", &PyModel::Inspect)
      .def("memory", &PyModel::Memory)
      .def("metadata", &PyModel::Metadata)
      .def_prop_ro("path", &PyModel::path);

  nb::class_<PyRunOptions>(m, "RunOptions")
      .def(nb::init<>())
      .def_prop_rw(
          "terminate", [](const PyRunOptions& o) { return o.terminate.load(); },
          [](PyRunOptions& o, bool v) { o.terminate.store(v); })
      .def_prop_rw(
          "timeout", [](const PyRunOptions& o) { return o.timeout; },
          [](PyRunOptions& o, double v) {
            if (!(v >= 0) || v > 1e9)
              throw osprey::Error(osprey::ErrorCode::kInvalidArgument,
                                  "RunOptions.timeout is in seconds, 0 (none) to 1e9; got " + std::to_string(v));
            o.timeout = v;
          });

  nb::class_<PyClassifier>(m, "Classifier")
      .def(nb::init<nb::handle, int, int64_t>(), "model_dir"_a, "threads"_a = 0, "batch_size"_a = 32)
      .def("preprocess", &PyClassifier::Preprocess, "image"_a)
      .def("classify", &PyClassifier::Classify, "images"_a, "top_k"_a = 0)
      .def("labels", &PyClassifier::Labels)
      .def("preprocess_json", &PyClassifier::PreprocessJson);

  nb::class_<PyPipeline>(m, "Pipeline")
      .def(nb::init<const std::string&>(), "json"_a)
      .def("apply", &PyPipeline::Apply, "image"_a, "boxes"_a, "box_format"_a, "seed"_a, "masks"_a = nb::none(),
           "keypoints"_a = nb::none())
      .def("describe", &PyPipeline::Describe);

  m.def("decode", &Decode, "source"_a, "channels"_a = 3, "min_size"_a = nb::none(), "max_pixels"_a = 0);
  m.def("cli_main", &CliMain, "args"_a);
  m.def("default_threads", &osprey::DefaultNumThreads);
  m.def("cuda_devices", [] {  // GPUs this build can run on: 0 without CUDA, a driver or a device
    osprey::InitDevices();
    osprey::DeviceBackend* cuda = osprey::GetDeviceBackend(osprey::Device::kCuda);
    return cuda ? cuda->DeviceCount() : 0;
  });
  // Host bytes in osprey's buffers now / at most since reset_peak (tests check that inputs are not copied).
  m.def("host_bytes_live", [] { return osprey::Allocator::Host().BytesLive(); });
  m.def("host_bytes_peak", [] { return osprey::Allocator::Host().BytesPeak(); });
  m.def("reset_peak", [] { osprey::Allocator::Host().ResetPeak(); });
}
