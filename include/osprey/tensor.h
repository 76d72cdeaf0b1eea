#pragma once
/// Tensors, dtypes, shapes, buffers and the accounting allocator.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "osprey/error.h"

namespace osprey {

enum class DType : uint8_t { kF32, kF16, kBF16, kI8, kU8, kI32, kI64, kBool };
constexpr int kNumDTypes = 8;

/// Bytes per element.
size_t DTypeSize(DType dtype);
/// numpy-style name: "float32", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool".
const char* DTypeName(DType dtype);

/// 16-bit float storage types. Arithmetic goes through float.
struct Float16 {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};
float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);
inline float BFloat16ToFloat(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t FloatToBFloat16(float value);  // round to nearest even

template <class T>
constexpr DType DTypeOf();
template <> constexpr DType DTypeOf<float>() { return DType::kF32; }
template <> constexpr DType DTypeOf<Float16>() { return DType::kF16; }
template <> constexpr DType DTypeOf<BFloat16>() { return DType::kBF16; }
template <> constexpr DType DTypeOf<int8_t>() { return DType::kI8; }
template <> constexpr DType DTypeOf<uint8_t>() { return DType::kU8; }
template <> constexpr DType DTypeOf<int32_t>() { return DType::kI32; }
template <> constexpr DType DTypeOf<int64_t>() { return DType::kI64; }
template <> constexpr DType DTypeOf<bool>() { return DType::kBool; }

/// Dimensions, outermost first. Concrete tensors have every dim >= 0.
using Shape = std::vector<int64_t>;
/// The one size rule: no tensor, arena, file section or request may describe more than kMaxBytes bytes (256 TiB, far
/// above any machine, far below where int64/uint64 byte arithmetic wraps). Every element and byte count in osprey goes
/// through the checked helpers below, so a hostile shape is refused with kInvalidArgument before anything allocates.
constexpr int64_t kMaxBytes = int64_t{1} << 48;
/// a * b for sizes (element counts, bytes, strides); throws kInvalidArgument naming `what` when either is negative or
/// the product passes kMaxBytes.
int64_t CheckedMul(int64_t a, int64_t b, std::string_view what = "size");
/// a + b for sizes, with the same rule.
int64_t CheckedAdd(int64_t a, int64_t b, std::string_view what = "size");
/// Product of dims; throws kInvalidArgument on negative dims or a count past kMaxBytes.
int64_t NumElements(const Shape& shape);
/// Bytes of a dense tensor of `shape` and `dtype`; throws kInvalidArgument when past kMaxBytes.
int64_t NumBytes(DType dtype, const Shape& shape);
/// "[1, 3, 224, 224]".
std::string ShapeToString(const Shape& shape);

/// Where a buffer's bytes are: host memory, or an accelerator's (include/osprey/device.h). Only host tensors may be
/// read through data<T>(); device tensors are handed to device kernels and copied with the backend.
enum class Device : uint8_t { kHost = 0, kCuda = 1 };
constexpr int kNumDevices = 2;

/// Live-byte counter for one owner (a model, a plan, a weight store): host bytes, and apart from them device bytes
/// (so a host memory budget never counts GPU memory, nor a GPU budget host memory). Thread-safe.
class MemoryAccount {
 public:
  explicit MemoryAccount(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }
  /// Host bytes.
  int64_t BytesLive() const { return live_.load(std::memory_order_relaxed); }
  int64_t BytesPeak() const { return peak_.load(std::memory_order_relaxed); }
  /// Device bytes (every device together).
  int64_t DeviceBytesLive() const { return device_live_.load(std::memory_order_relaxed); }
  void Add(int64_t bytes, Device where = Device::kHost);

 private:
  std::string name_;
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> device_live_{0};
};

/// A block of device memory. Freed (and un-accounted) when the last shared_ptr drops.
class Buffer {
 public:
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();
  void* data() const { return data_; }
  size_t size() const { return size_; }
  Device device() const { return device_; }
  /// Which device of its kind (CUDA ordinal); 0 on the host.
  int ordinal() const { return ordinal_; }
  /// True when the block came from mmap (freeing it returns pages to the OS at once).
  bool mmapped() const { return mmapped_; }
  /// A block owned by someone else (e.g. a NumPy array handed to a Python call): nothing is allocated, accounted or
  /// freed; `keep_alive` (may be null) is held until the buffer drops. The caller guarantees `data` outlives it.
  static std::shared_ptr<Buffer> Borrow(void* data, size_t size, std::shared_ptr<void> keep_alive = nullptr);
  /// True for Borrow()ed blocks.
  bool borrowed() const { return borrowed_; }
  /// Moves the block's bytes from its account to `account` (null: none): for a block that changes owner, e.g. an
  /// execution arena going from a run of one model to the shared idle pool and on to another model's run. The owner
  /// calls it; not safe against a concurrent call on the same block.
  void ChargeTo(std::shared_ptr<MemoryAccount> account);

 private:
  friend class Allocator;
  Buffer() = default;
  void* data_ = nullptr;
  size_t size_ = 0;
  Device device_ = Device::kHost;
  int ordinal_ = 0;
  bool mmapped_ = false;
  bool borrowed_ = false;
  std::shared_ptr<MemoryAccount> account_;
  std::shared_ptr<void> keep_alive_;
};

/// Allocates accounted buffers. Host blocks of at least mmap_threshold() bytes (default kMmapThreshold) are mmap-backed
/// so that freeing them returns memory to the OS at once (what a server that unloads models wants); smaller ones come
/// from aligned malloc. All blocks are 64-byte aligned. Thread-safe.
class Allocator {
 public:
  static constexpr size_t kMmapThreshold = 256 * 1024;
  /// Per-process policy. A batch job that allocates and frees image-sized blocks for every item (osprey augment)
  /// raises it so those blocks come from malloc's heap and are reused, instead of being mapped, page-faulted in and
  /// unmapped each time (measured ~10% of an augmentation run). Call before the work starts.
  static void SetMmapThreshold(size_t bytes);
  static size_t mmap_threshold();
  /// Host bytes osprey's buffers may hold at once, across every owner. An allocation that would pass it is refused with
  /// kResourceExhausted instead of letting the kernel's OOM killer end the process later. Default: 90% of physical
  /// memory (or of the cgroup's memory.max when lower). 0 = no limit.
  static void SetHostLimit(int64_t bytes);
  static int64_t host_limit();
  static constexpr size_t kAlignment = 64;
  /// The host allocator. It holds only counters; ownership stays with the buffers.
  static Allocator& Host();
  /// Uninitialised block. `account` (may be null) is charged until the buffer is freed.
  std::shared_ptr<Buffer> Allocate(size_t bytes, std::shared_ptr<MemoryAccount> account = nullptr);
  /// Uninitialised block on device `ordinal` of `kind` through its backend (GetDeviceBackend); kHost is Allocate.
  /// Device blocks are counted per kind like host ones (BytesLive(kCuda)) and charged to `account`.
  std::shared_ptr<Buffer> AllocateOn(Device kind, int ordinal, size_t bytes,
                                     std::shared_ptr<MemoryAccount> account = nullptr);
  /// Bytes live on `device` across every owner.
  int64_t BytesLive(Device device = Device::kHost) const { return live_[static_cast<int>(device)].load(); }
  /// Most bytes live on `device` at once since the last ResetPeak (for tests and tools: how much a call allocated).
  int64_t BytesPeak(Device device = Device::kHost) const { return peak_[static_cast<int>(device)].load(); }
  void ResetPeak(Device device = Device::kHost) { peak_[static_cast<int>(device)].store(BytesLive(device)); }
  /// Bytes the process's malloc holds in use outside osprey's buffers (objects, libraries' state: what no account
  /// sees), process-wide; -1 where the C library cannot say (glibc >= 2.33: mallinfo2; not under AddressSanitizer).
  /// Costs a walk of malloc's arenas: for measuring around a compile, not per run.
  int64_t UntrackedHeapBytes() const;

 private:
  friend class Buffer;
  void Release(Buffer* buffer);
  std::atomic<int64_t> live_[kNumDevices] = {};
  std::atomic<int64_t> peak_[kNumDevices] = {};
  std::atomic<int64_t> heap_live_{0};  // host blocks from malloc (below the mmap threshold)
};

/// A dense, row-major (C order) tensor: dtype + shape + a view into a refcounted Buffer.
/// Copying a Tensor copies the handle, not the data. Not synchronised: share read-only or copy.
class Tensor {
 public:
  Tensor() = default;
  /// New uninitialised tensor on the host.
  Tensor(DType dtype, Shape shape, std::shared_ptr<MemoryAccount> account = nullptr);
  /// New zero-filled tensor.
  static Tensor Zeros(DType dtype, Shape shape, std::shared_ptr<MemoryAccount> account = nullptr);
  /// A view of `buffer` at byte `offset` (which must have room for the tensor).
  static Tensor View(DType dtype, Shape shape, std::shared_ptr<Buffer> buffer, size_t offset);
  template <class T>
  static Tensor FromVector(Shape shape, const std::vector<T>& values) {
    Tensor t(DTypeOf<T>(), std::move(shape));
    if (static_cast<size_t>(t.numel()) != values.size())
      throw Error(ErrorCode::kInvalidArgument, "Tensor::FromVector: " + std::to_string(values.size()) +
                                                   " values for shape " + ShapeToString(t.shape()));
    if constexpr (std::is_same_v<T, bool>) {  // std::vector<bool> is packed: copy element by element
      for (size_t i = 0; i < values.size(); ++i) t.template data<bool>()[i] = values[i];
    } else if (!values.empty()) {
      std::memcpy(t.raw(), values.data(), values.size() * sizeof(T));
    }
    return t;
  }
  /// Scalar (rank-0) tensor.
  template <class T>
  static Tensor Scalar(T value) {
    return FromVector<T>({}, {value});
  }

  bool defined() const { return buffer_ != nullptr || numel_ == 0; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t i) const { return shape_[i < 0 ? i + rank() : i]; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * DTypeSize(dtype_); }
  void* raw() { return buffer_ ? static_cast<char*>(buffer_->data()) + offset_ : nullptr; }
  const void* raw() const { return buffer_ ? static_cast<const char*>(buffer_->data()) + offset_ : nullptr; }
  template <class T>
  T* data() {
    return static_cast<T*>(raw());
  }
  template <class T>
  const T* data() const {
    return static_cast<const T*>(raw());
  }
  const std::shared_ptr<Buffer>& buffer() const { return buffer_; }
  size_t offset() const { return offset_; }

  /// Same data, new shape with the same element count (no copy).
  Tensor Reshaped(Shape shape) const;
  /// Deep copy into a new buffer.
  Tensor Clone(std::shared_ptr<MemoryAccount> account = nullptr) const;
  /// Element i converted to double / int64 (any dtype); for shape arithmetic and tests.
  double GetAsDouble(int64_t i) const;
  int64_t GetAsInt(int64_t i) const;
  /// All elements as int64 (integer or bool dtypes, or float truncated).
  std::vector<int64_t> ToInt64Vector() const;
  /// All elements as float.
  std::vector<float> ToFloatVector() const;

 private:
  DType dtype_ = DType::kF32;
  Shape shape_;
  int64_t numel_ = 0;
  std::shared_ptr<Buffer> buffer_;
  size_t offset_ = 0;
};

/// Converts `src` to `dtype` elementwise (float<->int truncation toward zero as C casts; bool is x != 0).
Tensor CastTensor(const Tensor& src, DType dtype);

}  // namespace osprey
