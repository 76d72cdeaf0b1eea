#include "serve/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>  // shm_open only: objects are read with pread, never mapped
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "osprey/error.h"
#include "serve/kserve.h"

namespace osprey::serve {
namespace {

Error BadRequest(const std::string& message) { return Error(ErrorCode::kInvalidArgument, message); }

// A POSIX shared memory object name: an optional leading '/', then 1..255 bytes without '/' or NUL ("." and ".."
// name directories).
bool ValidKey(const std::string& key) {
  const std::string_view name = std::string_view(key).substr(key.rfind('/', 0) == 0 ? 1 : 0);
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find_first_of(std::string_view("/\0", 2)) == std::string_view::npos;
}

// Region names are at most this many bytes (each registration keeps its name, and logs carry it).
constexpr size_t kMaxNameBytes = 256;

// a + b <= limit, without overflow.
bool FitsIn(uint64_t a, uint64_t b, uint64_t limit) { return a <= limit && b <= limit - a; }

}  // namespace

struct SharedMemoryRegions::Region {
  std::string name, key;
  uint64_t offset = 0, byte_size = 0;
  int fd = -1;
  ~Region() {
    if (fd >= 0) ::close(fd);
  }
  // The object's size now (a client may have resized it since it was registered).
  uint64_t ObjectSize() const {
    struct stat st {};
    return ::fstat(fd, &st) == 0 && st.st_size > 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }
  std::string Shrunk(uint64_t needed) const {
    return "shared memory region '" + name + "': its object '" + key + "' is now " + std::to_string(ObjectSize()) +
           " bytes, but the request needs " + std::to_string(needed) +
           " (it was resized or removed after it was registered; register it again)";
  }
};

SharedMemoryRegions::SharedMemoryRegions(size_t max_regions, uint64_t max_read_bytes)
    : max_regions_(max_regions), max_read_bytes_(max_read_bytes) {}

SharedMemoryRegions::~SharedMemoryRegions() = default;

void SharedMemoryRegions::Register(const std::string& name, const std::string& key, uint64_t offset,
                                   uint64_t byte_size) {
  const std::string what = "register shared memory region '" + name + "'";
  if (name.empty() || name.size() > kMaxNameBytes)
    throw BadRequest("register shared memory: a region name is 1-" + std::to_string(kMaxNameBytes) + " bytes, got " +
                     std::to_string(name.size()));
  if (!ValidKey(key))
    throw BadRequest(what + ": key '" + key +
                     "' is not a shared memory object name ('/name' as given to shm_open: 1-255 bytes, no other '/')");
  if (byte_size == 0) throw BadRequest(what + ": byte_size must be positive");
  auto region = std::make_shared<Region>();
  region->name = name;
  region->key = key;
  region->offset = offset;
  region->byte_size = byte_size;
  region->fd = ::shm_open(key.c_str(), O_RDWR, 0);  // glibc adds O_NOFOLLOW | O_CLOEXEC
  if (region->fd < 0)
    throw BadRequest(what + ": cannot open shared memory object '" + key + "': " + std::strerror(errno) +
                     " (create it first, in /dev/shm, readable and writable by the server's user)");
  struct stat st {};
  if (::fstat(region->fd, &st) != 0 || !S_ISREG(st.st_mode))
    throw BadRequest(what + ": '" + key + "' is not a shared memory object");
  if (!FitsIn(offset, byte_size, static_cast<uint64_t>(st.st_size)))
    throw BadRequest(what + ": offset " + std::to_string(offset) + " + byte_size " + std::to_string(byte_size) +
                     " is past the end of '" + key + "' (" + std::to_string(st.st_size) + " bytes)");
  std::lock_guard<std::mutex> lock(mu_);
  if (regions_.count(name)) throw BadRequest(what + ": the name is registered already (unregister it first)");
  if (regions_.size() >= max_regions_)
    throw Error(ErrorCode::kResourceExhausted, what + ": the server holds " + std::to_string(max_regions_) +
                                                   " regions, its limit (--max-shared-memory-regions); unregister "
                                                   "some first");
  regions_[name] = std::move(region);
}

void SharedMemoryRegions::Unregister(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (name.empty())
    regions_.clear();
  else
    regions_.erase(name);
}

nlohmann::json SharedMemoryRegions::Status(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [region_name, r] : regions_)
    if (name.empty() || region_name == name)
      out.push_back({{"name", r->name}, {"key", r->key}, {"offset", r->offset}, {"byte_size", r->byte_size}});
  if (!name.empty() && out.empty())
    throw Error(ErrorCode::kNotFound, "shared memory region '" + name + "' is not registered");
  return out;
}

std::shared_ptr<const SharedMemoryRegions::Region> SharedMemoryRegions::Find(const SharedMemoryRef& ref,
                                                                             const std::string& what) const {
  std::shared_ptr<const Region> region;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = regions_.find(ref.region); it != regions_.end()) region = it->second;
  }
  if (!region) throw BadRequest(what + ": shared memory region '" + ref.region + "' is not registered");
  if (!FitsIn(ref.offset, ref.byte_size, region->byte_size))
    throw BadRequest(what + ": shared_memory_offset " + std::to_string(ref.offset) + " + shared_memory_byte_size " +
                     std::to_string(ref.byte_size) + " is past the end of region '" + ref.region + "' (" +
                     std::to_string(region->byte_size) + " bytes)");
  return region;
}

std::shared_ptr<const SharedMemoryRegions::Region> SharedMemoryRegions::FindReadable(const SharedMemoryRef& ref,
                                                                                     const std::string& what) const {
  if (ref.byte_size > max_read_bytes_)
    throw RequestTooLarge(what + ": " + std::to_string(ref.byte_size) +
                          " bytes from shared memory is over the server's limit of " + std::to_string(max_read_bytes_) +
                          " per input (--max-body-size)");
  return Find(ref, what);
}

void SharedMemoryRegions::CheckRead(const SharedMemoryRef& ref, const std::string& what) const {
  (void)FindReadable(ref, what);
}

void SharedMemoryRegions::Read(const SharedMemoryRef& ref, void* out, const std::string& what) const {
  const std::shared_ptr<const Region> region = FindReadable(ref, what);
  auto* dst = static_cast<char*>(out);
  const uint64_t start = region->offset + ref.offset;  // both checked against the object when it was registered
  for (uint64_t done = 0; done < ref.byte_size;) {
    const ssize_t n = ::pread(region->fd, dst + done, ref.byte_size - done, static_cast<off_t>(start + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw Error(ErrorCode::kInternal, what + ": reading region '" + ref.region + "': " + std::strerror(errno));
    if (n == 0) throw BadRequest(what + ": " + region->Shrunk(start + ref.byte_size));
    done += static_cast<uint64_t>(n);
  }
}

void SharedMemoryRegions::Write(const SharedMemoryRef& ref, const void* data, uint64_t size,
                                const std::string& what) const {
  const std::shared_ptr<const Region> region = Find(ref, what);
  if (size > ref.byte_size)
    throw BadRequest(what + ": " + std::to_string(size) + " bytes do not fit the " + std::to_string(ref.byte_size) +
                     " set aside in shared memory region '" + ref.region + "' (shared_memory_byte_size)");
  const uint64_t start = region->offset + ref.offset;
  // Refused rather than written past the end, which would grow the client's object.
  if (region->ObjectSize() < start + size) throw BadRequest(what + ": " + region->Shrunk(start + size));
  const auto* src = static_cast<const char*>(data);
  for (uint64_t done = 0; done < size;) {
    const ssize_t n = ::pwrite(region->fd, src + done, size - done, static_cast<off_t>(start + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw Error(ErrorCode::kInternal, what + ": writing region '" + ref.region + "': " + std::strerror(errno));
    done += static_cast<uint64_t>(n);
  }
}

}  // namespace osprey::serve
