#pragma once
/// numpy `.npy` files (format versions 1.0, 2.0 and 3.0), C order, little-endian.
/// Read dtypes: '<f4' '<f2' '|i1' '|u1' '<i4' '<i8' '|b1', and '<f8' (converted to float32 on read).
/// bfloat16 has no numpy dtype: WriteNpy refuses it (kUnsupported); convert to float32 first.
#include <cstddef>
#include <string>

#include "osprey/tensor.h"

namespace osprey {

/// Reads a .npy file. Throws kNotFound when it cannot be opened, kInvalidArgument for a malformed header or a data
/// length that does not match the header, kUnsupported for other dtypes, big-endian data or Fortran order.
Tensor ReadNpy(const std::string& path);

/// Parses .npy bytes held in memory (copied into a new tensor; `data` is not retained). Same errors as ReadNpy.
Tensor ParseNpy(const void* data, size_t size);

/// Serialises `tensor` as .npy bytes (version 1.0, or 2.0 when the header needs it).
std::string SerializeNpy(const Tensor& tensor);

/// Writes `tensor` to `path` (replacing it). Throws kUnsupported for bfloat16, kUnavailable when the write fails.
void WriteNpy(const std::string& path, const Tensor& tensor);

}  // namespace osprey
