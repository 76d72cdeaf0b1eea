// Triton's system shared memory extension (serve/shared_memory.h) and the infer decoding and output writing that use
// it (serve/kserve.h). Oracles: the bytes written into POSIX shared memory objects here, and the documented errors.
#include "serve/shared_memory.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <string>

#include "osprey/error.h"
#include "serve/kserve.h"

namespace osprey::serve {
namespace {

using json = nlohmann::json;

// A shared memory object of `size` bytes holding 0, 1, 2, ... (mod 256), removed with the test.
class ShmObject {
 public:
  explicit ShmObject(size_t size)
      : key_("/osprey_shm_test_" + std::to_string(::getpid()) + "_" + std::to_string(next_++)) {
    const int fd = ::shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
    std::string bytes(size, '\0');
    for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i & 0xff);
    EXPECT_EQ(::pwrite(fd, bytes.data(), size, 0), static_cast<ssize_t>(size));
    ::close(fd);
  }
  ~ShmObject() { ::shm_unlink(key_.c_str()); }
  const std::string& key() const { return key_; }
  void Resize(size_t size) const {
    const int fd = ::shm_open(key_.c_str(), O_RDWR, 0);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
    ::close(fd);
  }
  std::string Contents(size_t offset, size_t size) const {
    const int fd = ::shm_open(key_.c_str(), O_RDONLY, 0);
    std::string out(size, '\0');
    EXPECT_EQ(::pread(fd, out.data(), size, static_cast<off_t>(offset)), static_cast<ssize_t>(size));
    ::close(fd);
    return out;
  }

 private:
  std::string key_;
  static inline int next_ = 0;
};

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SharedMemory, RegistersReadsWritesAndReportsStatus) {
  ShmObject object(256);
  SharedMemoryRegions regions(4, 1 << 20);
  regions.Register("in", object.key(), 16, 64);
  EXPECT_EQ(regions.Status(""),
            json::parse(R"([{"name": "in", "key": ")" + object.key() + R"(", "offset": 16, "byte_size": 64}])"));
  EXPECT_EQ(regions.Status("in").size(), 1u);
  // Offsets add: region offset 16 + request offset 8 = bytes 24..27 of the object.
  unsigned char four[4];
  regions.Read({"in", 8, 4}, four, "input 'x'");
  EXPECT_EQ(four[0], 24);
  EXPECT_EQ(four[3], 27);
  const char text[] = "osprey";
  regions.Write({"in", 4, 8}, text, 6, "output 'y'");
  EXPECT_EQ(object.Contents(20, 6), "osprey");
  EXPECT_EQ(object.Contents(26, 1), std::string(1, 26));  // nothing past what was written
  regions.Unregister("in");
  EXPECT_TRUE(regions.Status("").empty());
  EXPECT_NE(ErrorOf([&] { regions.Status("in"); }).find("not registered"), std::string::npos);
  regions.Unregister("never-registered");  // no error, as in Triton
}

TEST(SharedMemory, RefusesWhatCannotBeRead) {
  ShmObject object(128);
  SharedMemoryRegions regions(2, 100);
  const std::string& key = object.key();
  EXPECT_NE(ErrorOf([&] { regions.Register("a", key, 64, 65); }).find("past the end"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { regions.Register("a", key, std::numeric_limits<uint64_t>::max(), 2); }).find("past the end"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { regions.Register("a", key, 0, 0); }).find("positive"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { regions.Register("", key, 0, 8); }).find("1-256 bytes"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { regions.Register(std::string(257, 'n'), key, 0, 8); }).find("got 257"), std::string::npos);
  for (const char* bad : {"", "/", "a/b", "/..", "/x/../../etc/passwd"})
    EXPECT_NE(ErrorOf([&] { regions.Register("a", bad, 0, 1); }).find("not a shared memory object name"),
              std::string::npos)
        << bad;
  EXPECT_NE(ErrorOf([&] { regions.Register("a", "/osprey_no_such_object", 0, 1); }).find("cannot open"),
            std::string::npos);
  regions.Register("a", key, 0, 128);
  EXPECT_NE(ErrorOf([&] { regions.Register("a", key, 0, 8); }).find("registered already"), std::string::npos);
  regions.Register("b", key, 0, 8);
  try {
    regions.Register("c", key, 0, 8);
    ADD_FAILURE() << "a third region past the limit of 2";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
    EXPECT_NE(std::string(e.what()).find("--max-shared-memory-regions"), std::string::npos);
  }
  char buffer[128];
  EXPECT_NE(ErrorOf([&] {
              regions.Read({"b", 4, 8}, buffer, "input 'x'");
            }).find("past the end of region 'b'"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              regions.Read({"b", std::numeric_limits<uint64_t>::max(), 2}, buffer, "input 'x'");
            }).find("past the end"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              regions.Read({"zz", 0, 1}, buffer, "input 'x'");
            }).find("'zz' is not registered"),
            std::string::npos);
  try {  // over max_read_bytes (--max-body-size): 413
    regions.CheckRead({"a", 0, 101}, "input 'x'");
    ADD_FAILURE() << "a read over the limit";
  } catch (const RequestTooLarge& e) {
    EXPECT_NE(std::string(e.what()).find("--max-body-size"), std::string::npos);
  }
  EXPECT_NE(ErrorOf([&] {
              regions.Write({"b", 0, 4}, buffer, 5, "output 'y'");
            }).find("do not fit"),
            std::string::npos);
}

// A client that shrinks its object after registering it gets an error, not a SIGBUS in the server (which reads and
// writes with pread/pwrite, never through a mapping), and the object is not grown by a write.
TEST(SharedMemory, AnObjectShrunkAfterRegistrationIsAnErrorNotACrash) {
  ShmObject object(4096);
  SharedMemoryRegions regions(2, 1 << 20);
  regions.Register("r", object.key(), 0, 4096);
  object.Resize(100);
  char buffer[4096];
  EXPECT_NE(ErrorOf([&] {
              regions.Read({"r", 0, 4096}, buffer, "input 'x'");
            }).find("is now 100 bytes"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              regions.Write({"r", 0, 4096}, buffer, 4096, "output 'y'");
            }).find("is now 100 bytes"),
            std::string::npos);
  object.Resize(0);
  EXPECT_NE(ErrorOf([&] {
              regions.Read({"r", 0, 1}, buffer, "input 'x'");
            }).find("resized or removed"),
            std::string::npos);
}

std::vector<ValueInfo> OneInput(DType dtype) {
  std::vector<ValueInfo> v(1);
  v[0].name = "x", v[0].dtype = dtype, v[0].has_shape = true, v[0].dims = {{-1, "N"}, {2, ""}};
  return v;
}

InferRequest Decode(const json& header, const SharedMemoryRegions* regions, DType dtype = DType::kF32) {
  return DecodeInferRequest(OneInput(dtype), "m", header.dump(), "", RequestLimits{}, nullptr, regions);
}

json ShmInput(const char* datatype, json shape, json parameters) {
  return {{"inputs", {{{"name", "x"}, {"datatype", datatype}, {"shape", shape}, {"parameters", parameters}}}}};
}

TEST(SharedMemory, InferInputsAreReadFromRegions) {
  ShmObject object(64);
  const float values[4] = {1.5f, -2, 3, 4};
  SharedMemoryRegions regions(4, 1 << 20);
  regions.Register("in", object.key(), 0, 64);
  regions.Write({"in", 32, 16}, values, sizeof(values), "setup");
  const json p = {{"shared_memory_region", "in"}, {"shared_memory_byte_size", 16}, {"shared_memory_offset", 32}};
  InferRequest r = Decode(ShmInput("FP32", {2, 2}, p), &regions);
  ASSERT_EQ(r.inputs.at("x").shape(), (Shape{2, 2}));
  EXPECT_EQ(std::memcmp(r.inputs.at("x").raw(), values, sizeof(values)), 0);
  EXPECT_TRUE(r.ignored_parameters.empty());
  // Off: refused naming the flag.
  EXPECT_NE(ErrorOf([&] {
              Decode(ShmInput("FP32", {2, 2}, p), nullptr);
            }).find("--allow-shared-memory"),
            std::string::npos);
  // The byte size must be the shape's.
  json wrong = p;
  wrong["shared_memory_byte_size"] = 12;
  EXPECT_NE(ErrorOf([&] {
              Decode(ShmInput("FP32", {2, 2}, wrong), &regions);
            }).find("does not match shape"),
            std::string::npos);
  // A read over the per-input limit is refused before anything is allocated for it.
  SharedMemoryRegions tight(4, 1000);
  tight.Register("in", object.key(), 0, 64);
  wrong["shared_memory_byte_size"] = 256 * 2 * 4;
  EXPECT_NE(ErrorOf([&] {
              Decode(ShmInput("FP32", {256, 2}, wrong), &tight);
            }).find("--max-body-size"),
            std::string::npos);
  // Data in two places.
  json both = ShmInput("FP32", {2, 2}, p);
  both["inputs"][0]["data"] = {1, 2, 3, 4};
  EXPECT_NE(ErrorOf([&] { Decode(both, &regions); }).find("neither 'data' nor binary_data_size"), std::string::npos);
  // BOOL bytes are checked as from the body.
  EXPECT_NE(
      ErrorOf([&] {
        Decode(ShmInput("BOOL", {2, 2},
                        {{"shared_memory_region", "in"}, {"shared_memory_byte_size", 4}, {"shared_memory_offset", 32}}),
               &regions, DType::kBool);
      }).find("BOOL bytes must be 0 or 1"),
      std::string::npos);
  for (const json& bad :
       {json{{"shared_memory_region", 3}, {"shared_memory_byte_size", 16}}, json{{"shared_memory_region", "in"}},
        json{{"shared_memory_region", "in"}, {"shared_memory_byte_size", -1}}})
    EXPECT_NE(ErrorOf([&] { Decode(ShmInput("FP32", {2, 2}, bad), &regions); }), "") << bad;
}

TEST(SharedMemory, OutputsAreWrittenToRegionsAndAnsweredWithoutData) {
  ShmObject object(64);
  SharedMemoryRegions regions(4, 1 << 20);
  regions.Register("out", object.key(), 8, 56);
  Tensor y(DType::kF32, {2});
  y.data<float>()[0] = 0.25f, y.data<float>()[1] = -7;
  const std::vector<std::pair<std::string, Tensor>> results = {{"y", y}};
  const json header = {
      {"outputs",
       {{{"name", "y"},
         {"parameters",
          {{"shared_memory_region", "out"}, {"shared_memory_byte_size", 16}, {"shared_memory_offset", 4}}}}}}};
  const std::vector<ResponseOutput> outs = SelectOutputs(header, "m", results, {}, &regions);
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(object.Contents(12, 8), std::string(static_cast<const char*>(y.raw()), 8));
  const json answer = json::parse(EncodeInferResponse(header, "m", "1", outs).body);
  EXPECT_FALSE(answer["outputs"][0].contains("data"));
  EXPECT_FALSE(answer["outputs"][0].contains("parameters"));  // as Triton answers (its C++ client needs that)
  EXPECT_EQ(answer["outputs"][0]["shape"], json({2}));
  json small = header;
  small["outputs"][0]["parameters"]["shared_memory_byte_size"] = 4;
  EXPECT_NE(ErrorOf([&] { SelectOutputs(small, "m", results, {}, &regions); }).find("do not fit"), std::string::npos);
  EXPECT_NE(ErrorOf([&] { SelectOutputs(header, "m", results, {}, nullptr); }).find("--allow-shared-memory"),
            std::string::npos);
}

}  // namespace
}  // namespace osprey::serve
