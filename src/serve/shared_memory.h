#pragma once
// Triton's system shared memory extension (internal to the server): named regions of POSIX shared memory objects
// (shm_open keys) that a client on the same host registers, then names in infer requests, so tensors are read from
// and written to them instead of travelling through the socket. The server never maps an object: it reads and writes
// with pread/pwrite on its descriptor, so a client that shrinks or removes the object after registering it gets an
// error answer, never a SIGBUS in the server. Off unless `osprey serve --allow-shared-memory` (a client could
// otherwise have the server read any shared memory object the server's user can open).
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace osprey::serve {

/// Where one input or requested output lives: a registered region, an offset into it (from the region's start) and
/// the bytes the client set aside (parameters shared_memory_region / shared_memory_offset / shared_memory_byte_size).
struct SharedMemoryRef {
  std::string region;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

class SharedMemoryRegions {
 public:
  /// `max_regions`: registrations held at once (each holds a descriptor); `max_read_bytes`: the largest input read from
  /// a region (--max-body-size: an input costs the same whether it comes in the body or in shared memory).
  SharedMemoryRegions(size_t max_regions, uint64_t max_read_bytes);
  ~SharedMemoryRegions();

  /// Opens the object `key` and records [offset, offset + byte_size) of it as region `name`. kInvalidArgument when
  /// the name is taken, the key is malformed or cannot be opened, or the range is not inside the object;
  /// kResourceExhausted past max_regions.
  void Register(const std::string& name, const std::string& key, uint64_t offset, uint64_t byte_size);
  /// Forgets region `name` ("" = every region). A request already reading it finishes; unknown names are no error.
  void Unregister(const std::string& name);
  /// [{"name", "key", "offset", "byte_size"}] of region `name` ("" = all, by name); kNotFound for an unknown name.
  nlohmann::json Status(const std::string& name) const;

  /// Refuses a read of `ref` that could not succeed (over max_read_bytes, an unknown region, a range past its end)
  /// before the caller allocates ref.byte_size bytes for it.
  void CheckRead(const SharedMemoryRef& ref, const std::string& what) const;
  /// Reads `ref` (its byte_size bytes) into `out`. `what` names the tensor in errors.
  void Read(const SharedMemoryRef& ref, void* out, const std::string& what) const;
  /// Writes `size` bytes of `data` at `ref`; `size` must fit ref.byte_size.
  void Write(const SharedMemoryRef& ref, const void* data, uint64_t size, const std::string& what) const;
  uint64_t max_read_bytes() const { return max_read_bytes_; }

 private:
  struct Region;
  std::shared_ptr<const Region> Find(const SharedMemoryRef& ref, const std::string& what) const;
  std::shared_ptr<const Region> FindReadable(const SharedMemoryRef& ref, const std::string& what) const;  // + the limit

  const size_t max_regions_;
  const uint64_t max_read_bytes_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const Region>> regions_;
};

}  // namespace osprey::serve
