#include <gtest/gtest.h>

#include "core/hash.h"
#include "osprey/tensor.h"

namespace osprey {
namespace {

TEST(Tensor, FromVectorRoundTrip) {
  Tensor t = Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(t.data<float>()[4], 5.f);
  EXPECT_THROW(Tensor::FromVector<float>({2, 2}, {1, 2, 3}), Error);
}

TEST(Tensor, ReshapeChecksCount) {
  Tensor t = Tensor::FromVector<int64_t>({6}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(t.Reshaped({3, 2}).dim(0), 3);
  EXPECT_THROW(t.Reshaped({4}), Error);
}

TEST(Shape, NumElementsRejectsNegativeAndOverflow) {
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(NumElements({2, 0, 5}), 0);
  EXPECT_THROW(NumElements({-1, 3}), Error);
  EXPECT_THROW(NumElements({1LL << 40, 1LL << 40}), Error);
}

// The one size rule: products that would wrap int64/uint64 are refused, with the rule's name in the message.
TEST(SizeRule, CheckedArithmeticRefusesWhatWouldWrap) {
  EXPECT_EQ(CheckedMul(1 << 20, 1 << 20), int64_t{1} << 40);
  EXPECT_EQ(CheckedMul(0, kMaxBytes), 0);
  EXPECT_EQ(CheckedAdd(kMaxBytes - 1, 1), kMaxBytes);
  EXPECT_THROW(CheckedMul(kMaxBytes, 2), Error);
  EXPECT_THROW(CheckedMul(int64_t{1} << 62, 4), Error);  // wraps to 0 in uint64
  EXPECT_THROW(CheckedMul(-1, 4), Error);
  EXPECT_THROW(CheckedAdd(kMaxBytes, 1), Error);
  try {
    CheckedMul(int64_t{1} << 40, int64_t{1} << 40, "arena");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("arena"), std::string::npos) << e.what();
  }
}

TEST(SizeRule, NumBytesCountsTheDtype) {
  EXPECT_EQ(NumBytes(DType::kF32, {2, 3}), 24);
  EXPECT_EQ(NumBytes(DType::kI64, {}), 8);
  // 2^60 x 4 elements is 2^62 elements; times 4 bytes wraps uint64 to 0: the KServe crash of issue 10.
  EXPECT_THROW(NumBytes(DType::kF32, {int64_t{1} << 60, 4}), Error);
  // Under the element limit but over the byte limit.
  EXPECT_NO_THROW(NumElements({int64_t{1} << 46}));
  EXPECT_THROW(NumBytes(DType::kI64, {int64_t{1} << 46}), Error);
  EXPECT_THROW(Tensor(DType::kF32, {int64_t{1} << 60, 4}), Error);
}

// An allocation past the host limit is an error, not a later OOM kill; buffers within it work as before.
TEST(Allocator, HostLimitRefusesAndRestores) {
  const int64_t saved = Allocator::host_limit();
  Allocator::SetHostLimit(Allocator::Host().BytesLive() + (8 << 20));
  EXPECT_NO_THROW(Tensor(DType::kU8, {4 << 20}));
  try {
    Tensor big(DType::kU8, {64 << 20});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
    EXPECT_NE(std::string(e.what()).find("out of host memory"), std::string::npos) << e.what();
  }
  Allocator::SetHostLimit(saved);
  EXPECT_NO_THROW(Tensor(DType::kU8, {64 << 20}));
  EXPECT_THROW(Allocator::Host().Allocate(size_t{1} << 50), Error);  // past the size rule, whatever the host limit
}

TEST(Half, KnownValues) {
  // Hand-computed IEEE half encodings.
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);
  EXPECT_FLOAT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_FLOAT_EQ(HalfToFloat(0x0001), 5.960464477539063e-08f);
  for (float v : {0.f, 0.5f, -3.25f, 1024.f, 6.1035156e-05f, 3.0517578e-05f})
    EXPECT_EQ(HalfToFloat(FloatToHalf(v)), v) << v;
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1+2^-7: ties to even (1.0).
  EXPECT_EQ(FloatToBFloat16(1.0f + 1.0f / 256), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(1.0f + 3.0f / 256), 0x3f82);
}

TEST(Cast, FloatToIntTruncatesAndBool) {
  Tensor t = Tensor::FromVector<float>({4}, {1.7f, -1.7f, 0.f, 3.f});
  Tensor i = CastTensor(t, DType::kI32);
  EXPECT_EQ(i.data<int32_t>()[0], 1);
  EXPECT_EQ(i.data<int32_t>()[1], -1);
  Tensor b = CastTensor(t, DType::kBool);
  EXPECT_TRUE(b.data<bool>()[0]);
  EXPECT_FALSE(b.data<bool>()[2]);
}

TEST(Allocator, AccountsAndReturnsBytes) {
  auto account = std::make_shared<MemoryAccount>("test");
  int64_t before = Allocator::Host().BytesLive();
  {
    Tensor small(DType::kF32, {10}, account);
    Tensor large(DType::kF32, {1 << 20}, account);  // 4 MiB: mmap-backed
    EXPECT_TRUE(large.buffer()->mmapped());
    EXPECT_FALSE(small.buffer()->mmapped());
    EXPECT_EQ(account->BytesLive(), 64 + (4 << 20));
    EXPECT_GE(Allocator::Host().BytesLive() - before, 64 + (4 << 20));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(small.raw()) % 64, 0u);
  }
  EXPECT_EQ(account->BytesLive(), 0);
  EXPECT_EQ(account->BytesPeak(), 64 + (4 << 20));
  EXPECT_EQ(Allocator::Host().BytesLive(), before);
}

TEST(Hash, DiffersOnContentAndIsStable) {
  Hasher a, b, c;
  a.Update("hello world, this is longer than eight bytes");
  b.Update("hello world, this is longer than eight bytes");
  c.Update("hello world, this is longer than eight byteS");
  EXPECT_EQ(a.Finish(), b.Finish());
  EXPECT_FALSE(a.Finish() == c.Finish());
  Hasher d, e;  // split updates hash like one update
  d.Update("abc", 3);
  d.Update("defghijk", 8);
  e.Update("abcdefghijk", 11);
  EXPECT_EQ(d.Finish(), e.Finish());
}

}  // namespace
}  // namespace osprey
