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

// xt::detail::load_npy_file with format version 3 as well: version 3 is version 2 with a UTF-8 header
// (numpy's NEP 1 format, used for non-ASCII field names), the same bytes on disk, which xtensor's loader
// refuses ("unsupported file format version"). The dtypes read here have ASCII headers; precheck has
// already vetted the header.
xt::detail::npy_file load_npy_any_version(std::istream& in) {
  unsigned char major = 0, minor = 0;
  xt::detail::read_magic(in, &major, &minor);
  if (major < 1 || major > 3 || minor != 0)
    throw std::runtime_error("unsupported file format version " + std::to_string(major) + "." + std::to_string(minor));
  std::string header = major == 1 ? xt::detail::read_header_1_0(in) : xt::detail::read_header_2_0(in);
  bool fortran_order = false;
  std::string typestr;
  std::vector<std::size_t> shape;
  xt::detail::parse_header(header, typestr, &fortran_order, shape);
  xt::detail::npy_file result(shape, fortran_order, typestr);
  in.read(result.ptr(), std::streamsize(result.n_bytes()));
  return result;
}

[[noreturn]] void bad_header(const std::string& name, const std::string& what) {
  throw NpyError(name + ": bad NPY header: " + what);
}

// Reads and checks the NPY header before xtensor allocates anything: magic, header length, dtype item
// size and every shape dimension (>= 0, at most kMaxNpyElements in all), and that the file holds exactly
// the data the header describes. Memory is then bounded by the file's size.
void precheck(const std::string& name, std::istream& in, uint64_t file_size) {
  char pre[10];
  in.read(pre, sizeof pre);
  if (in.gcount() < 8 || std::memcmp(pre, "\x93NUMPY", 6) != 0)
    bad_header(name, "no NPY magic (\\x93NUMPY) at the start: not an NPY file");
  const int major = static_cast<unsigned char>(pre[6]);
  uint64_t header_len = 0, prefix = 0;
  if (major == 1) {
    if (in.gcount() < 10) bad_header(name, "the file ends inside the header");
    header_len = static_cast<unsigned char>(pre[8]) | static_cast<unsigned char>(pre[9]) << 8;
    prefix = 10;
  } else if (major == 2 || major == 3) {
    char more[2];
    in.read(more, 2);
    if (in.gcount() < 2) bad_header(name, "the file ends inside the header");
    const unsigned char b[4] = {static_cast<unsigned char>(pre[8]), static_cast<unsigned char>(pre[9]),
                                static_cast<unsigned char>(more[0]), static_cast<unsigned char>(more[1])};
    header_len = b[0] | b[1] << 8 | b[2] << 16 | static_cast<uint64_t>(b[3]) << 24;
    prefix = 12;
  } else {
    bad_header(name, "NPY format version " + std::to_string(major) + " is unknown (1, 2 or 3)");
  }
  if (header_len > kMaxNpyHeaderBytes)
    bad_header(name, "header length " + std::to_string(header_len) + " exceeds the limit of " +
                         std::to_string(kMaxNpyHeaderBytes) + " bytes");
  std::string h(static_cast<size_t>(header_len), '\0');
  in.read(h.data(), static_cast<std::streamsize>(header_len));
  if (static_cast<uint64_t>(in.gcount()) < header_len) bad_header(name, "the file ends inside the header");
  // dtype
  const size_t d = h.find("'descr'");
  const size_t q1 = d == std::string::npos ? d : h.find('\'', h.find(':', d));
  const size_t q2 = q1 == std::string::npos ? q1 : h.find('\'', q1 + 1);
  if (q2 == std::string::npos) bad_header(name, "no 'descr' string");
  const std::string descr = h.substr(q1 + 1, q2 - q1 - 1);
  size_t digits = descr.find_first_of("0123456789");
  if (descr.size() < 2 || descr.size() > 4 || digits == std::string::npos ||
      descr.find_first_not_of("0123456789", digits) != std::string::npos)
    throw NpyError(name + ": unsupported dtype '" + descr +
                   "' (use float32, float16, or bfloat16 as float32 or raw 16-bit)");
  const uint64_t item = std::stoull(descr.substr(digits));
  if (item < 1 || item > 16) throw NpyError(name + ": unsupported dtype '" + descr + "'");
  // shape
  const size_t sk = h.find("'shape'");
  const size_t open = sk == std::string::npos ? sk : h.find('(', sk);
  const size_t close = open == std::string::npos ? open : h.find(')', open);
  if (close == std::string::npos) bad_header(name, "no 'shape' tuple");
  std::vector<std::string> dims;
  for (size_t pos = open + 1; pos <= close;) {
    size_t end = h.find(',', pos);
    if (end == std::string::npos || end > close) end = close;
    std::string t = h.substr(pos, end - pos);
    t.erase(0, t.find_first_not_of(" \t"));
    t.erase(t.find_last_not_of(" \tL") + 1);
    if (!t.empty() || end != close) dims.push_back(t);
    pos = end + 1;
  }
  if (!dims.empty() && dims.back().empty()) dims.pop_back();  // "(3,)"
  uint64_t elements = 1;
  std::string shape_str;
  for (size_t i = 0; i < dims.size(); ++i) shape_str += (i ? ", " : "") + dims[i];
  shape_str = "[" + shape_str + "]";
  for (size_t i = 0; i < dims.size(); ++i) {
    const std::string& t = dims[i];
    const std::string which = "shape " + shape_str + ": dimension " + std::to_string(i) + " is " + t;
    if (!t.empty() && t[0] == '-') bad_header(name, which + ": a dimension must be >= 0");
    if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos)
      bad_header(name, which + ": not an integer");
    if (t.size() > 12 || std::stoull(t) > kMaxNpyElements)
      bad_header(name, which + ": more than the limit of " + std::to_string(kMaxNpyElements) + " elements");
    const uint64_t n = std::stoull(t);
    if (n != 0 && elements > kMaxNpyElements / n)
      bad_header(name, "shape " + shape_str + " holds more than the limit of " +
                           std::to_string(kMaxNpyElements) + " elements");
    elements *= n;
  }
  const uint64_t need = elements * item,
                 have = file_size > prefix + header_len ? file_size - prefix - header_len : 0;
  if (have < need)
    throw NpyError(name + ": truncated data: " + std::to_string(have) + " of " + std::to_string(need) +
                   " data bytes for shape " + shape_str + " (" + descr + ")");
  if (have > need)
    throw NpyError(name + ": " + std::to_string(have - need) +
                   " bytes after the data: the header's shape or dtype does not describe the file");
}

}  // namespace

Array read_array(const std::filesystem::path& path, bool bf16_raw) {
  const std::string name = path.string();
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
    throw NpyError(name + ": not a regular file (FIFOs, devices and directories are refused)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NpyError(name + ": cannot open the file");
  const auto file_size = std::filesystem::file_size(path, ec);
  if (ec) throw NpyError(name + ": cannot read the file size");
  precheck(name, in, file_size);
  in.clear();
  in.seekg(0);
  std::optional<xt::detail::npy_file> loaded;
  try {
    loaded.emplace(load_npy_any_version(in));
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
