// Model manager: repository index, lazy and shared loads, LRU eviction under a budget, idle unload, load failures,
// weight sharing. Models are tiny ONNX files written with the ONNX protobuf classes; the oracle is the values in them.
#ifndef ONNX_ML
#define ONNX_ML 1
#endif
#ifndef ONNX_NAMESPACE
#define ONNX_NAMESPACE onnx
#endif
#include "serve/model_manager.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "osprey/error.h"

namespace osprey::serve {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kRows = 256, kCols = 1024;            // one weight: 1 MiB of float32
constexpr int64_t kWeightBytes = kRows * kCols * 4;

float WeightValue(int seed, int64_t i) { return static_cast<float>(seed) + static_cast<float>(i % 1000) * 0.001f; }

void AddInit(onnx::GraphProto* g, const std::string& name, int seed, int64_t rows) {
  std::vector<float> values(static_cast<size_t>(rows * kCols));
  for (size_t i = 0; i < values.size(); ++i) values[i] = WeightValue(seed, static_cast<int64_t>(i));
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto_DataType_FLOAT);
  t->add_dims(rows);
  t->add_dims(kCols);
  t->set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
}

void AddInfo(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list, const std::string& name) {
  auto* vi = list->Add();
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto_DataType_FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_value(kRows);
  tt->mutable_shape()->add_dim()->set_dim_value(kCols);
}

void AddNode(onnx::GraphProto* g, const std::string& a, const std::string& b, const std::string& out) {
  auto* n = g->add_node();
  n->set_op_type("Add");
  n->set_name(out + "_add");
  n->add_input(a);
  n->add_input(b);
  n->add_output(out);
}

// y = x + W(seed), W [256, 1024]; with `head_seed` >= 0: y = (x + W(seed)) + H(head_seed), H [1, 1024].
void WriteModel(const fs::path& repo, const std::string& name, const std::string& version, int seed,
                int head_seed = -1) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name(name);
  AddInfo(g->mutable_input(), "x");
  AddInfo(g->mutable_output(), "y");
  AddInit(g, "w", seed, kRows);
  if (head_seed < 0) {
    AddNode(g, "x", "w", "y");
  } else {
    auto* t = g->add_initializer();  // head [1, 1024], broadcast over the rows
    t->set_name("h");
    t->set_data_type(onnx::TensorProto_DataType_FLOAT);
    t->add_dims(1);
    t->add_dims(kCols);
    std::vector<float> values(kCols);
    for (int64_t i = 0; i < kCols; ++i) values[i] = WeightValue(head_seed, i);
    t->set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
    AddNode(g, "x", "w", "t");
    AddNode(g, "t", "h", "y");
  }
  fs::create_directories(repo / name / version);
  std::ofstream out(repo / name / version / "model.onnx", std::ios::binary);
  out << m.SerializeAsString();
}

class ModelManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_ = fs::temp_directory_path() /
            ("osprey_manager_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(repo_);
    WriteModel(repo_, "a", "1", 1);
    WriteModel(repo_, "b", "1", 2);
    WriteModel(repo_, "c", "1", 3);
    WriteModel(repo_, "c", "2", 4);  // latest version of c
    fs::create_directories(repo_ / "broken" / "1");
    std::ofstream(repo_ / "broken" / "1" / "model.onnx", std::ios::binary) << "this is not a protobuf \xff\xff\xff\xff";
    fs::create_directories(repo_ / "not_a_model" / "extra");  // no numeric version: not listed
  }
  void TearDown() override { fs::remove_all(repo_); }

  ManagerOptions Options(int64_t budget = 0, double idle = 0) {
    ManagerOptions o;
    o.repository = repo_.string();
    o.memory_budget_bytes = budget;
    o.idle_unload_seconds = idle;
    o.threads = 1;
    return o;
  }

  static const ModelIndexEntry* Find(const std::vector<ModelIndexEntry>& index, const std::string& name) {
    for (const auto& e : index)
      if (e.name == name) return &e;
    return nullptr;
  }
  static ModelStatus StatusOf(ModelManager& m, const std::string& name) {
    auto index = m.Index();
    const ModelIndexEntry* e = Find(index, name);
    return e ? e->status : ModelStatus::kFailed;
  }

  fs::path repo_;
};

ErrorCode CodeOf(const std::function<void()>& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  ADD_FAILURE() << "expected an Error";
  return ErrorCode::kInternal;
}

TEST_F(ModelManagerTest, IndexListsModelsAndPicksUpNewOnes) {
  ModelManager m(Options());
  auto index = m.Index();
  ASSERT_EQ(index.size(), 5u);
  EXPECT_EQ(index[0].name, "a");
  EXPECT_EQ(index[1].name, "b");
  EXPECT_EQ(index[2].name, "broken");
  EXPECT_EQ(index[3].name, "c");
  EXPECT_EQ(index[3].version, "2");
  // A directory without <version>/model.onnx is reported with the reason, not skipped silently.
  EXPECT_EQ(index[4].name, "not_a_model");
  EXPECT_EQ(index[4].status, ModelStatus::kFailed);
  EXPECT_NE(index[4].reason.find("invalid: no version directory holding model.onnx"), std::string::npos)
      << index[4].reason;
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(index[i].status, ModelStatus::kUnavailable) << index[i].name;
    EXPECT_EQ(index[i].reason, "not loaded yet") << index[i].name;
  }
  EXPECT_EQ(m.Stats().loads, 0u);

  WriteModel(repo_, "d", "7", 5);
  index = m.Index();
  ASSERT_NE(Find(index, "d"), nullptr);
  EXPECT_EQ(Find(index, "d")->version, "7");
  EXPECT_NO_THROW(m.Acquire("d"));
}

TEST_F(ModelManagerTest, AcquireLoadsLazilyAndRuns) {
  ModelManager m(Options());
  EXPECT_EQ(m.Stats().accounted_bytes, 0);
  auto model = m.Acquire("c");
  EXPECT_EQ(model->name, "c");
  EXPECT_EQ(model->version, "2");
  EXPECT_EQ(StatusOf(m, "c"), ModelStatus::kReady);
  EXPECT_EQ(StatusOf(m, "a"), ModelStatus::kUnavailable);
  EXPECT_EQ(m.Stats().loads, 1u);
  EXPECT_GE(m.Stats().accounted_bytes, kWeightBytes);

  // y = 0 + W(seed 4) for version 2.
  Tensor x = Tensor::Zeros(DType::kF32, Shape({kRows, kCols}));
  auto outputs = model->model->Run({{"x", x}});
  ASSERT_EQ(outputs.size(), 1u);
  const float* y = outputs[0].second.data<float>();
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{999}, kRows * kCols - 1}) EXPECT_FLOAT_EQ(y[i], WeightValue(4, i));

  // Accounted bytes: the shared store's weights plus the model's runtime bytes, as the index reports them, and the
  // process's idle execution arenas (this run's among them).
  auto index = m.Index();
  const ModelIndexEntry* row = Find(index, "c");
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->weight_bytes, kWeightBytes);
  EXPECT_EQ(row->shared_bytes, 0);
  EXPECT_GT(SharedArenaBytes(), 0);
  EXPECT_EQ(m.Stats().accounted_bytes, row->weight_bytes + row->runtime_bytes + SharedArenaBytes());

  // An explicit older version is a separate load.
  auto v1 = m.Acquire("c", "1");
  EXPECT_EQ(v1->version, "1");
  EXPECT_NE(v1.get(), model.get());
  EXPECT_EQ(m.Stats().loads, 2u);
  EXPECT_EQ(m.Acquire("c").get(), model.get());  // already loaded: no new load
  EXPECT_EQ(m.Stats().loads, 2u);

  EXPECT_EQ(CodeOf([&] { m.Acquire("nope"); }), ErrorCode::kNotFound);
  EXPECT_EQ(CodeOf([&] { m.Acquire("c", "3"); }), ErrorCode::kNotFound);
  EXPECT_EQ(CodeOf([&] { m.Acquire("../a"); }), ErrorCode::kNotFound);
  EXPECT_EQ(CodeOf([&] { m.Unload("a"); }), ErrorCode::kNotFound);
}

TEST_F(ModelManagerTest, ConcurrentFirstRequestsLoadOnce) {
  ModelManager m(Options());
  std::atomic<int> ready{0};
  std::vector<std::shared_ptr<LoadedModel>> got(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < 8) std::this_thread::yield();
      got[t] = m.Acquire("a");
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(m.Stats().loads, 1u);
  for (const auto& g : got) EXPECT_EQ(g.get(), got[0].get());
}

TEST_F(ModelManagerTest, LruEvictionUnderBudget) {
  // A load needs twice its weights (they and their packs to come): room for a loaded model and a loading one (1 + 2
  // MiB), not for two loaded and one loading (2 + 2).
  ModelManager m(Options(kWeightBytes * 7 / 2));
  m.Acquire("a");
  m.Acquire("b");
  m.Acquire("c");
  EXPECT_EQ(StatusOf(m, "a"), ModelStatus::kUnavailable);
  EXPECT_EQ(StatusOf(m, "b"), ModelStatus::kReady);
  EXPECT_EQ(StatusOf(m, "c"), ModelStatus::kReady);
  EXPECT_EQ(m.Stats().evictions, 1u);
  EXPECT_LE(m.Stats().accounted_bytes, kWeightBytes * 7 / 2);
  EXPECT_EQ(Find(m.Index(), "a")->reason.rfind("evicted: memory budget", 0), 0u) << Find(m.Index(), "a")->reason;

  m.Acquire("a");  // reloaded; b is now the least recently used
  EXPECT_EQ(StatusOf(m, "a"), ModelStatus::kReady);
  EXPECT_EQ(StatusOf(m, "b"), ModelStatus::kUnavailable);
  EXPECT_EQ(StatusOf(m, "c"), ModelStatus::kReady);
  EXPECT_EQ(m.Stats().evictions, 2u);
  EXPECT_EQ(m.Stats().loads, 4u);
}

Tensor RunOnes(LoadedModel& model) {
  Tensor x = Tensor::Zeros(DType::kF32, Shape({kRows, kCols}));
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 1.f;
  return model.model->Run({{"x", x}})[0].second;
}

void WaitFor(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

TEST_F(ModelManagerTest, ARunThatExceedsTheBudgetIsBroughtBackAtOnce) {
  // y = (x + W) + H: the run's intermediate (1 MiB) lies in an execution arena, idle in the process's pool after
  // the run, which no load-time estimate counted. With a budget only the weights fit, AfterRun (the server calls it
  // after each request) wakes the housekeeping pass, which frees idle arenas first. The periodic pass is an hour away
  // here, so only the wake can do it.
  WriteModel(repo_, "h", "1", 5, /*head_seed=*/6);
  ManagerOptions o = Options(kWeightBytes * 5 / 2);
  o.housekeeping_seconds = 3600;
  o.arena_idle_seconds = 3600;  // not freed for being idle: only for the budget
  ModelManager m(o);
  RunOnes(*m.Acquire("h"));
  ASSERT_GT(m.Stats().accounted_bytes, o.memory_budget_bytes) << "the run must push it over for this test";
  m.AfterRun();
  WaitFor([&] { return m.Stats().accounted_bytes <= o.memory_budget_bytes; });
  EXPECT_LE(m.Stats().accounted_bytes, o.memory_budget_bytes);
  EXPECT_EQ(SharedArenaBytes(), 0);
  EXPECT_EQ(StatusOf(m, "h"), ModelStatus::kReady);  // the most recent model stays
}

// The budget's second rule: what the kernel sees. Above ResidentCeiling (budget + 10% + 20 MiB) the housekeeping pass
// evicts least recently used idle models, giving the memory back before each new reading, until RSS is under it; the
// most recent model stays. RSS here is the test's: what it was before plus osprey's live buffers, set to one and a
// half models' buffers above the ceiling with three models loaded, so two must go.
TEST_F(ModelManagerTest, ResidentMemoryAboveTheCeilingEvictsLeastRecentlyUsed) {
  ManagerOptions o = Options(10 << 20);  // the accounting alone keeps all three (about 3 MiB)
  o.housekeeping_seconds = 3600;         // only AfterRun's wake runs the pass
  std::atomic<int64_t> extra{0};
  o.resident_bytes = [&extra] { return extra.load() + Allocator::Host().BytesLive(); };
  const int64_t ceiling = ResidentCeiling(o.memory_budget_bytes);
  EXPECT_EQ(ceiling, (10 << 20) + (1 << 20) + (20 << 20));
  EXPECT_EQ(ResidentCeiling(0), 0);
  EXPECT_EQ(ResidentCeiling(int64_t{9000000000000000000}), std::numeric_limits<int64_t>::max()) << "no overflow";
  ModelManager m(o);
  TrimSharedArenas(0);
  const int64_t before = Allocator::Host().BytesLive();
  RunOnes(*m.Acquire("a"));
  TrimSharedArenas(0);
  const int64_t one = Allocator::Host().BytesLive() - before;  // a model's weights and what its run keeps
  ASSERT_GE(one, kWeightBytes);
  for (const char* name : {"b", "c"}) RunOnes(*m.Acquire(name));
  TrimSharedArenas(0);
  extra = ceiling + one * 3 / 2 - Allocator::Host().BytesLive();
  m.AfterRun();
  WaitFor([&] { return StatusOf(m, "b") == ModelStatus::kUnavailable; });
  EXPECT_EQ(StatusOf(m, "a"), ModelStatus::kUnavailable);
  EXPECT_EQ(StatusOf(m, "b"), ModelStatus::kUnavailable);
  EXPECT_EQ(StatusOf(m, "c"), ModelStatus::kReady);  // under the ceiling once two went; the most recent stays
  EXPECT_LE(o.resident_bytes(), ceiling);
  EXPECT_EQ(m.Stats().evictions, 2u);
  EXPECT_NE(Find(m.Index(), "a")->reason.find("resident memory"), std::string::npos) << Find(m.Index(), "a")->reason;
}

// --memory-budget-rss off (bound_resident false): the budget bounds the accounted bytes only, whatever the RSS.
TEST_F(ModelManagerTest, ResidentMemoryIsLeftAloneWhenTheRuleIsOff) {
  ManagerOptions o = Options(10 << 20);
  o.housekeeping_seconds = 3600;
  o.bound_resident = false;
  // Half a MiB above the rule's ceiling, which evicting an idle model (about 1 MiB each) could bring it under.
  o.resident_bytes = [] { return ResidentCeiling(int64_t{10} << 20) + (512 << 10); };
  EXPECT_EQ(ResidentCeiling(o), 0);
  ModelManager m(o);
  for (const char* name : {"a", "b", "c"}) RunOnes(*m.Acquire(name));
  m.AfterRun();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the pass the wake starts has run
  for (const char* name : {"a", "b", "c"}) EXPECT_EQ(StatusOf(m, name), ModelStatus::kReady) << name;
  EXPECT_EQ(m.Stats().evictions, 0u);
  o.bound_resident = true;
  EXPECT_EQ(ResidentCeiling(o), ResidentCeiling(o.memory_budget_bytes));
}

// Idle execution arenas (what a burst of requests left) go before any model does.
TEST_F(ModelManagerTest, ResidentMemoryAboveTheCeilingFreesIdleArenasFirst) {
  ManagerOptions o = Options(10 << 20);
  o.housekeeping_seconds = 3600;
  o.arena_idle_seconds = 3600;  // kept, but for the ceiling
  std::atomic<int64_t> extra{0};
  o.resident_bytes = [&extra] { return extra.load() + Allocator::Host().BytesLive(); };
  ModelManager m(o);
  TrimSharedArenas(0);
  for (const char* name : {"a", "b", "c"}) RunOnes(*m.Acquire(name));
  const int64_t arenas = SharedArenaBytes();
  ASSERT_GT(arenas, 0) << "the runs' arena waits in the shared pool";
  extra = ResidentCeiling(o.memory_budget_bytes) + arenas / 2 - Allocator::Host().BytesLive();
  m.AfterRun();
  WaitFor([&] { return SharedArenaBytes() == 0; });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(SharedArenaBytes(), 0);
  for (const char* name : {"a", "b", "c"}) EXPECT_EQ(StatusOf(m, name), ModelStatus::kReady) << name;
  EXPECT_EQ(m.Stats().evictions, 0u);
}

// Where evicting every idle model would still leave RSS above the ceiling (the process itself holds it, as with a
// budget smaller than the server), nothing is evicted for it: the accounting alone applies.
TEST_F(ModelManagerTest, ResidentMemoryThatEvictingCannotBringUnderEvictsNothing) {
  ManagerOptions o = Options(10 << 20);
  o.housekeeping_seconds = 3600;
  const int64_t ceiling = ResidentCeiling(o.memory_budget_bytes);
  o.resident_bytes = [ceiling] { return ceiling + (100 << 20); };
  ModelManager m(o);
  for (const char* name : {"a", "b", "c"}) RunOnes(*m.Acquire(name));
  m.AfterRun();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  m.AfterRun();  // a second pass: still nothing
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (const char* name : {"a", "b", "c"}) EXPECT_EQ(StatusOf(m, name), ModelStatus::kReady) << name;
  EXPECT_EQ(m.Stats().evictions, 0u);
}

// A request that ends within 20 ms of the last wake does not wake the pass itself (under a stream of requests it must
// not run once per request), but it is not lost: the pass runs 20 ms later.
TEST_F(ModelManagerTest, AWakeTooSoonAfterTheLastIsKeptForLater) {
  WriteModel(repo_, "h", "1", 5, /*head_seed=*/6);
  ManagerOptions o = Options(kWeightBytes * 5 / 2);
  o.housekeeping_seconds = 3600;
  o.arena_idle_seconds = 3600;
  ModelManager m(o);
  auto h = m.Acquire("h");
  m.AfterRun();  // a wake with nothing over the budget
  RunOnes(*h);   // a 1 MiB sum: well within 20 ms
  h.reset();
  ASSERT_GT(m.Stats().accounted_bytes, o.memory_budget_bytes);
  m.AfterRun();  // too soon after the first: kept for later
  WaitFor([&] { return m.Stats().accounted_bytes <= o.memory_budget_bytes; });
  EXPECT_LE(m.Stats().accounted_bytes, o.memory_budget_bytes);
}

TEST_F(ModelManagerTest, ModelInUseIsNeverEvicted) {
  ModelManager m(Options(kWeightBytes * 7 / 2));
  auto a = m.Acquire("a");
  auto b = m.Acquire("b");
  std::string message;
  EXPECT_EQ(CodeOf([&] { m.Acquire("c"); }, &message), ErrorCode::kResourceExhausted);
  EXPECT_NE(message.find("budget"), std::string::npos) << message;
  EXPECT_EQ(StatusOf(m, "a"), ModelStatus::kReady);
  EXPECT_EQ(StatusOf(m, "b"), ModelStatus::kReady);
  EXPECT_EQ(StatusOf(m, "c"), ModelStatus::kUnavailable);
  EXPECT_EQ(m.Stats().evictions, 0u);

  b.reset();  // b can go now; a, still held, stays even though it is the least recently used
  EXPECT_NO_THROW(m.Acquire("c"));
  EXPECT_EQ(StatusOf(m, "a"), ModelStatus::kReady);
  EXPECT_EQ(StatusOf(m, "b"), ModelStatus::kUnavailable);
  EXPECT_EQ(m.Stats().evictions, 1u);
}

TEST_F(ModelManagerTest, IdleModelsAreUnloaded) {
  ModelManager m(Options(0, 0.2));
  auto held = m.Acquire("a");
  m.Acquire("b");  // dropped at once: idle from now
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (StatusOf(m, "b") != ModelStatus::kUnavailable && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(StatusOf(m, "b"), ModelStatus::kUnavailable);
  EXPECT_EQ(Find(m.Index(), "b")->reason.rfind("idle: unused for 0.2 s", 0), 0u) << Find(m.Index(), "b")->reason;
  // a was acquired before b but is held: in use, so not idle.
  EXPECT_EQ(StatusOf(m, "a"), ModelStatus::kReady);
  EXPECT_GE(m.Stats().unloads, 1u);

  held.reset();
  while (StatusOf(m, "a") != ModelStatus::kUnavailable && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(StatusOf(m, "a"), ModelStatus::kUnavailable);
  EXPECT_EQ(m.Stats().accounted_bytes, 0);
}

TEST_F(ModelManagerTest, BrokenModelFailsAloneWithItsReason) {
  ModelManager m(Options());
  std::string message;
  EXPECT_EQ(CodeOf([&] { m.Acquire("broken"); }, &message), ErrorCode::kUnavailable);
  EXPECT_NE(message.find("model 'broken' failed to load: "), std::string::npos) << message;
  EXPECT_NE(message.find("not a valid ONNX model"), std::string::npos) << message;
  auto index = m.Index();
  ASSERT_NE(Find(index, "broken"), nullptr);
  EXPECT_EQ(Find(index, "broken")->status, ModelStatus::kFailed);
  EXPECT_NE(Find(index, "broken")->reason.find("not a valid ONNX model"), std::string::npos);
  EXPECT_EQ(m.Stats().load_failures, 1u);

  // Failure is remembered: no reload attempt on the next request.
  EXPECT_EQ(CodeOf([&] { m.Acquire("broken"); }), ErrorCode::kUnavailable);
  EXPECT_EQ(m.Stats().load_failures, 1u);

  EXPECT_NO_THROW(m.Acquire("a"));
  EXPECT_EQ(StatusOf(m, "a"), ModelStatus::kReady);

  // Fixed on disk, an explicit load retries.
  WriteModel(repo_, "broken", "1", 9);
  m.Load("broken");
  EXPECT_EQ(StatusOf(m, "broken"), ModelStatus::kReady);
  EXPECT_EQ(m.Stats().load_failures, 1u);
}

TEST_F(ModelManagerTest, SharedWeightsAreCountedOnce) {
  WriteModel(repo_, "s1", "1", 7, /*head_seed=*/11);
  WriteModel(repo_, "s2", "1", 7, /*head_seed=*/12);
  ModelManager m(Options());
  auto s1 = m.Acquire("s1");
  const int64_t one = m.Stats().accounted_bytes;
  EXPECT_GE(one, kWeightBytes + kCols * 4);
  auto s2 = m.Acquire("s2");
  const int64_t two = m.Stats().accounted_bytes;
  EXPECT_LT(static_cast<double>(two), 1.6 * static_cast<double>(one));
  EXPECT_EQ(two, one + kCols * 4);  // only the second head is new

  auto index = m.Index();
  for (const char* name : {"s1", "s2"}) {
    const ModelIndexEntry* e = Find(index, name);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->weight_bytes, kWeightBytes + kCols * 4) << name;
    EXPECT_EQ(e->shared_bytes, kWeightBytes) << name;
  }

  // Both still compute their own head: y = W(7) + H(seed).
  Tensor x = Tensor::Zeros(DType::kF32, Shape({kRows, kCols}));
  auto y1 = s1->model->Run({{"x", x}});
  auto y2 = s2->model->Run({{"x", x}});
  for (int64_t i : {int64_t{0}, int64_t{5}, kRows * kCols - 1}) {
    EXPECT_FLOAT_EQ(y1[0].second.data<float>()[i], WeightValue(7, i) + WeightValue(11, i % kCols));
    EXPECT_FLOAT_EQ(y2[0].second.data<float>()[i], WeightValue(7, i) + WeightValue(12, i % kCols));
  }
}

TEST_F(ModelManagerTest, UnloadEverythingReturnsAccountedBytesToZero) {
  ModelManager m(Options());
  for (const char* name : {"a", "b", "c"}) m.Load(name);
  EXPECT_GE(m.Stats().accounted_bytes, 3 * kWeightBytes);
  for (const char* name : {"a", "b", "c"}) m.Unload(name);
  EXPECT_EQ(m.Stats().accounted_bytes, 0);
  EXPECT_EQ(m.Stats().unloads, 3u);
  for (const auto& e : m.Index()) {
    if (e.name == "not_a_model") continue;
    EXPECT_EQ(e.status, ModelStatus::kUnavailable) << e.name;
    if (e.name != "broken") {
      EXPECT_EQ(e.reason, "unloaded: by request") << e.name;
    }
  }
  EXPECT_EQ(CodeOf([&] { m.Unload("a"); }), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace osprey::serve

// ---- GPU models on a fake device (tests/fake_device.h; issue 16) ----


#include "fake_device.h"

namespace osprey::serve {
namespace {

using osprey::testing::ScopedFakeDevice;

TEST_F(ModelManagerTest, GpuContextIsReleasedWhenNoLoadedModelUsesItAndComesBack) {
  ScopedFakeDevice device({"Add"});  // first: outlives the manager
  ManagerOptions o = Options(0, 0.2);
  o.device = {Device::kCuda, 0};
  ModelManager m(o);
  {
    auto a = m.Acquire("a");
    EXPECT_EQ(a->device.kind, Device::kCuda);
    Tensor y = RunOnes(*a);
    for (int64_t i : {int64_t{0}, int64_t{777}, kRows * kCols - 1}) EXPECT_FLOAT_EQ(y.data<float>()[i], 1.f + WeightValue(1, i));
    EXPECT_GE(m.Stats().device_bytes, kWeightBytes);  // the weight's device copy (plus the device arena)
    EXPECT_TRUE(device->ContextActive(0));
  }
  // Idle unload, then the context goes: nothing on the device, one release.
  WaitFor([&] { return !device->ContextActive(0); });
  EXPECT_FALSE(device->ContextActive(0));
  EXPECT_EQ(StatusOf(m, "a"), ModelStatus::kUnavailable);
  EXPECT_EQ(m.Stats().device_bytes, 0);
  EXPECT_EQ(device->bytes_used(), 0);
  EXPECT_EQ(m.Stats().device_releases, 1u);
  // The next request loads it again on a new context, with the same answer.
  auto again = m.Acquire("a");
  EXPECT_FLOAT_EQ(RunOnes(*again).data<float>()[5], 1.f + WeightValue(1, 5));
  EXPECT_EQ(device->ContextsCreated(), 2);
}

TEST_F(ModelManagerTest, ExplicitUnloadOfTheLastGpuModelReleasesTheDevice) {
  ScopedFakeDevice device({"Add"});
  ManagerOptions o = Options();
  o.device = {Device::kCuda, 0};
  ModelManager m(o);
  RunOnes(*m.Acquire("a"));
  RunOnes(*m.Acquire("b"));
  m.Unload("a");
  EXPECT_TRUE(device->ContextActive(0)) << "b still runs there";
  auto held = m.Acquire("b");
  m.Unload("b");  // a request still holds b: its device memory lives until it drops it
  EXPECT_TRUE(device->ContextActive(0));
  held.reset();
  WaitFor([&] { return !device->ContextActive(0); });  // the housekeeping pass releases it
  EXPECT_FALSE(device->ContextActive(0));
  EXPECT_EQ(device->bytes_used(), 0);
}

TEST_F(ModelManagerTest, GpuBudgetEvictsLeastRecentlyUsedGpuModels) {
  ScopedFakeDevice device({"Add"});
  ManagerOptions o = Options();
  o.device = {Device::kCuda, 0};
  // One model's device bytes: its weight (1 MiB) and a device arena holding its input copy and output (2 MiB); two fit.
  o.gpu_memory_budget_bytes = 7 * kWeightBytes;
  ModelManager m(o);
  RunOnes(*m.Acquire("a"));
  RunOnes(*m.Acquire("b"));
  EXPECT_EQ(StatusOf(m, "a"), ModelStatus::kReady);
  RunOnes(*m.Acquire("c"));  // a third pushes the device past the budget: the least recently used (a) goes
  WaitFor([&] { return StatusOf(m, "a") == ModelStatus::kUnavailable; });
  EXPECT_EQ(StatusOf(m, "a"), ModelStatus::kUnavailable);
  EXPECT_EQ(StatusOf(m, "b"), ModelStatus::kReady);
  EXPECT_EQ(StatusOf(m, "c"), ModelStatus::kReady);
  EXPECT_LE(m.Stats().device_bytes, o.gpu_memory_budget_bytes);
  EXPECT_NE(Find(m.Index(), "a")->reason.find("--gpu-memory-budget"), std::string::npos);
  // The index gives each loaded model's device bytes (its weight's device copy and its arena), apart from its host
  // bytes; together they are what the device holds.
  const auto index = m.Index();
  const int64_t b = Find(index, "b")->device_bytes, c = Find(index, "c")->device_bytes;
  EXPECT_GE(b, 3 * kWeightBytes);
  EXPECT_EQ(b, c);
  EXPECT_EQ(b + c, m.Stats().device_bytes);
  EXPECT_EQ(Find(index, "a")->device_bytes, 0);
  EXPECT_LT(Find(index, "b")->runtime_bytes, 2 * kWeightBytes) << "host bytes do not count the device arena";
}

TEST_F(ModelManagerTest, GpuModelWithoutADeviceFailsToLoadSayingWhy) {
  // No fake installed: this machine's CUDA backend (none, or no GPU) answers.
  InitDevices();
  DeviceBackend* builtin = GetDeviceBackend(Device::kCuda);
  if (builtin && builtin->DeviceCount() > 0) GTEST_SKIP() << "this machine has a GPU";
  ManagerOptions o = Options();
  o.device = {Device::kCuda, 0};
  ModelManager m(o);
  std::string message;
  EXPECT_EQ(CodeOf([&] { m.Acquire("a"); }, &message), ErrorCode::kUnavailable);
  EXPECT_NE(message.find("--device cpu"), std::string::npos) << message;
}

}  // namespace
}  // namespace osprey::serve
