// npy_io.cpp - NPY reading and writing on top of xtensor's xnpy.hpp, with one-line errors.
#include "npy/npy_io.h"

#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xnpy.hpp>

#include "oracle/lowp.h"

namespace attnfuzz::npy {

const char* stored_name(Stored s) {
  switch (s) {
    case Stored::kF32:
      return "float32";
    case Stored::kF16:
      return "float16";
    case Stored::kBF16Raw:
      return "bfloat16 (raw 16-bit)";
    case Stored::kF64:
      return "float64";
  }
  return "?";
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

// The file's elements as row-major T (xtensor reorders Fortran-order files).
template <class T>
std::vector<T> row_major(xt::detail::npy_file&& f) {
  auto a = std::move(f).cast<T, xt::layout_type::dynamic>(false);  // typestring already checked
  xt::xarray<T, xt::layout_type::row_major> c = a;
  return std::vector<T>(c.begin(), c.end());
}

}  // namespace

Array read_array(const std::filesystem::path& path, bool bf16_raw) {
  const std::string name = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NpyError(name + ": cannot open the file");
  std::error_code ec;
  const auto file_size = std::filesystem::file_size(path, ec);
  std::optional<xt::detail::npy_file> loaded;
  try {
    loaded.emplace(xt::detail::load_npy_file(in));
  } catch (const std::exception& e) {
    throw NpyError(name + ": bad NPY header (" + e.what() + ")");
  }
  xt::detail::npy_file& f = *loaded;
  if (!in) {
    // xtensor reads the data with one istream::read and does not check it: a short read is truncation.
    throw NpyError(name + ": truncated data: " + std::to_string(in.gcount()) + " of " +
                   std::to_string(f.n_bytes()) + " data bytes for shape " +
                   shape_text(std::vector<int64_t>(f.m_shape.begin(), f.m_shape.end())) + " (" +
                   f.m_typestring + ")");
  }
  if (in.peek() != std::char_traits<char>::eof())
    throw NpyError(name + ": " +
                   std::to_string(static_cast<uint64_t>(file_size) - static_cast<uint64_t>(in.tellg())) +
                   " bytes after the data: the header's shape or dtype does not describe the file");
  Array a;
  for (auto s : f.m_shape) a.shape.push_back(static_cast<int64_t>(s));
  const std::string& t = f.m_typestring;
  if (!t.empty() && t[0] == '>')
    throw NpyError(name + ": big-endian dtype '" + t +
                   "' (save with a little-endian dtype, e.g. astype('<f4'))");
  const bool two_byte_int = t == "<u2" || t == "<i2" || t == "|u2" || t == "|i2";
  if (t == "<f4") {
    a.stored = Stored::kF32;
    a.data = row_major<float>(std::move(f));
  } else if (t == "<f8") {
    a.stored = Stored::kF64;
    for (double x : row_major<double>(std::move(f))) {
      const float y = static_cast<float>(x);
      a.f64_inexact |= !(static_cast<double>(y) == x) && !std::isnan(x);
      a.data.push_back(y);
    }
  } else if (t == "<f2") {
    a.stored = Stored::kF16;
    for (uint16_t h : row_major<uint16_t>(std::move(f))) a.data.push_back(f16_bits_to_float(h));
  } else if (two_byte_int && bf16_raw) {
    a.stored = Stored::kBF16Raw;
    for (uint16_t h : row_major<uint16_t>(std::move(f))) a.data.push_back(bf16_bits_to_float(h));
  } else if (two_byte_int) {
    throw NpyError(name + ": dtype '" + t +
                   "' is a 16-bit integer: pass --bf16-raw if it holds bfloat16 bits");
  } else {
    throw NpyError(name + ": unsupported dtype '" + t +
                   "' (use float32, float16, or bfloat16 as float32 or raw 16-bit)");
  }
  return a;
}

void write_array(const std::filesystem::path& path, const std::vector<int64_t>& shape, const float* data,
                 Stored as) {
  std::vector<size_t> sh(shape.begin(), shape.end());
  size_t n = 1;
  for (auto s : sh) n *= s;
  std::string bytes;
  try {
    if (as == Stored::kF32 || as == Stored::kF64) {
      bytes = xt::dump_npy(xt::adapt(data, n, xt::no_ownership(), sh));
    } else {
      std::vector<uint16_t> bits(n);
      for (size_t i = 0; i < n; ++i)
        bits[i] = as == Stored::kF16 ? float_to_f16_bits(data[i]) : float_to_bf16_bits(data[i]);
      bytes = xt::dump_npy(xt::adapt(bits.data(), n, xt::no_ownership(), sh));
      if (as == Stored::kF16) {
        // xtensor names uint16_t '<u2'; the bits are IEEE binary16, so the descr is '<f2' (same length).
        const size_t at = bytes.find("'<u2'");
        if (at == std::string::npos) throw NpyError(path.string() + ": unexpected NPY header from xtensor");
        bytes[at + 2] = 'f';
      }
    }
  } catch (const NpyError&) {
    throw;
  } catch (const std::exception& e) {
    throw NpyError(path.string() + ": cannot encode NPY: " + e.what());
  }
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw NpyError(path.string() + ": cannot write the file");
}

}  // namespace attnfuzz::npy
