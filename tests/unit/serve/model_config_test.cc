// config.pbtxt reading and the version policy (serve/model_config.h), and config.json's "device" field
// (ParseModelConfig). Oracles: the text written here.
#include "serve/model_config.h"

#include <gtest/gtest.h>

#include "osprey/error.h"
#include "osprey/model_dir.h"

#include <filesystem>
#include <fstream>

namespace osprey::serve {
namespace {

// One file per test process, removed when the process ends (it left one in /tmp per run before).
const std::filesystem::path& PbtxtPath() {
  static const struct File {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("osprey_pbtxt_" + std::to_string(::getpid()) + ".pbtxt");
    ~File() {
      std::error_code ignored;
      std::filesystem::remove(path, ignored);
    }
  } file;
  return file.path;
}

std::string Write(const std::string& text) {
  std::ofstream(PbtxtPath()) << text;
  return PbtxtPath().string();
}

TEST(ConfigPbtxt, ReadsTheSubsetAndNamesWhatItIgnores) {
  std::vector<std::string> ignored;
  const inference::ModelConfig c = ReadConfigPbtxt(Write(R"(
    max_batch_size: 8
    dynamic_batching { max_queue_delay_microseconds: 500 preferred_batch_size: [4] }
    input [ { name: "x" data_type: TYPE_FP32 dims: [3, 224, 224] } ]
    optimization { graph { level: 1 } }
    parameters { key: "k" value: { string_value: "v" } }
  )"), &ignored);
  EXPECT_EQ(c.max_batch_size(), 8);
  EXPECT_EQ(c.dynamic_batching().max_queue_delay_microseconds(), 500u);
  ASSERT_EQ(c.input_size(), 1);
  EXPECT_EQ(c.input(0).dims_size(), 3);
  EXPECT_EQ(ignored, (std::vector<std::string>{"ModelConfig.optimization", "ModelConfig.parameters",
                                                "ModelDynamicBatching.preferred_batch_size"}));
}

TEST(ConfigPbtxt, SyntaxErrorsNameTheLine) {
  try {
    ReadConfigPbtxt(Write("max_batch_size: 4\ninput [ { name: \"x\" dims: [ 1, } ]\n"), nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ReadConfigPbtxt(Write("default_model_filename: \"model.plan\"\n"), nullptr), Error);
}

TEST(ConfigPbtxt, VersionPolicy) {
  const std::vector<std::string> on_disk = {"1", "2", "3", "10"};
  inference::ModelConfig none;
  EXPECT_TRUE(VersionAllowed(none, "2", on_disk));  // no policy: every version directory is served
  inference::ModelConfig latest;
  latest.mutable_version_policy()->mutable_latest()->set_num_versions(2);
  EXPECT_TRUE(VersionAllowed(latest, "10", on_disk));
  EXPECT_TRUE(VersionAllowed(latest, "3", on_disk));
  EXPECT_FALSE(VersionAllowed(latest, "2", on_disk));
  inference::ModelConfig specific;
  specific.mutable_version_policy()->mutable_specific()->add_versions(2);
  EXPECT_TRUE(VersionAllowed(specific, "2", on_disk));
  EXPECT_FALSE(VersionAllowed(specific, "10", on_disk));
  inference::ModelConfig all;
  all.mutable_version_policy()->mutable_all();
  EXPECT_TRUE(VersionAllowed(all, "1", on_disk));
}

// config.json "device": checked when the file is read (before any load), the message naming the file and the field.
TEST(ModelConfigJson, DeviceIsCheckedWhenRead) {
  PreprocessSpec pre;
  PostprocessSpec post;
  std::string device;
  ParseModelConfig(R"({"device": "cuda:1"})", "m/config.json", &pre, &post, nullptr, nullptr, &device);
  EXPECT_EQ(device, "cuda:1");
  for (const char* bad : {R"({"device": "gpu"})", R"({"device": "cuda:-1"})", R"({"device": "cuda:x"})",
                          R"({"device": 0})", R"({"device": ["cpu"]})"}) {
    SCOPED_TRACE(bad);
    device.clear();
    try {
      ParseModelConfig(bad, "m/config.json", &pre, &post, nullptr, nullptr, &device);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("m/config.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("device"), std::string::npos) << e.what();
    }
    EXPECT_EQ(device, "");  // nothing taken from a refused file
  }
}

// config.json "precision": the four values the CLI takes, anything else refused naming the file and the field.
TEST(ModelConfigJson, PrecisionIsCheckedWhenRead) {
  PreprocessSpec pre;
  PostprocessSpec post;
  for (const char* ok : {"fp32", "bf16", "auto", "fp16"}) {
    std::string precision;
    ParseModelConfig(std::string(R"({"precision": ")") + ok + "\"}", "m/config.json", &pre, &post, nullptr,
                     &precision);
    EXPECT_EQ(precision, ok);
  }
  std::string precision;
  try {
    ParseModelConfig(R"({"precision": "int4"})", "m/config.json", &pre, &post, nullptr, &precision);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("precision"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("auto"), std::string::npos) << e.what();
  }
  EXPECT_EQ(precision, "");
}

}  // namespace
}  // namespace osprey::serve
