// npy_io.h - NPY tensors in and out through xtensor's reader/writer: fp32 / fp16 / bf16 (fp32 or raw 16-bit).
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace attnfuzz::npy {

// One-line error about one file ("q.npy: truncated data: 96 of 128 bytes"); the CLI prints it and exits 2.
class NpyError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Element type as stored in the file.
enum class Stored { kF32, kF16, kBF16Raw, kF64, kU8 };  // kU8: bool / uint8 (masks)
const char* stored_name(Stored s);  // "float32", "float16", "bfloat16 (raw 16-bit)", "float64"

struct Array {
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major (C order) values widened exactly to float (f64 rounded to float)
  Stored stored = Stored::kF32;
  bool f64_inexact = false;  // an f64 value was not exactly a float (the tool judges the float rounding)
};

// Limits of read_array: elements of one array (the tool's tensor limit, kMaxElements) and header bytes.
inline constexpr uint64_t kMaxNpyElements = uint64_t{1} << 31;
inline constexpr uint64_t kMaxNpyHeaderBytes = uint64_t{1} << 16;

// Reads an NPY file with xtensor's parser (xt::detail::load_npy_file). Accepted: '<f4', '<f2', '<f8';
// '<u2' / '<i2' only with bf16_raw (bfloat16 bit patterns). C or Fortran order. Throws NpyError for a
// missing file, a non-regular file, a bad header (negative or absurd shape: which dimension, which limit),
// another dtype, a big-endian file or truncated data.
Array read_array(const std::filesystem::path& path, bool bf16_raw = false);

// Writes a C-order NPY file with xt::dump_npy: float32 ('<f4'), float16 ('<f2', values rounded to fp16)
// or raw bfloat16 bits ('<u2', values rounded to bf16). Throws NpyError.
void write_array(const std::filesystem::path& path, const std::vector<int64_t>& shape, const float* data,
                 Stored as = Stored::kF32);

std::string shape_text(const std::vector<int64_t>& shape);  // "[1, 7, 2, 59]"

}  // namespace attnfuzz::npy
