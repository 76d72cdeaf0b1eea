// Subnormal floats flushed to zero while osprey computes (docs/architecture.md, "Subnormal floats").
//
// Arithmetic on subnormal floats (magnitudes below 1.2e-38) takes a microcode assist on x86 CPUs, ~100x the cost of
// a normal operation. A kernel whose values (or intermediate values: an activation's polynomial, the padded lanes
// of a blocked layout) fall there can run 100x slower than on other data: oneDNN 3.2's brgconv:avx2 convolution
// with a Sigmoid post-op and one output channel ran 170 ms instead of 1 ms in basic-pitch's model. So plans run, and
// compile (constant folding, kernel timing), with the FTZ and DAZ bits of MXCSR set on the calling thread, as
// TensorFlow does on every thread it computes on; osprey's OpenMP team gives each worker its region's starter's
// mode (threads/team.cc), and on another runtime (libgomp) Plan::Run sets the workers' mode for the run and puts
// theirs back after (runtime/plan.cc). The thread's previous mode is restored at the end, so a Python caller's own
// NumPy keeps IEEE behaviour. OSPREY_DENORMALS=keep keeps subnormals (results then match a non-flushing peer bit for bit near
// zero, at the risk of the slow path).
#pragma once

#include <cstdlib>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace osprey {

class FlushDenormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  FlushDenormals() : saved_(_mm_getcsr()) {
    if (Wanted()) _mm_setcsr(saved_ | kFtzDaz);
  }
  ~FlushDenormals() { _mm_setcsr((_mm_getcsr() & kStatusBits) | (saved_ & ~kStatusBits)); }
#else
  FlushDenormals() = default;
#endif
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

  static bool Wanted() {
    static const bool wanted = [] {
      const char* v = std::getenv("OSPREY_DENORMALS");
      return !(v && std::strcmp(v, "keep") == 0);
    }();
    return wanted;
  }

 private:
#if defined(__x86_64__) || defined(__i386__)
  static constexpr unsigned kFtzDaz = 0x8040;      // flush-to-zero (bit 15), denormals-are-zero (bit 6)
  static constexpr unsigned kStatusBits = 0x003F;  // sticky exception flags: left as the computation set them
  unsigned saved_;
#endif
};

}  // namespace osprey
