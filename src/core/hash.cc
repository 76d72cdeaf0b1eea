#include "core/hash.h"

#include <cstdio>

namespace osprey {

namespace {
inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t Fmix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}
constexpr uint64_t kC1 = 0x87c37b91114253d5ULL;
constexpr uint64_t kC2 = 0x4cf5ad432745937fULL;
}  // namespace

std::string Hash128::ToHex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

Hasher::Hasher() : a_(0x243f6a8885a308d3ULL), b_(0x13198a2e03707344ULL) {}

void Hasher::Mix(uint64_t k) {
  // Two independent MurmurHash3-style lanes give 128 bits.
  uint64_t k1 = k * kC1;
  k1 = Rotl(k1, 31) * kC2;
  a_ ^= k1;
  a_ = Rotl(a_, 27) + b_;
  a_ = a_ * 5 + 0x52dce729;
  uint64_t k2 = k * kC2;
  k2 = Rotl(k2, 33) * kC1;
  b_ ^= k2;
  b_ = Rotl(b_, 31) + a_;
  b_ = b_ * 5 + 0x38495ab5;
}

void Hasher::Update(const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  length_ += n;
  while (n > 0 && tail_bytes_ != 0) {
    tail_ |= static_cast<uint64_t>(*p++) << (8 * tail_bytes_);
    --n;
    if (++tail_bytes_ == 8) {
      Mix(tail_);
      tail_ = 0;
      tail_bytes_ = 0;
    }
  }
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    Mix(w);
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    tail_ |= static_cast<uint64_t>(*p++) << (8 * tail_bytes_++);
    --n;
  }
}

Hash128 Hasher::Finish() const {
  uint64_t a = a_ ^ length_ ^ Fmix(tail_ + tail_bytes_);
  uint64_t b = b_ ^ length_;
  a += b;
  b += a;
  a = Fmix(a);
  b = Fmix(b);
  a += b;
  b += a;
  return Hash128{a, b};
}

}  // namespace osprey
