// npy_io_test.cpp - npy/npy_io.cpp against xtensor: what xtensor's own NPY reader does with the inputs the
// tools refuse (the reasons read_header gives for parsing the header itself), Fortran order, f16 and bf16 bits.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>
#include <xtensor/xadapt.hpp>
#include <xtensor/xnpy.hpp>

#include "npy/npy_io.h"
#include "oracle/lowp.h"

namespace fs = std::filesystem;
using namespace attnfuzz;
using namespace attnfuzz::npy;

namespace {

fs::path tmp(const std::string& name) {
  const fs::path d = fs::path(TEST_TMP) / "npy_io";
  fs::create_directories(d);
  return d / name;
}

// A version-1 NPY file: `dict` (the header's dictionary text) padded to 64 bytes, then `data`.
std::string npy_bytes(std::string dict, const std::string& data, char major = 1) {
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string b = std::string("\x93NUMPY", 6) + major + '\0';
  b += static_cast<char>(dict.size() & 0xff);
  b += static_cast<char>(dict.size() >> 8);
  return b + dict + data;
}

std::string file_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

// xtensor 0.24's header parse reads a dimension with `istream >> size_t`: "-3" wraps and junk reads as 0,
// without an error, so it cannot refuse either with the dimension named (read_header does).
TEST(XtensorNpy, ShapeParseNeitherRefusesANegativeNorAJunkDimension) {
  std::string descr;
  bool fortran = false;
  std::vector<size_t> shape;
  xt::detail::parse_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }\n", descr, &fortran, shape);
  ASSERT_EQ(shape.size(), 2u);
  EXPECT_EQ(shape[1], std::numeric_limits<size_t>::max() - 2);  // 2^64 - 3
  xt::detail::parse_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, abc), }\n", descr, &fortran, shape);
  ASSERT_EQ(shape.size(), 2u);
  EXPECT_EQ(shape[1], 0u);
  for (const char* dims : {"(2, -3)", "(2, abc)"}) {
    const fs::path f = tmp(std::string("dims-") + (dims[4] == '-' ? "neg" : "junk") + ".npy");
    std::ofstream(f, std::ios::binary) << npy_bytes(std::string("{'descr': '<f4', 'fortran_order': False, 'shape': ") +
                                                        dims + ", }",
                                                    std::string(8, '\0'));
    EXPECT_THROW(read_array(f), NpyError) << dims;
  }
}

// xtensor refuses format version 3 (version 2 with a UTF-8 header); read_array reads it (tests/npy/npy_test.cpp).
TEST(XtensorNpy, RefusesFormatVersion3) {
  std::istringstream in(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", std::string(4, '\0'), 3));
  EXPECT_THROW(xt::detail::load_npy_file(in), std::runtime_error);
}

// xt::dump_npy names a uint16_t array '<u2' (the C++ type decides the descr), and its cast refuses to give
// '<f2' elements as uint16_t unless the type check is off: f16 has no C++ type in xtensor.
TEST(XtensorNpy, Float16HasNoTypeOfItsOwn) {
  const std::vector<uint16_t> bits = {0x3c00, 0xc000};
  const std::string dumped = xt::dump_npy(xt::adapt(bits.data(), bits.size(), xt::no_ownership(),
                                                    std::vector<size_t>{2}));
  EXPECT_NE(dumped.find("'<u2'"), std::string::npos) << dumped;
  std::istringstream in(npy_bytes("{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }",
                                  std::string(reinterpret_cast<const char*>(bits.data()), 4)));
  auto f = xt::detail::load_npy_file(in);
  EXPECT_THROW((std::move(f).cast<uint16_t, xt::layout_type::dynamic>(true)), std::runtime_error);
}

TEST(NpyIo, Float16IsWrittenAsF2AndReadBack) {
  const fs::path f = tmp("f16.npy");
  const std::vector<float> x = {1.0f, -2.0f, 0.5f, 65504.0f, -0.0f, 3.0f};
  write_array(f, {2, 3}, x.data(), Stored::kF16);
  EXPECT_NE(file_text(f).find("'descr': '<f2'"), std::string::npos) << file_text(f);
  const Array a = read_array(f);
  EXPECT_EQ(a.stored, Stored::kF16);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.data, x);
}

TEST(NpyIo, Bfloat16BitsAreU2AndReadOnlyAsRawBits) {
  const fs::path f = tmp("bf16.npy");
  const std::vector<float> x = {1.0f, -2.0f, 0.5f, 3.0f};
  write_array(f, {4}, x.data(), Stored::kBF16Raw);
  EXPECT_NE(file_text(f).find("'descr': '<u2'"), std::string::npos) << file_text(f);
  try {
    read_array(f);
    ADD_FAILURE() << "a 16-bit integer array was read as values";
  } catch (const NpyError& e) {
    EXPECT_NE(std::string(e.what()).find("--bf16-raw"), std::string::npos) << e.what();
  }
  const Array a = read_array(f, true);
  EXPECT_EQ(a.stored, Stored::kBF16Raw);
  EXPECT_EQ(a.data, x);
}

// A Fortran-order file (column-major data) is read row-major: xtensor's cast reorders it.
TEST(NpyIo, FortranOrderIsReadRowMajor) {
  const float column_major[6] = {1, 4, 2, 5, 3, 6};  // [[1, 2, 3], [4, 5, 6]]
  const fs::path f = tmp("fortran.npy");
  std::ofstream(f, std::ios::binary) << npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
                                                  std::string(reinterpret_cast<const char*>(column_major), 24));
  const Array a = read_array(f);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.data, (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(NpyIo, Float32WriteMatchesXtensorsDump) {
  const std::vector<float> x = {1.5f, -2.0f, 0.25f, 8.0f, 3.0f, -0.5f};
  const fs::path f = tmp("f32.npy");
  write_array(f, {1, 3, 1, 2}, x.data());
  EXPECT_EQ(file_text(f), xt::dump_npy(xt::adapt(x.data(), x.size(), xt::no_ownership(),
                                                  std::vector<size_t>{1, 3, 1, 2})));
}

}  // namespace
