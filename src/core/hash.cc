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

Hash128 HashBytes(const void* data, size_t n) {
  // xxHash64's stripe round on four lanes; the multiplies of different lanes overlap.
  constexpr uint64_t kP1 = 0x9e3779b185ebca87ULL;
  constexpr uint64_t kP2 = 0xc2b2ae3d27d4eb4fULL;
  uint64_t v0 = 0x60ea27eeadc0b5d6ULL, v1 = 0xc2b2ae3d27d4eb4fULL, v2 = 0, v3 = 0x61c8864e7a143579ULL;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  const size_t stripes = n / 32;
  for (size_t i = 0; i < stripes; ++i, p += 32) {
    uint64_t w[4];
    std::memcpy(w, p, 32);
    v0 = Rotl(v0 + w[0] * kP2, 31) * kP1;
    v1 = Rotl(v1 + w[1] * kP2, 31) * kP1;
    v2 = Rotl(v2 + w[2] * kP2, 31) * kP1;
    v3 = Rotl(v3 + w[3] * kP2, 31) * kP1;
  }
  Hasher h;
  h.UpdateU64(n);
  h.UpdateU64(v0);
  h.UpdateU64(v1);
  h.UpdateU64(v2);
  h.UpdateU64(v3);
  h.Update(p, n % 32);
  return h.Finish();
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
