#pragma once
// Whether this CPU can run the bf16 fast mode (CompileOptions::precision = kBf16 / kAuto), and whether kernels may
// choose by timing.
#include <string>

namespace osprey::cpu {

/// True when the CPU has AVX512_BF16 (cpuid) and oneDNN will use it (effective ISA avx512_core_bf16 or better).
/// `description`, when given, receives what was found, e.g. "oneDNN ISA avx512_core_vnni, no AVX512_BF16".
bool CpuSupportsBf16(std::string* description = nullptr);

/// False when OSPREY_TUNE=0: kernels then take oneDNN's first implementation and do not time bf16 against fp32
/// (dnnl_common.cc).
bool TuningEnabled();

}  // namespace osprey::cpu
