// The one auto_pad / window resolver (ops/conv_window.h) that the shape rules and every Conv, ConvTranspose and pool
// kernel use. Oracles: the ONNX operator spec's formulas, worked by hand.
#include "ops/conv_window.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_util.h"

namespace osprey {
namespace {

using testing::MakeNode;
using V = std::vector<int64_t>;

Attribute Ints(V v) { return Attribute::Ints(std::move(v)); }
Attribute Str(const char* s) { return Attribute::String(s); }

TEST(ConvWindow, ExplicitPadsAndDefaults) {
  const ConvWindow w = ResolveConvWindow(MakeNode("Conv", 2, 1, {{"pads", Ints({1, 0, 2, 3})}}), {1, 1, 5, 6}, {3, 2},
                                         false);
  EXPECT_EQ(w.auto_pad, AutoPad::kNotSet);
  EXPECT_EQ(w.in, V({5, 6}));
  EXPECT_EQ(w.strides, V({1, 1}));
  EXPECT_EQ(w.dilations, V({1, 1}));
  EXPECT_EQ(w.pad_begin, V({1, 0}));
  EXPECT_EQ(w.pad_end, V({2, 3}));
  EXPECT_EQ(w.out, V({5 + 3 - 3 + 1, 6 + 3 - 2 + 1}));
}

TEST(ConvWindow, SameUpperPutsTheOddUnitAtTheEndSameLowerAtTheStart) {
  // in 5, k 3 dilated by 2 (dk 5), stride 2: out 3, total pad (3 - 1) * 2 + 5 - 5 = 4 on axis 0; in 6, k 2, s 2:
  // out 3, total (3 - 1) * 2 + 2 - 6 = 0 on axis 1. A 1-D in 4, k 2, s 1: out 4, total 1.
  const Node upper = MakeNode("Conv", 2, 1, {{"auto_pad", Str("SAME_UPPER")}, {"strides", Ints({2, 2})},
                                             {"dilations", Ints({2, 1})}, {"pads", Ints({9, 9, 9, 9})}});
  const ConvWindow u = ResolveConvWindow(upper, {1, 1, 5, 6}, {3, 2}, false);
  EXPECT_EQ(u.out, V({3, 3}));
  EXPECT_EQ(u.pad_begin, V({2, 0}));
  EXPECT_EQ(u.pad_end, V({2, 0}));
  const ConvWindow u1 = ResolveConvWindow(MakeNode("MaxPool", 1, 1, {{"auto_pad", Str("SAME_UPPER")}}), {1, 1, 4},
                                          {2}, false);
  EXPECT_EQ(u1.out, V({4}));
  EXPECT_EQ(u1.pad_begin, V({0}));
  EXPECT_EQ(u1.pad_end, V({1}));
  const ConvWindow l1 = ResolveConvWindow(MakeNode("MaxPool", 1, 1, {{"auto_pad", Str("SAME_LOWER")}}), {1, 1, 4},
                                          {2}, false);
  EXPECT_EQ(l1.out, V({4}));
  EXPECT_EQ(l1.pad_begin, V({1}));
  EXPECT_EQ(l1.pad_end, V({0}));
}

TEST(ConvWindow, ValidPadsNothing) {
  const ConvWindow w = ResolveConvWindow(
      MakeNode("Conv", 2, 1, {{"auto_pad", Str("VALID")}, {"strides", Ints({2})}, {"pads", Ints({1, 1})}}), {1, 1, 7},
      {3}, false);
  EXPECT_EQ(w.out, V({3}));
  EXPECT_EQ(w.pad_begin, V({0}));
  EXPECT_EQ(w.pad_end, V({0}));
}

TEST(ConvWindow, CeilModeAddsAWindowUnlessItStartsInTheEndPadding) {
  const Node node = MakeNode("MaxPool", 1, 1, {{"strides", Ints({2})}, {"pads", Ints({0, 1})}});
  // in 6, k 2, pads (0, 1): span 5 -> floor 3, ceil 4; the 4th window starts at 6 = in + pad_begin: dropped.
  EXPECT_EQ(ResolveConvWindow(node, {1, 1, 6}, {2}, false).out, V({3}));
  EXPECT_EQ(ResolveConvWindow(node, {1, 1, 6}, {2}, true).out, V({3}));
  // in 5, k 2, no pads: span 3 -> floor 2, ceil 3 (the window starting at 4 holds one real element).
  const Node plain = MakeNode("MaxPool", 1, 1, {{"strides", Ints({2})}});
  EXPECT_EQ(ResolveConvWindow(plain, {1, 1, 5}, {2}, false).out, V({2}));
  EXPECT_EQ(ResolveConvWindow(plain, {1, 1, 5}, {2}, true).out, V({3}));
}

TEST(ConvWindow, TransposeExplicitSameAndOutputShape) {
  // in 3, k 3, s 2, output_padding 1, pads (1, 0): full result 2 * 2 + 3 + 1 = 8, out 7.
  const ConvWindow e = ResolveConvTransposeWindow(
      MakeNode("ConvTranspose", 2, 1,
               {{"strides", Ints({2})}, {"output_padding", Ints({1})}, {"pads", Ints({1, 0})}}),
      {1, 1, 3}, {3});
  EXPECT_EQ(e.out, V({7}));
  EXPECT_EQ(e.pad_begin, V({1}));
  EXPECT_EQ(e.pad_end, V({0}));
  // SAME_UPPER, in 3, k 3, s 2: out 6, total 2 * 2 + 3 - 6 = 1 -> begin 0, end 1; SAME_LOWER -> begin 1, end 0.
  const ConvWindow u = ResolveConvTransposeWindow(
      MakeNode("ConvTranspose", 2, 1, {{"strides", Ints({2})}, {"auto_pad", Str("SAME_UPPER")}}), {1, 1, 3}, {3});
  EXPECT_EQ(u.out, V({6}));
  EXPECT_EQ(u.pad_begin, V({0}));
  EXPECT_EQ(u.pad_end, V({1}));
  const ConvWindow l = ResolveConvTransposeWindow(
      MakeNode("ConvTranspose", 2, 1, {{"strides", Ints({2})}, {"auto_pad", Str("SAME_LOWER")}}), {1, 1, 3}, {3});
  EXPECT_EQ(l.pad_begin, V({1}));
  EXPECT_EQ(l.pad_end, V({0}));
  // A negative total is split with floor division: in 2, k 2, s 3: out 6, total 3 + 2 - 6 = -1 -> SAME_UPPER begin
  // floor(-1 / 2) = -1, end 0.
  const ConvWindow neg = ResolveConvTransposeWindow(
      MakeNode("ConvTranspose", 2, 1, {{"strides", Ints({3})}, {"auto_pad", Str("SAME_UPPER")}}), {1, 1, 2}, {2});
  EXPECT_EQ(neg.out, V({6}));
  EXPECT_EQ(neg.pad_begin, V({-1}));
  EXPECT_EQ(neg.pad_end, V({0}));
  // output_shape (spatial, or with N and C) wins; explicit pads still give the start crop.
  const ConvWindow os = ResolveConvTransposeWindow(
      MakeNode("ConvTranspose", 2, 1, {{"strides", Ints({2})}, {"output_shape", Ints({1, 1, 8})}}), {1, 1, 3}, {3});
  EXPECT_EQ(os.out, V({8}));
  EXPECT_EQ(os.pad_begin, V({0}));
  EXPECT_EQ(os.pad_end, V({-1}));
}

TEST(ConvWindow, BadAttributesThrowNamingTheNode) {
  EXPECT_THROW(ReadAutoPad(MakeNode("Conv", 2, 1, {{"auto_pad", Str("SAME")}})), Error);
  EXPECT_THROW(ResolveConvWindow(MakeNode("Conv", 2, 1, {{"strides", Ints({0})}}), {1, 1, 4}, {2}, false), Error);
  EXPECT_THROW(ResolveConvWindow(MakeNode("Conv", 2, 1, {{"pads", Ints({1})}}), {1, 1, 4}, {2}, false), Error);
  EXPECT_THROW(ResolveConvWindow(MakeNode("Conv", 2, 1, {}), {1, 1, 2}, {3}, false), Error);
  EXPECT_THROW(ResolveConvTransposeWindow(MakeNode("ConvTranspose", 2, 1, {{"pads", Ints({2, 2})}}), {1, 1, 1}, {1}),
               Error);
  try {
    ResolveConvWindow(MakeNode("Conv", 2, 1, {{"auto_pad", Str("bogus")}}), {1, 1, 4}, {2}, false);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attribute 'auto_pad' should be NOTSET, SAME_UPPER, SAME_LOWER or VALID"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace osprey
