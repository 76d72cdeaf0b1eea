// KServe v2 request decoding (serve/kserve.h), the code the server and the request fuzzer share. Oracles: the bytes and
// numbers written into each request, and the limits' documented answers.
#include "serve/kserve.h"

#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <map>
#include <string>

namespace osprey::serve {
namespace {

using json = nlohmann::json;

std::vector<ValueInfo> Inputs() {
  std::vector<ValueInfo> v(2);
  v[0].name = "x", v[0].dtype = DType::kF32, v[0].has_shape = true, v[0].dims = {{-1, "N"}, {2, ""}};
  v[1].name = "img", v[1].dtype = DType::kU8, v[1].has_shape = true, v[1].dims = {{-1, "N"}, {1, ""}};
  return v;
}

// Each image becomes one row holding its byte count.
Tensor CountBytes(const ValueInfo&, const std::vector<std::string_view>& images, const std::string&) {
  Tensor t(DType::kU8, {static_cast<int64_t>(images.size()), 1});
  for (size_t i = 0; i < images.size(); ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(images[i].size());
  return t;
}

std::string Binary(const json& header, const std::string& data, std::string* length) {
  const std::string head = header.dump();
  *length = std::to_string(head.size());
  return head + data;
}

TEST(KServeDecode, JsonAndBinaryInputs) {
  const float values[4] = {1.5f, -2, 3, 4};
  std::string bytes(reinterpret_cast<const char*>(values), sizeof(values));
  std::string images;
  for (std::string img : {"abc", "de"}) {
    const uint32_t n = static_cast<uint32_t>(img.size());
    images += std::string(reinterpret_cast<const char*>(&n), 4) + img;
  }
  json header = {{"inputs",
                  {{{"name", "x"}, {"datatype", "FP32"}, {"shape", {2, 2}}, {"parameters", {{"binary_data_size", 16}}}},
                   {{"name", "img"},
                    {"datatype", "BYTES"},
                    {"shape", {2}},
                    {"parameters", {{"binary_data_size", images.size()}}}}}}};
  std::string length;
  const std::string body = Binary(header, bytes + images, &length);
  InferRequest r = DecodeInferRequest(Inputs(), "m", body, length, RequestLimits{}, CountBytes);
  ASSERT_EQ(r.inputs.at("x").shape(), (Shape{2, 2}));
  EXPECT_EQ(r.inputs.at("x").data<float>()[0], 1.5f);
  EXPECT_EQ(r.inputs.at("x").data<float>()[1], -2.f);
  EXPECT_EQ(r.inputs.at("img").data<uint8_t>()[0], 3);
  EXPECT_EQ(r.inputs.at("img").data<uint8_t>()[1], 2);
}

// More length-prefixed elements than the shape declares: refused while splitting (tiny elements cannot amplify).
TEST(KServeDecode, BytesElementsBeyondTheShapeAreRefused) {
  std::string images;
  for (int i = 0; i < 3; ++i) images += std::string("\x01\x00\x00\x00", 4) + "a";
  json header = {{"inputs",
                  {{{"name", "img"},
                    {"datatype", "BYTES"},
                    {"shape", {1}},
                    {"parameters", {{"binary_data_size", images.size()}}}}}}};
  std::string length;
  const std::string body = Binary(header, images, &length);
  const std::vector<ValueInfo> both = Inputs();
  const std::vector<ValueInfo> img(both.begin() + 1, both.end());
  try {
    DecodeInferRequest(img, "m", body, length, RequestLimits{}, CountBytes);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("than the 1 its shape declares"), std::string::npos) << e.what();
  }
}

TEST(KServeDecode, WrappingShapesAreRefusedBeforeAllocating) {
  for (const json& shape : {json{int64_t{1} << 60, 2}, json{int64_t{1} << 62, int64_t{1} << 62}}) {
    json header = {{"inputs",
                    {{{"name", "x"}, {"datatype", "FP32"}, {"shape", shape}, {"parameters", {{"binary_data_size", 0}}}}}}};
    std::string length;
    const std::string body = Binary(header, "", &length);
    EXPECT_THROW(DecodeInferRequest(Inputs(), "m", body, length, RequestLimits{}, CountBytes), Error) << shape;
  }
}

TEST(KServeDecode, LimitsAnswerRequestTooLargeNamingTheFlag) {
  RequestLimits limits;
  limits.max_batch_size = 2;
  limits.max_images = 3;
  json rows = {{"inputs", {{{"name", "x"}, {"datatype", "FP32"}, {"shape", {3, 2}}, {"data", {1, 2, 3, 4, 5, 6}}}}}};
  try {
    DecodeInferRequest(Inputs(), "m", rows.dump(), "", limits, CountBytes);
    FAIL() << "no error";
  } catch (const RequestTooLarge& e) {
    EXPECT_NE(std::string(e.what()).find("--max-batch-size"), std::string::npos) << e.what();
  }
  // Four BYTES elements: refused by count before any base64 is decoded (these are not even valid base64).
  json images = {{"inputs", {{{"name", "img"}, {"datatype", "BYTES"}, {"shape", {4}}, {"data", {"!", "!", "!", "!"}}}}}};
  try {
    DecodeInferRequest(Inputs(), "m", images.dump(), "", limits, CountBytes);
    FAIL() << "no error";
  } catch (const RequestTooLarge& e) {
    EXPECT_NE(std::string(e.what()).find("--max-images"), std::string::npos) << e.what();
  }
  limits.max_batch_size = 0;  // 0 = no limit
  const std::vector<ValueInfo> both = Inputs();
  const std::vector<ValueInfo> one(both.begin(), both.begin() + 1);
  EXPECT_NO_THROW(DecodeInferRequest(one, "m", rows.dump(), "", limits, CountBytes));
}

TEST(KServeDecode, EmptyBodyAndRawBodies) {
  EXPECT_THROW(DecodeInferRequest(Inputs(), "m", "", "", RequestLimits{}, CountBytes), Error);
  const std::vector<ValueInfo> both = Inputs();
  const std::vector<ValueInfo> one(both.begin(), both.begin() + 1);
  const float values[6] = {1, 2, 3, 4, 5, 6};
  InferRequest r = DecodeInferRequest(one, "m", std::string_view(reinterpret_cast<const char*>(values), 24), "0",
                                      RequestLimits{}, CountBytes);
  EXPECT_EQ(r.inputs.at("x").shape(), (Shape{3, 2}));
  EXPECT_EQ(r.inputs.at("x").data<float>()[5], 6.f);
  EXPECT_THROW(DecodeInferRequest(one, "m", std::string_view(reinterpret_cast<const char*>(values), 20), "0",
                                  RequestLimits{}, CountBytes),
               Error);
}

// One input's 'data' written as raw JSON text (ParseInferJson reads such arrays from the text, not the DOM).
InferRequest DecodeData(const std::string& datatype, const std::string& shape, const std::string& data,
                        DType model_dtype = DType::kF32, int rank = 2) {
  std::vector<ValueInfo> inputs(1);
  inputs[0].name = "x", inputs[0].dtype = model_dtype, inputs[0].has_shape = true;
  for (int d = 0; d < rank; ++d) inputs[0].dims.push_back({-1, "d" + std::to_string(d)});
  const std::string body = "{\"id\": \"a\", \"inputs\": [ {\"name\" : \"x\", \"data\" :" + data + ", \"datatype\": \"" +
                           datatype + "\", \"shape\": " + shape + "} ] }";
  return DecodeInferRequest(inputs, "m", body, "", RequestLimits{}, CountBytes);
}

std::string DecodeError(const std::string& datatype, const std::string& shape, const std::string& data,
                        DType model_dtype = DType::kF32, int rank = 2) {
  try {
    DecodeData(datatype, shape, data, model_dtype, rank);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  return "no error";
}

TEST(KServeDecode, NumericDataIsReadFromTheText) {
  // Every JSON number form, nested lists flattened row-major, whitespace anywhere; expected values hand-written.
  InferRequest r = DecodeData("FP32", "[2, 3]", "[ [0, -0.0, 1.5e2],\n\t[ -2.25E-1 , 3.0e+0, 1e-46 ] ]");
  ASSERT_EQ(r.inputs.at("x").shape(), (Shape{2, 3}));
  const float* x = r.inputs.at("x").data<float>();
  EXPECT_EQ(x[0], 0.f);
  EXPECT_TRUE(std::signbit(x[1]));
  EXPECT_EQ(x[2], 150.f);
  EXPECT_EQ(x[3], -0.225f);
  EXPECT_EQ(x[4], 3.f);
  EXPECT_EQ(x[5], 0.f);  // below float's range
  // Beyond double's range, as JSON parsers read it: +-inf, and 0 when too small.
  r = DecodeData("FP32", "[3]", "[1e400, -1e400, 1e-400]", DType::kF32, 1);
  EXPECT_EQ(r.inputs.at("x").data<float>()[0], INFINITY);
  EXPECT_EQ(r.inputs.at("x").data<float>()[1], -INFINITY);
  EXPECT_EQ(r.inputs.at("x").data<float>()[2], 0.f);
  EXPECT_EQ(r.header["id"], "a");
  // 2^53 + 1 is not a double: read as an integer, exactly.
  r = DecodeData("INT64", "[2]", "[9007199254740993, -9223372036854775808]", DType::kI64, 1);
  EXPECT_EQ(r.inputs.at("x").data<int64_t>()[0], int64_t{9007199254740993});
  EXPECT_EQ(r.inputs.at("x").data<int64_t>()[1], INT64_MIN);
  r = DecodeData("INT8", "[1, 3]", "[[-128, 1.0, 127]]", DType::kI8);
  EXPECT_EQ(r.inputs.at("x").data<int8_t>()[0], -128);
  EXPECT_EQ(r.inputs.at("x").data<int8_t>()[1], 1);
  r = DecodeData("BOOL", "[4]", "[true, false, 0, 7]", DType::kBool, 1);
  const bool* b = r.inputs.at("x").data<bool>();
  EXPECT_TRUE(b[0] && !b[1] && !b[2] && b[3]);
  r = DecodeData("FP16", "[1, 2]", "[[1, 65504]]", DType::kF16);
  EXPECT_EQ(HalfToFloat(r.inputs.at("x").data<uint16_t>()[1]), 65504.f);
  r = DecodeData("FP32", "[1]", "2.5", DType::kF32, 1);  // a scalar 'data' (the JSON document's path)
  EXPECT_EQ(r.inputs.at("x").data<float>()[0], 2.5f);
  EXPECT_NE(DecodeError("INT8", "[1]", "\"7\"", DType::kI8, 1).find("expected an integer, found \"7\""),
            std::string::npos);
  r = DecodeData("FP32", "[0, 2]", "[]");  // no values for no elements
  EXPECT_EQ(r.inputs.at("x").numel(), 0);
  r = DecodeData("FP32", "[0, 2]", "[[], []]");
  EXPECT_EQ(r.inputs.at("x").numel(), 0);
}

TEST(KServeDecode, MalformedNumericDataIsRefusedNamingTheInput) {
  // What a JSON parser refuses is refused here too, though well-bracketed arrays never reach the JSON parser (the
  // others are not cut out of the text, and the parser refuses the body).
  for (const char* data : {"[1,,2]", "[1,]", "[,1]", "[01]", "[.5]", "[+1]", "[1.]", "[1e]", "[-]", "[NaN]",
                           "[Infinity]", "[0x10]", "[1 2]", "[1 ,2 3]"}) {
    const std::string error = DecodeError("FP32", "[2]", data, DType::kF32, 1);
    EXPECT_NE(error.find("input 'x'"), std::string::npos) << data << ": " << error;
  }
  for (const char* data : {"[1]]", "[[1,2]", "[[1],2", "[1}", "[1,2", "[[1],[2]"}) {
    const std::string error = DecodeError("FP32", "[2]", data, DType::kF32, 1);
    EXPECT_NE(error.find("not valid JSON"), std::string::npos) << data << ": " << error;
  }
  EXPECT_NE(DecodeError("FP32", "[2]", "[1, true]", DType::kF32, 1).find("expected a number, found true"),
            std::string::npos);
  EXPECT_NE(DecodeError("FP32", "[2]", "[1, null]", DType::kF32, 1).find("expected a number, found null"),
            std::string::npos);
  EXPECT_NE(DecodeError("INT8", "[1]", "[128]", DType::kI8, 1).find("value 128 is out of range"), std::string::npos);
  EXPECT_NE(DecodeError("INT32", "[1]", "[1.5]", DType::kI32, 1).find("expected an integer, found 1.5"),
            std::string::npos);
  EXPECT_NE(DecodeError("INT64", "[1]", "[9223372036854775808]", DType::kI64, 1).find("out of range"),
            std::string::npos);
  for (const char* huge : {"[1e400]", "[1e-400]"})  // not 0: from_chars stores nothing out of double's range
    EXPECT_NE(DecodeError("INT32", "[1]", huge, DType::kI32, 1).find("out of range"), std::string::npos) << huge;
  EXPECT_NE(DecodeError("FP32", "[2, 2]", "[[1, 2], [3]]").find("3 values in 'data' for shape [2, 2] (4 elements)"),
            std::string::npos);
  // Bodies cut short where the text walk looks for an input or its data (found by fuzz/request_fuzz.cc).
  for (const char* body : {"{\"inputs\":[", "{\"inputs\":[{\"data\":", "{\"inputs\":[{\"data\":[1,", "{\"inputs\": "}) {
    EXPECT_THROW(DecodeInferRequest(Inputs(), "m", body, "", RequestLimits{}, CountBytes), Error) << body;
  }
  // The internal placeholder's form sent by a client (no span behind it) is refused as data, naming the input.
  EXPECT_NE(DecodeError("FP32", "[1]", "{\"osprey.data_span\": 0}", DType::kF32, 1)
                .find("input 'x': 'data' is not a valid JSON array"),
            std::string::npos);
  // Numbers where a BYTES input needs base64 strings.
  EXPECT_NE(DecodeError("BYTES", "[1, 1]", "[1]", DType::kU8).find("must hold base64 strings"), std::string::npos);
}

TEST(KServeDecode, DataIsCountedBeforeTheTensorIsAllocated) {
  // A declared shape of 2^40 elements and two values: refused by the count, nothing of 4 TiB allocated.
  const std::string error = DecodeError("FP32", "[1099511627776]", "[1, 2]", DType::kF32, 1);
  EXPECT_NE(error.find("2 values in 'data'"), std::string::npos) << error;
}

TEST(ImageBudget, PixelsAreSharedAcrossTheRequest) {
  RequestLimits limits;
  limits.max_megapixels = 3;
  ImageBudget budget(limits);
  EXPECT_EQ(budget.PixelsLeft(100'000'000), 3'000'000);
  budget.Spend(2'500'000);
  EXPECT_EQ(budget.PixelsLeft(100'000'000), 500'000);
  EXPECT_EQ(budget.PixelsLeft(1'000), 1'000);
  EXPECT_NE(budget.LimitName().find("--max-request-megapixels"), std::string::npos);
}

TEST(KServeEncode, BinaryAndJsonOutputs) {
  std::vector<std::pair<std::string, Tensor>> results = {{"y", Tensor::FromVector<float>({2}, {1, 2})}};
  InferResponse json_answer =
      EncodeInferResponse(json::object(), "m", "1", SelectOutputs(json::object(), "m", results, {}));
  EXPECT_EQ(json_answer.header_length, -1);
  EXPECT_EQ(json::parse(json_answer.body)["outputs"][0]["data"], json({1.0, 2.0}));
  const json header = {{"parameters", {{"binary_data_output", true}}}};
  InferResponse binary = EncodeInferResponse(header, "m", "1", SelectOutputs(header, "m", results, {}));
  ASSERT_GE(binary.header_length, 0);
  ASSERT_EQ(binary.body.size(), static_cast<size_t>(binary.header_length) + 8);
  float back[2];
  std::memcpy(back, binary.body.data() + binary.header_length, 8);
  EXPECT_EQ(back[1], 2.f);
}

// Triton's classification extension: the top N of each row as "score:index:label", BYTES.
TEST(KServeEncode, JsonDataIsWrittenAsTextEveryDtype) {
  std::vector<std::pair<std::string, Tensor>> results = {
      {"f", Tensor::FromVector<float>({5}, {0.1f, -2.5f, 1e-45f, std::nanf(""), -INFINITY})},
      {"i", Tensor::FromVector<int64_t>({2}, {INT64_MIN, INT64_MAX})},
      {"u", Tensor::FromVector<uint8_t>({2}, {0, 255})},
      {"b", Tensor::FromVector<bool>({2}, {true, false})},
      {"h", Tensor(DType::kF16, {1})}};
  results[4].second.data<uint16_t>()[0] = 0x3555;  // float16 0.333251953125
  // A request id holding what a marker looks like, quotes included: it must come back as it was.
  const json request = {{"id", "\"osprey.data.0\" osprey.data.1"}};
  InferResponse answer = EncodeInferResponse(request, "m", "1", SelectOutputs(request, "m", results, {}));
  const std::string& body = answer.body;
  EXPECT_NE(body.find("\"data\":[0.1,-2.5,1e-45,null,null]"), std::string::npos) << body;  // shortest float forms
  EXPECT_NE(body.find("\"data\":[-9223372036854775808,9223372036854775807]"), std::string::npos) << body;
  const json parsed = json::parse(body);
  EXPECT_EQ(parsed["id"], request["id"]);
  std::map<std::string, json> data;
  for (const json& o : parsed["outputs"]) data[o["name"]] = o["data"];
  EXPECT_EQ(static_cast<float>(data["f"][0].get<double>()), 0.1f);  // reads back to the same float32
  EXPECT_EQ(data["u"], json({0, 255}));
  EXPECT_EQ(data["b"], json({true, false}));
  EXPECT_EQ(data["h"], json({0.33325195}));
  EXPECT_EQ(data["i"][0].get<int64_t>(), INT64_MIN);
}

TEST(KServeEncode, ClassificationStrings) {
  std::vector<std::pair<std::string, Tensor>> results = {
      {"y", Tensor::FromVector<float>({2, 3}, {0.1f, 0.7f, 0.2f, 0.5f, 0.25f, 0.25f})}};
  const json header = {{"outputs", {{{"name", "y"}, {"parameters", {{"classification", 2}}}}}}};
  std::vector<ResponseOutput> out = SelectOutputs(header, "m", results, {"cat", "dog", "eel"});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].datatype, "BYTES");
  EXPECT_EQ(out[0].shape, (Shape{2, 2}));
  EXPECT_EQ(out[0].strings, (std::vector<std::string>{"0.700000:1:dog", "0.200000:2:eel", "0.500000:0:cat",
                                                      "0.250000:1:dog"}));
  const json bad = {{"outputs", {{{"name", "y"}, {"parameters", {{"classification", 0}}}}}}};
  EXPECT_THROW(SelectOutputs(bad, "m", results, {}), Error);
}

TEST(KServeDecode, UnknownParametersAreReported) {
  const json request = {{"parameters", {{"sequence_id", 7}, {"binary_data_output", false}}},
                        {"inputs", {{{"name", "x"}, {"datatype", "FP32"}, {"shape", {1, 2}}, {"data", {1, 2}}}}},
                        {"outputs", {{{"name", "y"}, {"parameters", {{"priority", 1}}}}}}};
  const std::vector<ValueInfo> both = Inputs();
  const std::vector<ValueInfo> one(both.begin(), both.begin() + 1);
  InferRequest r = DecodeInferRequest(one, "m", request.dump(), "", RequestLimits{}, CountBytes);
  EXPECT_EQ(r.ignored_parameters, (std::vector<std::string>{"sequence_id", "output 'y': priority"}));
}

}  // namespace
}  // namespace osprey::serve
