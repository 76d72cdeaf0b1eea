// .npy reader/writer. Oracle: header bytes as numpy 1.x np.save writes them (copied into the test), and values
// written by hand.
#include "osprey/npy.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace osprey {
namespace {

std::string Header(int major, const std::string& dict) {
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  size_t len = dict.size();
  int len_bytes = major == 1 ? 2 : 4;
  for (int i = 0; i < len_bytes; ++i) out += static_cast<char>((len >> (8 * i)) & 0xff);
  return out + dict;
}

template <class T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

Tensor BoolTensor(Shape shape, const std::vector<int>& values) {
  Tensor t(DType::kBool, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) t.data<bool>()[i] = values[i] != 0;
  return t;
}

Tensor Parse(const std::string& s) { return ParseNpy(s.data(), s.size()); }

ErrorCode ParseError(const std::string& s) {
  try {
    Parse(s);
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "no error";
  return ErrorCode::kInternal;
}

TEST(Npy, WritesExactlyWhatNumpyWrites) {
  // np.save(f, np.array([[1,2,3],[4,5,6]], dtype=np.float32)): 10-byte prefix, header padded to 128 bytes total.
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  dict.append(117 - dict.size(), ' ');
  dict += '\n';
  std::string expected = Header(1, dict) + Bytes<float>({1, 2, 3, 4, 5, 6});
  ASSERT_EQ(expected.size(), 152u);
  EXPECT_EQ(SerializeNpy(Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6})), expected);

  std::string scalar = "{'descr': '<f4', 'fortran_order': False, 'shape': (), }";
  scalar.append(117 - scalar.size(), ' ');
  scalar += '\n';
  EXPECT_EQ(SerializeNpy(Tensor::Scalar<float>(2.5f)), Header(1, scalar) + Bytes<float>({2.5f}));

  std::string one_d = "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }";
  one_d.append(117 - one_d.size(), ' ');
  one_d += '\n';
  EXPECT_EQ(SerializeNpy(BoolTensor({3}, {1, 0, 1})), Header(1, one_d) + std::string("\x01\x00\x01", 3));
}

void RoundTrip(const Tensor& t) {
  Tensor back = Parse(SerializeNpy(t));
  ASSERT_EQ(back.dtype(), t.dtype());
  ASSERT_EQ(back.shape(), t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(back.GetAsDouble(i), t.GetAsDouble(i)) << "at " << i;
}

template <class T>
void RoundTrip(Shape shape, std::vector<T> values) {
  RoundTrip(Tensor::FromVector<T>(shape, values));
}

TEST(Npy, RoundTripsEveryDType) {
  RoundTrip<float>({5}, {1.5f, -2.f, 0.f, 3e10f, -1e-7f});
  RoundTrip<float>({2, 3, 1}, {1, 2, 3, 4, 5, 6});
  RoundTrip<float>({0, 3}, {});
  RoundTrip<float>({}, {42.f});
  RoundTrip<Float16>({3}, {{FloatToHalf(1.f)}, {FloatToHalf(-0.5f)}, {FloatToHalf(65504.f)}});
  RoundTrip<int8_t>({13}, {-128, -1, 0, 1, 127, 5, 6, 7, 8, 9, 10, 11, 12});
  RoundTrip<uint8_t>({3, 1}, {0, 128, 255});
  RoundTrip<int32_t>({2, 2}, {INT32_MIN, -1, 0, INT32_MAX});
  RoundTrip<int64_t>({3}, {INT64_MIN, 0, INT64_MAX});
  RoundTrip(BoolTensor({2, 2}, {1, 0, 0, 1}));
}

TEST(Npy, FileRoundTrip) {
  std::string path = (std::filesystem::temp_directory_path() / "osprey_npy_test.npy").string();
  WriteNpy(path, Tensor::FromVector<int32_t>({2, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  Tensor t = ReadNpy(path);
  EXPECT_EQ(t.dtype(), DType::kI32);
  EXPECT_EQ(t.shape(), (Shape{2, 5}));
  EXPECT_EQ(t.data<int32_t>()[9], 10);
  std::remove(path.c_str());
  try {
    ReadNpy(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
}

TEST(Npy, BFloat16IsRefused) {
  Tensor t(DType::kBF16, {2});
  try {
    SerializeNpy(t);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos) << e.what();
  }
}

TEST(Npy, ReadsVersion2And3Headers) {
  std::string dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }\n";
  Tensor v2 = Parse(Header(2, dict) + Bytes<int64_t>({7, -9}));
  EXPECT_EQ(v2.dtype(), DType::kI64);
  EXPECT_EQ(v2.data<int64_t>()[1], -9);
  Tensor v3 = Parse(Header(3, dict) + Bytes<int64_t>({7, -9}));
  EXPECT_EQ(v3.data<int64_t>()[0], 7);
}

TEST(Npy, ToleratesKeyOrderSpacingAndQuotes) {
  std::string dict = "{\"shape\":(3 , ),'fortran_order':False,  'descr':'<i4'}";
  Tensor t = Parse(Header(1, dict) + Bytes<int32_t>({1, 2, 3}));
  EXPECT_EQ(t.shape(), (Shape{3}));
  EXPECT_EQ(t.data<int32_t>()[2], 3);
}

TEST(Npy, Float64IsConvertedToFloat32) {
  std::string dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }\n";
  Tensor t = Parse(Header(1, dict) + Bytes<double>({0.5, -2.25, 1e3}));
  EXPECT_EQ(t.dtype(), DType::kF32);
  EXPECT_EQ(t.data<float>()[0], 0.5f);
  EXPECT_EQ(t.data<float>()[1], -2.25f);
  EXPECT_EQ(t.data<float>()[2], 1000.f);
}

TEST(Npy, MalformedInputsAreErrors) {
  std::string ok_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n";
  std::string data = Bytes<float>({1, 2});
  ASSERT_NO_THROW(Parse(Header(1, ok_dict) + data));
  EXPECT_EQ(ParseError(""), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ParseError("\x93NUMPX\x01\x00"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ParseError(std::string("\x93NUMPY\x01\x00\xff", 9)), ErrorCode::kInvalidArgument);  // short length
  // Header length past the end.
  std::string truncated = Header(1, ok_dict).substr(0, 30);
  EXPECT_EQ(ParseError(truncated), ErrorCode::kInvalidArgument);
  // Data too short / too long.
  EXPECT_EQ(ParseError(Header(1, ok_dict) + data.substr(0, 7)), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ParseError(Header(1, ok_dict) + data + "x"), ErrorCode::kInvalidArgument);
  auto with = [&](const std::string& dict) { return ParseError(Header(1, dict) + data); };
  EXPECT_EQ(with("{'descr': '<f4', 'shape': (2,), }"), ErrorCode::kInvalidArgument);  // missing key
  EXPECT_EQ(with("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(with("{'descr': '<f4', 'fortran_order': False, 'shape': (2)}"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(with("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(with("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(with("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(with("{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(with("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(with("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}"),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(with("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4)}"),
            ErrorCode::kInvalidArgument);  // element count overflows
  EXPECT_EQ(with("{'descr': '>f4', 'fortran_order': False, 'shape': (2,)}"), ErrorCode::kUnsupported);
  EXPECT_EQ(with("{'descr': '<c8', 'fortran_order': False, 'shape': (1,)}"), ErrorCode::kUnsupported);
  EXPECT_EQ(ParseError(Header(4, ok_dict) + data), ErrorCode::kUnsupported);
}

// np.save of a transposed view or an np.asfortranarray writes the elements first index fastest; they are read back
// into C order (what np.load gives). Values 100 i + 10 j + k at [i, j, k] make a wrong permutation visible.
TEST(Npy, FortranOrderIsReadIntoCOrder) {
  std::vector<float> f32;
  std::vector<double> f64;
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 3; ++j)
      for (int i = 0; i < 2; ++i) {
        f32.push_back(static_cast<float>(100 * i + 10 * j + k));
        f64.push_back(100 * i + 10 * j + k);
      }
  for (const std::string descr : {"<f4", "<f8"}) {
    SCOPED_TRACE(descr);
    const std::string dict = "{'descr': '" + descr + "', 'fortran_order': True, 'shape': (2, 3, 4), }";
    const Tensor t = Parse(Header(1, dict) + (descr == "<f4" ? Bytes<float>(f32) : Bytes<double>(f64)));
    ASSERT_EQ(t.shape(), (Shape{2, 3, 4}));
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k) EXPECT_EQ(t.data<float>()[(i * 3 + j) * 4 + k], 100 * i + 10 * j + k);
  }
  // A column vector in Fortran order is the same bytes as in C order.
  const Tensor col = Parse(Header(1, "{'descr': '<i4', 'fortran_order': True, 'shape': (3, 1), }") +
                                Bytes<int32_t>({7, 8, 9}));
  EXPECT_EQ(col.data<int32_t>()[2], 9);
}

}  // namespace
}  // namespace osprey
