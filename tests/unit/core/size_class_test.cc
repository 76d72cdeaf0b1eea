// Size classes (core/size_class.h): sizes keep their two leading bits, so a class spans at most a third of its sizes
// and timings are shared only between sizes within 1.5x of each other. Hand-computed values.
#include "core/size_class.h"

#include <gtest/gtest.h>

namespace osprey {
namespace {

TEST(SizeClass, KeepsTheTwoLeadingBits) {
  for (int64_t n = 0; n <= 16; ++n) EXPECT_EQ(SizeClass(n), n);
  EXPECT_EQ(SizeClass(17), 16);
  EXPECT_EQ(SizeClass(23), 16);
  EXPECT_EQ(SizeClass(24), 24);
  EXPECT_EQ(SizeClass(31), 24);
  EXPECT_EQ(SizeClass(32), 32);
  EXPECT_EQ(SizeClass(47), 32);
  EXPECT_EQ(SizeClass(48), 48);
  EXPECT_EQ(SizeClass(100), 96);    // 0b1100100
  EXPECT_EQ(SizeClass(1000), 768);  // 0b1111101000
  EXPECT_EQ(SizeClass(int64_t{1} << 40 | 12345), int64_t{1} << 40);
  for (int64_t n = 17; n < 5000; ++n) {
    EXPECT_LE(SizeClass(n), n);
    EXPECT_GT(SizeClass(n) * 3, n * 2 - 1) << n;  // n < 1.5 x its class
    EXPECT_EQ(SizeClass(SizeClass(n)), SizeClass(n));
  }
}

}  // namespace
}  // namespace osprey
