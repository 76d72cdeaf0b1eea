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
