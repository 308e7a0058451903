// npy_io.cpp - NPY reading and writing with xtensor's xnpy.hpp (data, layout, header writer) and one header
// parse of its own that bounds memory (read_header says why), with one-line errors.
#include "npy/npy_io.h"

#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>
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
    case Stored::kU8:
      return "bool / uint8";
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

[[noreturn]] void bad_header(const std::string& name, const std::string& what) {
  throw NpyError(name + ": bad NPY header: " + what);
}

// What the header says; the stream is left at the first data byte.
struct Header {
  std::string descr;  // "<f4"
  bool fortran_order = false;
  std::vector<size_t> shape;
};

// Reads and checks the NPY header before anything is allocated: magic, version (1, 2 or 3), header length,
// dtype item size, fortran_order and every shape dimension (>= 0, at most kMaxNpyElements in all), and that
// the file holds exactly the data the header describes. Memory is then bounded by the file's size.
//
// This is the one parse of the header; xtensor's (xt::detail::load_npy_file, xnpy.hpp of xtensor 0.24) is not
// used because it falls short here: it refuses format version 3 (version 2 with a UTF-8 header, numpy's
// NEP 1); it reads a dimension with `istream >> size_t`, so "-3" becomes 2^64 - 3, junk becomes 0 and an
// overflow saturates, none of them an error; it allocates the header (up to 4 GiB in version 2) and then
// shape-product x item bytes before reading a byte of data, so a 100-byte file can ask for terabytes; and it
// does not check that the data read was complete. xtensor still holds and reorders the data (npy_file::cast:
// Fortran order to row-major, f16 / bf16 as uint16 bits).
Header read_header(const std::string& name, std::istream& in, uint64_t file_size) {
  Header out;
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
  uint64_t item = 0;
  std::from_chars(descr.data() + digits, descr.data() + descr.size(), item);  // digits only (checked above)
  if (item < 1 || item > 16) throw NpyError(name + ": unsupported dtype '" + descr + "'");
  out.descr = descr;
  // fortran_order
  const size_t fo = h.find("'fortran_order'");
  const size_t colon = fo == std::string::npos ? fo : h.find(':', fo);
  const size_t value = colon == std::string::npos ? colon : h.find_first_not_of(" \t", colon + 1);
  if (value != std::string::npos && h.compare(value, 4, "True") == 0)
    out.fortran_order = true;
  else if (value == std::string::npos || h.compare(value, 5, "False") != 0)
    bad_header(name, "no 'fortran_order' True or False");
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
    uint64_t n = 0;
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), n);  // digits only (checked above)
    if (ec != std::errc() || end != t.data() + t.size() || n > kMaxNpyElements)
      bad_header(name, which + ": more than the limit of " + std::to_string(kMaxNpyElements) + " elements");
    out.shape.push_back(static_cast<size_t>(n));
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
  return out;
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
  Header h = read_header(name, in, file_size);
  xt::detail::npy_file f(h.shape, h.fortran_order, h.descr);  // sizes checked against the file above
  in.read(f.ptr(), static_cast<std::streamsize>(f.n_bytes()));
  if (static_cast<uint64_t>(in.gcount()) != f.n_bytes())  // the file shrank since its size was read
    throw NpyError(name + ": truncated data: " + std::to_string(in.gcount()) + " of " + std::to_string(f.n_bytes()) +
                   " data bytes for shape " + shape_text(std::vector<int64_t>(h.shape.begin(), h.shape.end())) +
                   " (" + h.descr + ")");
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
  } else if (t == "|b1" || t == "|u1") {  // masks: bool or uint8, exact as floats
    a.stored = Stored::kU8;
    for (uint8_t x : row_major<uint8_t>(std::move(f))) a.data.push_back(static_cast<float>(x));
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
  // xtensor's header writer with the dtype named here, then the raw elements: xt::dump_npy takes the descr
  // from the C++ element type, and f16 has none (a uint16_t array is '<u2'; the bits are IEEE binary16, '<f2').
  // bf16 bits stay '<u2' (numpy has no bfloat16: read back with --bf16-raw).
  std::ostringstream bytes;
  try {
    if (as == Stored::kF32 || as == Stored::kF64) {
      xt::detail::write_header(bytes, "<f4", false, sh);
      bytes.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(float)));
    } else {
      std::vector<uint16_t> bits(n);
      for (size_t i = 0; i < n; ++i)
        bits[i] = as == Stored::kF16 ? float_to_f16_bits(data[i]) : float_to_bf16_bits(data[i]);
      xt::detail::write_header(bytes, as == Stored::kF16 ? "<f2" : "<u2", false, sh);
      bytes.write(reinterpret_cast<const char*>(bits.data()), static_cast<std::streamsize>(n * sizeof(uint16_t)));
    }
  } catch (const std::exception& e) {
    throw NpyError(path.string() + ": cannot encode NPY: " + e.what());
  }
  const std::string b = bytes.str();
  std::ofstream out(path, std::ios::binary);
  out.write(b.data(), static_cast<std::streamsize>(b.size()));
  if (!out) throw NpyError(path.string() + ": cannot write the file");
}

}  // namespace attnfuzz::npy
