// case_test.cpp - test cases: RNG determinism, value distributions, special-value placement, sweep grid.
#include "attnfuzz/case.h"
#include "text_case.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <set>

namespace attnfuzz {
namespace {

// Pinned generator outputs (see Rng.PinnedOutputs and Generate.PinnedFirstValues).
constexpr uint64_t kPinned0 = 0xb29fc7d8b9534275ull, kPinned1 = 0x98ace2b4ad35e046ull,
                   kPinned2 = 0x55baa89b62247299ull;
constexpr uint32_t kPinnedQ0 = 0x3d18c22bu, kPinnedQ1 = 0x3f377df3u;

Case small_case(const std::string& mask = "causal-br", int64_t sq = 13, int64_t sk = 29, uint64_t seed = 7) {
  Case c = make_case(make_problem(2, 4, 2, sq, sk, 19, 11), seed);
  EXPECT_EQ(parse_mask(mask, c.problem), "");
  return c;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

SpecialValue special(const std::string& text) {
  SpecialValue s;
  EXPECT_EQ(parse_special(text, s), "") << text;
  return s;
}

TEST(Rng, PinnedOutputs) {
  // The generator is part of the case format: a corpus file replays only while these stay the same.
  Rng a(0, 0), b(0, 0), c(1, 0), d(0, 1);
  const uint64_t first = a.next();
  EXPECT_EQ(first, b.next());
  EXPECT_NE(first, c.next());
  EXPECT_NE(first, d.next());
  uint64_t x = 0;
  EXPECT_EQ(splitmix64(x), 0xe220a8397b1dcdafull);  // reference splitmix64 output for state 0
  Rng pinned(42, 3);
  std::vector<uint64_t> got;
  for (int i = 0; i < 3; ++i) got.push_back(pinned.next());
  // Regenerate with: Rng(42, 3).next() x3. Changing these values breaks every saved corpus file.
  const std::vector<uint64_t> want = {kPinned0, kPinned1, kPinned2};
  EXPECT_EQ(got, want);
}

TEST(Rng, UniformAndBelowRanges) {
  Rng r(123);
  for (int i = 0; i < 10000; ++i) {
    const double u = r.uniform01();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ASSERT_LT(r.below(7), 7u);
  }
  EXPECT_EQ(r.below(1), 0u);
  double sum = 0, sum2 = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double z = r.normal();
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sum2 += z * z;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.05);
  EXPECT_NEAR(sum2 / n, 1.0, 0.05);
}

TEST(Generate, SameSeedSameBits) {
  Case c = small_case();
  c.values.specials = {special("nan@k:masked*3"), special("subnormal@v:random*5")};
  for (Distribution d : {Distribution::kUniform, Distribution::kNormal, Distribution::kExtreme}) {
    c.values.dist = {d, 3.0};
    const Tensors a = generate(c), b = generate(c);
    EXPECT_TRUE(same_bits(a.q, b.q));
    EXPECT_TRUE(same_bits(a.k, b.k));
    EXPECT_TRUE(same_bits(a.v, b.v));
    EXPECT_EQ(a.placed.size(), b.placed.size());
    EXPECT_EQ(a.q.size(), static_cast<size_t>(q_elements(c.problem)));
    EXPECT_EQ(a.k.size(), static_cast<size_t>(k_elements(c.problem)));
    EXPECT_EQ(a.v.size(), static_cast<size_t>(v_elements(c.problem)));
  }
}

TEST(Generate, PinnedFirstValues) {
  // uniform values are exact double arithmetic on the RNG's bits: pin a few so a change is noticed.
  Case c = make_case(make_problem(1, 1, 1, 2, 2, 2, 2), 1);
  const Tensors t = generate(c);
  const uint32_t want[] = {kPinnedQ0, kPinnedQ1};
  EXPECT_EQ(std::bit_cast<uint32_t>(t.q[0]), want[0]);
  EXPECT_EQ(std::bit_cast<uint32_t>(t.q[1]), want[1]);
}

TEST(Generate, DifferentSeedsDiffer) {
  Case a = small_case(), b = small_case();
  b.seed = a.seed + 1;
  const Tensors ta = generate(a), tb = generate(b);
  EXPECT_FALSE(same_bits(ta.q, tb.q));
  EXPECT_FALSE(same_bits(ta.k, tb.k));
  EXPECT_FALSE(same_bits(ta.v, tb.v));
}

TEST(Generate, TensorsUseIndependentStreams) {
  Case a = small_case();
  const Tensors base = generate(a);
  // q, k and v differ from each other (not one stream restarted).
  EXPECT_NE(std::bit_cast<uint32_t>(base.q[0]), std::bit_cast<uint32_t>(base.k[0]));
  EXPECT_NE(std::bit_cast<uint32_t>(base.k[0]), std::bit_cast<uint32_t>(base.v[0]));
  // Adding specials changes exactly the placed elements.
  a.values.specials = {special("inf@v:visible*4")};
  const Tensors with = generate(a);
  std::set<int64_t> placed;
  for (const PlacedSpecial& p : with.placed) placed.insert(p.index);
  EXPECT_TRUE(same_bits(base.q, with.q));
  EXPECT_TRUE(same_bits(base.k, with.k));
  for (size_t i = 0; i < base.v.size(); ++i) {
    if (placed.count(static_cast<int64_t>(i)))
      EXPECT_TRUE(std::isinf(with.v[i]));
    else
      EXPECT_EQ(std::bit_cast<uint32_t>(base.v[i]), std::bit_cast<uint32_t>(with.v[i])) << i;
  }
}

TEST(Generate, DistributionRanges) {
  Case c = small_case("none");
  c.values.dist = {Distribution::kUniform, 2.5};
  Tensors t = generate(c);
  for (const auto* buf : {&t.q, &t.k, &t.v})
    for (float x : *buf) ASSERT_LE(std::fabs(x), 2.5f);
  c.values.dist = {Distribution::kNormal, 0.01};
  t = generate(c);
  double s2 = 0;
  for (float x : t.q) s2 += double(x) * x;
  EXPECT_NEAR(std::sqrt(s2 / t.q.size()), 0.01, 0.002);
}

TEST(Generate, ExtremeReachesTheAskedScoreMagnitude) {
  for (double mag : {1.0, 30.0, 1000.0}) {
    Case c = make_case(make_problem(1, 1, 1, 64, 64, 64, 64), 99);
    c.values.dist = {Distribution::kExtreme, mag};
    const Tensors t = generate(c);
    const Problem& p = c.problem;
    double s2 = 0, vmax = 0;
    for (int64_t i = 0; i < p.seq_q; ++i)
      for (int64_t j = 0; j < p.seq_k; ++j) {
        double s = 0;
        for (int64_t d = 0; d < p.head_dim; ++d)
          s += double(t.q[q_index(p, 0, i, 0, d)]) * t.k[k_index(p, 0, j, 0, d)];
        s *= p.scale;
        s2 += s * s;
      }
    for (float v : t.v) vmax = std::max(vmax, double(std::fabs(v)));
    EXPECT_NEAR(std::sqrt(s2 / (p.seq_q * p.seq_k)) / mag, 1.0, 0.15) << mag;
    EXPECT_LE(vmax, 1.0);
  }
}

TEST(Generate, StrideGapsArePoisoned) {
  Case c = make_case(make_problem(1, 2, 1, 5, 6, 8, 8), 3);
  Problem& p = c.problem;
  p.q_stride[2] = 10;  // 2 padding elements after each head row
  p.q_stride[1] = 2 * 10;
  p.q_stride[0] = 5 * 20;
  ASSERT_EQ(validate(c), "");
  const Tensors t = generate(c);
  std::vector<bool> addressed(t.q.size(), false);
  for (int64_t s = 0; s < p.seq_q; ++s)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t d = 0; d < p.head_dim; ++d) addressed[q_index(p, 0, s, h, d)] = true;
  int gaps = 0;
  for (size_t i = 0; i < t.q.size(); ++i) {
    if (addressed[i]) {
      EXPECT_TRUE(std::isfinite(t.q[i]));
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(t.q[i]), kStrideGapBits);
      ++gaps;
    }
  }
  EXPECT_GT(gaps, 0);
}

TEST(Specials, KindsHaveTheirBits) {
  Case c = small_case("none");
  c.values.specials = {special("nan@q*2"),        special("inf@k"),    special("-inf@v"),
                       special("subnormal@q*20"), special("huge@k*4"), special("-0@v*3")};
  const Tensors t = generate(c);
  ASSERT_EQ(t.unplaced, 0);
  ASSERT_EQ(t.placed.size(), 2u + 1 + 1 + 20 + 4 + 3);
  for (const PlacedSpecial& ps : t.placed) {
    const std::vector<float>& buf = ps.tensor == Tensor::kQ ? t.q : ps.tensor == Tensor::kK ? t.k : t.v;
    const uint32_t bits = std::bit_cast<uint32_t>(buf[ps.index]);
    switch (ps.kind) {
      case SpecialKind::kNaN:
        EXPECT_EQ(bits, 0x7fc00000u);
        break;
      case SpecialKind::kPosInf:
        EXPECT_EQ(bits, 0x7f800000u);
        break;
      case SpecialKind::kNegInf:
        EXPECT_EQ(bits, 0xff800000u);
        break;
      case SpecialKind::kSubnormal:
        EXPECT_EQ(bits & 0x7f800000u, 0u);
        EXPECT_NE(bits & 0x007fffffu, 0u);
        break;
      case SpecialKind::kHuge:
        EXPECT_EQ(bits & 0x7fffffffu, 0x7f7fffffu);
        break;
      case SpecialKind::kNegZero:
        EXPECT_EQ(bits, 0x80000000u);
        break;
    }
  }
}

// For every mask form and a few shapes, placements land where they were asked to.
TEST(Specials, PlacementHonoursTheMask) {
  const std::pair<int64_t, int64_t> shapes[] = {{13, 29}, {29, 13}, {16, 16}, {40, 9}, {1, 7}};
  for (const std::string& mask : space::mask_forms())
    for (auto [sq, sk] : shapes) {
      Case c = small_case(mask, sq, sk, 11);
      const Problem& p = c.problem;
      const std::vector<int64_t> count = key_visibility_counts(p);
      for (const char* tensor : {"q", "k", "v"})
        for (const char* where : {"visible", "masked", "hidden", "random"}) {
          c.values.specials = {special(std::string("nan@") + tensor + ":" + where + "*6")};
          const Tensors t = generate(c);
          const std::string ctx =
              mask + " " + std::to_string(sq) + "x" + std::to_string(sk) + " " + tensor + ":" + where;
          // Count the positions that qualify, to know whether placement was possible.
          int64_t candidates = 0;
          const bool is_q = tensor[0] == 'q';
          const int64_t n = is_q ? sq : sk;
          auto qualifies = [&](int64_t s) {
            const std::string w = where;
            if (is_q) {
              const bool masked_row = visible_keys(p, s).empty();
              return w == "random" || (w == "visible" ? !masked_row : masked_row);
            }
            if (w == "visible") return count[s] > 0;
            if (w == "masked") return count[s] < sq;
            if (w == "hidden") return count[s] == 0;
            return true;
          };
          for (int64_t s = 0; s < n; ++s) candidates += qualifies(s);
          if (candidates == 0) {
            EXPECT_EQ(t.unplaced, 6) << ctx;
            EXPECT_TRUE(t.placed.empty()) << ctx;
            continue;
          }
          EXPECT_EQ(t.unplaced, 0) << ctx;
          ASSERT_EQ(t.placed.size(), 6u) << ctx;
          for (const PlacedSpecial& ps : t.placed) {
            EXPECT_TRUE(qualifies(ps.s)) << ctx << " s=" << ps.s;
            // Cross-check with visible(): a masked key really is masked for some row, a hidden one for all.
            if (!is_q && std::string(where) != "random") {
              int64_t seen = 0;
              for (int64_t i = 0; i < sq; ++i) seen += visible(p, i, ps.s);
              EXPECT_EQ(seen, count[ps.s]) << ctx;
            }
            const std::vector<float>& buf = is_q ? t.q : tensor[0] == 'k' ? t.k : t.v;
            EXPECT_TRUE(std::isnan(buf[ps.index])) << ctx;
          }
        }
    }
}

TEST(Specials, AtPlacesExactly) {
  Case c = small_case();
  c.values.specials = {special("-inf@v:at=1,1,28,10"), special("nan@q:at=3,7")};
  const Tensors t = generate(c);
  ASSERT_EQ(t.placed.size(), 2u);
  EXPECT_EQ(t.placed[0].index, v_index(c.problem, 1, 28, 1, 10));
  EXPECT_EQ(t.v[v_index(c.problem, 1, 28, 1, 10)], -INFINITY);
  EXPECT_TRUE(std::isnan(t.q[q_index(c.problem, 0, 3, 0, 7)]));
  c.values.specials = {special("nan@v:at=0,0,29,0")};  // Sk = 29: out of range
  EXPECT_NE(validate(c), "");
  EXPECT_THROW(generate(c), std::invalid_argument);
}

TEST(Specials, ZeroKeysPlacesNothingInKOrV) {
  Case c = make_case(make_problem(1, 1, 1, 5, 0, 8, 8), 1);
  c.values.specials = {special("nan@k*3"), special("nan@q:masked")};
  const Tensors t = generate(c);
  EXPECT_EQ(t.unplaced, 3);
  EXPECT_EQ(t.placed.size(), 1u);  // every row is fully masked when Sk = 0
  EXPECT_TRUE(t.k.empty());
}

TEST(Text, DistributionRoundTrip) {
  for (const char* s : {"uniform:1", "uniform:0.25", "normal:0.001", "extreme:88", "extreme:1e+30"}) {
    ValueDist d;
    ASSERT_EQ(parse_distribution(s, d), "") << s;
    EXPECT_EQ(to_string(d), s);
  }
  ValueDist d;
  EXPECT_EQ(parse_distribution("uniform", d), "");
  EXPECT_EQ(to_string(d), "uniform:1");
  for (const char* bad :
       {"", "extreme", "uniform:0", "uniform:-1", "normal:x", "gauss:1", "uniform:inf", "uniform:nan"})
    EXPECT_NE(parse_distribution(bad, d), "") << bad;
}

TEST(Text, SpecialRoundTrip) {
  for (const char* s : {"nan@k:masked", "inf@v:visible*3", "-inf@q:at=0,1,5,3", "subnormal@v:random*64",
                        "huge@k:hidden*2", "-0@q:random*0"}) {
    SpecialValue v;
    ASSERT_EQ(parse_special(s, v), "") << s;
    EXPECT_EQ(to_string(v), s);
  }
  SpecialValue v;
  ASSERT_EQ(parse_special("nan", v), "");
  EXPECT_EQ(to_string(v), "nan@k:random");
  ASSERT_EQ(parse_special("+inf@q:at=4,2", v), "");
  EXPECT_EQ(to_string(v), "inf@q:at=0,0,4,2");
  for (const char* bad : {"", "nan@x", "nan:somewhere", "nan*-1", "nan*", "zero@k", "nan@k:at=1",
                          "nan@k:at=1,2,3", "nan@k:at=a,b"})
    EXPECT_NE(parse_special(bad, v), "") << bad;
}

TEST(Text, DescribeIsOneReadableLine) {
  Case c = small_case("window:4,2-tl");
  c.values.dist = {Distribution::kExtreme, 30};
  c.values.specials = {special("nan@k:masked*2")};
  c.seed = 42;
  const std::string s = describe(c);
  EXPECT_EQ(s.find('\n'), std::string::npos);
  for (const char* part : {"Sq=13", "Sk=29", "mask=window:4,2-tl", "values=extreme:30",
                           "special=nan@k:masked*2", "seed=0x000000000000002a"})
    EXPECT_NE(s.find(part), std::string::npos) << part << " in " << s;
}

TEST(Validate, RejectsBadCases) {
  Case c = small_case();
  EXPECT_EQ(validate(c), "");
  c.values.dist.param = 0;
  EXPECT_NE(validate(c), "");
  c = small_case();
  c.values.specials = {special("nan@k")};
  c.values.specials[0].count = -1;
  EXPECT_NE(validate(c), "");
  c = small_case();
  c.problem.heads_kv = 3;
  EXPECT_NE(validate(c), "");
  c = small_case();
  c.explicit_values = ExplicitValues{};
  EXPECT_NE(validate(c), "");
  EXPECT_THROW(generate(c), std::invalid_argument);
}

TEST(Generate, ExplicitValuesAreReturnedVerbatim) {
  Case c = small_case();
  const Tensors base = generate(c);
  ExplicitValues e{base.q, base.k, base.v};
  e.q[0] = std::bit_cast<float>(0x7fa00001u);  // a signalling NaN payload survives
  c.explicit_values = e;
  c.values.specials = {special("inf@q*100")};  // ignored: explicit values are the input
  const Tensors t = generate(c);
  EXPECT_TRUE(same_bits(t.q, e.q));
  EXPECT_TRUE(same_bits(t.k, e.k));
  EXPECT_TRUE(t.placed.empty());
}

TEST(KeyVisibility, MatchesBruteForce) {
  for (const std::string& mask : space::mask_forms())
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{7, 13}, {13, 7}, {1, 1}, {20, 3}}) {
      Case c = small_case(mask, sq, sk);
      const auto count = key_visibility_counts(c.problem);
      for (int64_t j = 0; j < sk; ++j) {
        int64_t n = 0;
        for (int64_t i = 0; i < sq; ++i) n += visible(c.problem, i, j);
        EXPECT_EQ(count[j], n) << mask;
      }
    }
}

TEST(Space, EdgeValues) {
  const auto lens = space::edge_seq_lengths(130);
  for (int64_t want : {1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129})
    EXPECT_TRUE(std::count(lens.begin(), lens.end(), want)) << want;
  EXPECT_TRUE(std::is_sorted(lens.begin(), lens.end()));
  EXPECT_LE(lens.back(), 130);
  const auto dims = space::edge_head_dims(128);
  for (int64_t want : {1, 3, 59, 63, 64, 65, 111, 128})
    EXPECT_TRUE(std::count(dims.begin(), dims.end(), want)) << want;
  for (auto [hq, hkv] : space::head_configs()) EXPECT_EQ(hq % hkv, 0);
  for (const std::string& m : space::mask_forms()) {
    Problem p = make_problem(1, 1, 1, 1, 1, 1, 1);
    EXPECT_EQ(parse_mask(m, p), "") << m;
    EXPECT_EQ(mask_to_string(p), m);
  }
  EXPECT_FALSE(space::extreme_magnitudes().empty());
  EXPECT_EQ(space::special_kinds().size(), 6u);
}

TEST(SweepGrid, CoversTheEdgesAndIsStable) {
  const std::vector<Case> grid = sweep_grid();
  EXPECT_GE(grid.size(), 60u);
  EXPECT_LE(grid.size(), 150u);
  std::set<std::string> labels;
  std::set<uint64_t> seeds;
  bool one_by_one = false, seven_13 = false, thirteen_7 = false, gqa = false, mqa = false, empty_k = false,
       odd_d = false, dv_ne_d = false, masked_rows = false, tl = false, window = false;
  for (const Case& c : grid) {
    const Problem& p = c.problem;
    EXPECT_EQ(validate(c), "") << c.label;
    EXPECT_TRUE(labels.insert(c.label).second) << "duplicate label " << c.label;
    EXPECT_EQ(c.label.find_first_of(":,/ "), std::string::npos) << c.label;
    seeds.insert(c.seed);
    const Tensors t = generate(c);
    EXPECT_EQ(t.unplaced, 0) << c.label << ": a special value found no position";
    one_by_one |= p.seq_q == 1 && p.seq_k == 1;
    seven_13 |= p.seq_q == 7 && p.seq_k == 13;
    thirteen_7 |= p.seq_q == 13 && p.seq_k == 7;
    gqa |= p.heads_kv > 1 && p.heads_q > p.heads_kv;
    mqa |= p.heads_kv == 1 && p.heads_q > 1;
    empty_k |= p.seq_k == 0;
    odd_d |= p.head_dim % 2 == 1 && p.head_dim > 1;
    dv_ne_d |= p.head_dim != p.head_dim_v;
    tl |= p.mask_kind != AF_MASK_NONE && p.mask_align == AF_ALIGN_TOP_LEFT;
    window |= p.mask_kind == AF_MASK_WINDOW;
    for (int64_t i = 0; i < p.seq_q && p.seq_k > 0; ++i) masked_rows |= visible_keys(p, i).empty();
  }
  EXPECT_EQ(seeds.size(), grid.size());
  EXPECT_TRUE(one_by_one && seven_13 && thirteen_7 && gqa && mqa && empty_k && odd_d && dv_ne_d &&
              masked_rows && tl && window);
  for (int64_t t : space::tile_sizes())
    for (int64_t s : {t - 1, t, t + 1}) {
      bool found = false;
      for (const Case& c : grid) found |= c.problem.seq_q == s && c.problem.seq_k == s;
      EXPECT_TRUE(found) << s;
    }
  // Same grid every call; a different base seed changes seeds only.
  const std::vector<Case> again = sweep_grid(), other = sweep_grid(5);
  ASSERT_EQ(again.size(), grid.size());
  for (size_t i = 0; i < grid.size(); ++i) {
    EXPECT_EQ(describe(again[i]), describe(grid[i]));
    EXPECT_EQ(other[i].label, grid[i].label);
    EXPECT_NE(other[i].seed, grid[i].seed);
  }
}

TEST(Hash, StableAndSensitive) {
  EXPECT_EQ(hash64("abc"), hash64("abc"));
  EXPECT_NE(hash64("abc"), hash64("abd"));
  EXPECT_NE(hash64(""), 0u);
}

// Outputs must not alias themselves (a correct kernel writing two elements to one address looks racy);
// inputs may alias; padded, permuted and non-nested but injective layouts are fine.
TEST(Validate, OutputStridesMustNotOverlap) {
  Problem p = make_problem(2, 3, 3, 5, 7, 4, 4);
  EXPECT_EQ(validate(p), "");
  Problem o = p;
  o.o_stride[0] = 0, o.o_stride[1] = 1, o.o_stride[2] = 0;
  EXPECT_NE(validate(o).find("o strides [0, 1, 0] overlap"), std::string::npos) << validate(o);
  o = p;
  o.o_stride[2] = 3;  // heads step 3 < Dv = 4: neighbouring heads share an element
  EXPECT_NE(validate(o).find("overlap"), std::string::npos);
  Problem l = p;
  l.lse_stride[2] = 0;
  EXPECT_NE(validate(l).find("lse strides"), std::string::npos);
  Problem in = p;
  in.k_stride[0] = 0;  // every batch reads the same keys: allowed
  in.v_stride[1] = 0;
  EXPECT_EQ(validate(in), "");
  Problem pad = p;  // padded rows and heads-major order
  pad.o_stride[2] = 4 * 5 + 3, pad.o_stride[1] = 4, pad.o_stride[0] = 3 * (4 * 5 + 3);
  EXPECT_EQ(validate(pad), "");
  Problem odd =
      make_problem(1, 3, 3, 2, 2, 1, 1);  // offsets s*3 + h*2: {0, 2, 4, 3, 5, 7}: not nested, injective
  odd.o_stride[1] = 3, odd.o_stride[2] = 2, odd.o_stride[0] = 100;
  EXPECT_EQ(validate(odd), "");
  Problem clash =
      make_problem(1, 3, 3, 4, 2, 1, 1);  // s*2 + h*3 over s < 4, h < 3: (3, 0) and (0, 2) meet at 6
  clash.o_stride[1] = 2, clash.o_stride[2] = 3, clash.o_stride[0] = 100;
  EXPECT_NE(validate(clash).find("overlap"), std::string::npos);
}

// ---- backward cases (issue 14) ----

TEST(BackwardCase, DoutHasItsOwnStreamAndQkvKeepTheirBits) {
  Case fwd = small_case();
  Case bwd = fwd;
  bwd.pass = Pass::kBwd;
  const Tensors a = generate(fwd), b = generate(bwd);
  EXPECT_TRUE(same_bits(a.q, b.q) && same_bits(a.k, b.k) && same_bits(a.v, b.v));
  EXPECT_TRUE(a.dout.empty());
  ASSERT_EQ(b.dout.size(), static_cast<size_t>(o_elements(bwd.problem)));
  for (float x : b.dout) EXPECT_TRUE(x >= -1.0f && x <= 1.0f) << x;
  // Deterministic, and the fwd+bwd pass draws the same dO.
  Case fb = fwd;
  fb.pass = Pass::kFwdBwd;
  EXPECT_TRUE(same_bits(generate(bwd).dout, b.dout));
  EXPECT_TRUE(same_bits(generate(fb).dout, b.dout));
  // Another seed, another dO.
  bwd.seed = 8;
  EXPECT_FALSE(same_bits(generate(bwd).dout, b.dout));
}

TEST(BackwardCase, PassTextDescribeAndValidate) {
  Pass p = Pass::kFwd;
  EXPECT_EQ(parse_pass("bwd", p), "");
  EXPECT_EQ(p, Pass::kBwd);
  EXPECT_EQ(parse_pass("fwd+bwd", p), "");
  EXPECT_EQ(p, Pass::kFwdBwd);
  EXPECT_STREQ(pass_name(p), "fwdbwd");
  EXPECT_NE(parse_pass("backward", p), "");
  Case c = small_case();
  EXPECT_EQ(describe(c).find("pass="), std::string::npos);  // forward text unchanged
  c.pass = Pass::kBwd;
  EXPECT_NE(describe(c).find(" pass=bwd"), std::string::npos);
  // Explicit dO: the o size, and only for a backward case.
  ExplicitValues e{generate(c).q, generate(c).k, generate(c).v, std::vector<float>(3, 0.5f)};
  c.explicit_values = e;
  EXPECT_NE(validate(c).find("dO"), std::string::npos);
  c.explicit_values->dout.assign(static_cast<size_t>(o_elements(c.problem)), 0.25f);
  EXPECT_EQ(validate(c), "");
  EXPECT_EQ(generate(c).dout, c.explicit_values->dout);
  c.pass = Pass::kFwd;
  EXPECT_NE(validate(c), "");
}

TEST(BackwardCase, SweepGridWithAPassKeepsLabelsAndSeeds) {
  const auto fwd = sweep_grid(3), bwd = sweep_grid(3, ValueDomain::kIeee, AF_DTYPE_F32, Pass::kBwd);
  ASSERT_EQ(fwd.size(), bwd.size());
  for (size_t i = 0; i < fwd.size(); ++i) {
    EXPECT_EQ(fwd[i].label, bwd[i].label);
    EXPECT_EQ(fwd[i].seed, bwd[i].seed);
    EXPECT_EQ(fwd[i].pass, Pass::kFwd);
    EXPECT_EQ(bwd[i].pass, Pass::kBwd);
  }
}

// reshape_problem (core/problem.cpp): another shape, and with the head-count overload other heads, keeping what
// the kernel is asked to do: scale, mask, dtype, fp8 scales and tunables (the properties' single (b, h) slice and
// the tail detector's paddings rely on it).
TEST(Reshape, KeepsScaleMaskDtypeScalesAndTunables) {
  Problem p = make_problem(2, 4, 2, 9, 13, 16, 8);
  ASSERT_EQ(parse_mask("window:3,1-br", p), "");
  p.scale = 0.3f;
  p.dtype = AF_DTYPE_FP8_E4M3;
  p.q_descale = 0.5f, p.k_descale = 2.0f, p.v_descale = 0.25f, p.o_scale = 4.0f;
  p.tunables[0] = 3, p.tunables[1] = 7;
  for (const Problem& v : {reshape_problem(p, 1, 1, 1, 9, 13, 16, 8), reshape_problem(p, 3, 20, 21, 32, 16)}) {
    EXPECT_EQ(v.scale, 0.3f);
    EXPECT_EQ(v.mask_kind, p.mask_kind);
    EXPECT_EQ(v.mask_align, p.mask_align);
    EXPECT_EQ(v.window_left, 3);
    EXPECT_EQ(v.window_right, 1);
    EXPECT_EQ(v.dtype, AF_DTYPE_FP8_E4M3);
    EXPECT_EQ(v.q_descale, 0.5f);
    EXPECT_EQ(v.k_descale, 2.0f);
    EXPECT_EQ(v.v_descale, 0.25f);
    EXPECT_EQ(v.o_scale, 4.0f);
    EXPECT_EQ(v.tunables[0], 3);
    EXPECT_EQ(v.tunables[1], 7);
  }
  const Problem one = reshape_problem(p, 1, 1, 1, 9, 13, 16, 8);
  EXPECT_EQ(one.batch, 1);
  EXPECT_EQ(one.heads_q, 1);
  EXPECT_EQ(one.heads_kv, 1);
  EXPECT_EQ(one.q_stride[1], 16);  // dense, contiguous for the new heads
  const Problem same_heads = reshape_problem(p, 3, 20, 21, 32, 16);
  EXPECT_EQ(same_heads.heads_q, 4);
  EXPECT_EQ(same_heads.heads_kv, 2);
  EXPECT_EQ(same_heads.seq_q, 20);
  EXPECT_EQ(same_heads.head_dim_v, 16);
}

}  // namespace
}  // namespace attnfuzz

// Issue 30 item 2: input tiers, least unusual first.
namespace attnfuzz {
namespace {
Case tier_case(const char* mask, const char* dist, const char* special) {
  return test_util::text_case(make_problem(1, 1, 1, 8, 8, 16, 16), mask, dist, special, 3);
}
TEST(InputTier, OrdinaryExtremeAndWhereTheNaNSits) {
  EXPECT_EQ(input_tier(tier_case("causal-br", "uniform:1", "")), InputTier::kOrdinary);
  EXPECT_EQ(input_tier(tier_case("none", "normal:3", "-0@k")), InputTier::kOrdinary);
  EXPECT_EQ(input_tier(tier_case("none", "extreme:30", "")), InputTier::kExtreme);
  EXPECT_EQ(input_tier(tier_case("none", "uniform:1", "huge@k")), InputTier::kExtreme);
  Case neg = tier_case("none", "uniform:1", "");
  neg.problem.scale = -0.25f;
  EXPECT_EQ(input_tier(neg), InputTier::kExtreme);
  // causal-br 8x8: key 7 is seen by row 7 only (masked for the others), key 0 by every row.
  EXPECT_EQ(input_tier(tier_case("causal-br", "uniform:1", "nan@k:at=7,0")), InputTier::kNonFiniteMasked);
  EXPECT_EQ(input_tier(tier_case("causal-br", "uniform:1", "nan@k:at=0,0")), InputTier::kNonFiniteVisible);
  EXPECT_EQ(input_tier(tier_case("none", "uniform:1", "inf@q")), InputTier::kNonFiniteVisible);
  EXPECT_EQ(input_tier(tier_case("causal-br", "uniform:1", "nan@v:hidden")), InputTier::kOrdinary);  // no hidden key
  EXPECT_STREQ(input_tier_name(InputTier::kNonFiniteMasked), "non-finite-masked");
}

// Issue 28: the tiers read visibility through the one rule (key_visible): a NaN at a key that only the custom
// mask (dense, bits, or an empty block) hides is masked, as is q of a row the custom mask leaves without
// keys; a key the custom mask shows to every row stays visible. Given masks over mask none, B = 1, Hq = 2,
// Hkv = 1, 4 x 4.
TEST(InputTier, TheCustomMasksHideNaNsToo) {
  auto masked = [](uint32_t bits, std::vector<uint8_t> mask, const char* special) {
    Case c = tier_case("none", "uniform:1", special);
    c.problem = make_problem(1, 2, 1, 4, 4, 16, 16);
    EXPECT_EQ(set_mask_variants(c, bits, "ones", "full", "", 2, 2), "");
    (bits & AF_VARIANT_BLOCK_SPARSE ? c.variants.block_mask : c.variants.custom_mask) = std::move(mask);
    EXPECT_EQ(validate(c), "");
    return input_tier(c);
  };
  // Dense [2 heads, 4 rows, 4 keys]: key 3 hidden from head 1's row 2 only; head 0's row 0 sees nothing.
  std::vector<uint8_t> dense(32, 1);
  dense[1 * 16 + 2 * 4 + 3] = 0;
  for (int j = 0; j < 4; ++j) dense[j] = 0;
  EXPECT_EQ(masked(AF_VARIANT_MASK_DENSE, dense, "nan@k:at=3,0"), InputTier::kNonFiniteMasked);
  EXPECT_EQ(masked(AF_VARIANT_MASK_DENSE, dense, "nan@v:at=3,0"), InputTier::kNonFiniteMasked);
  EXPECT_EQ(masked(AF_VARIANT_MASK_DENSE, dense, "inf@q:at=0,0"), InputTier::kNonFiniteMasked);  // no keys
  EXPECT_EQ(masked(AF_VARIANT_MASK_DENSE, dense, "inf@q:at=0,1,0,0"), InputTier::kNonFiniteVisible);  // h 1
  std::vector<uint8_t> ones(32, 1);
  EXPECT_EQ(masked(AF_VARIANT_MASK_DENSE, ones, "nan@k:at=3,0"), InputTier::kNonFiniteVisible);
  // Bits (one byte per row, bit j = key j): key 1 hidden from head 0's row 3.
  std::vector<uint8_t> bits(8, 0x0f);
  bits[3] = 0x0d;
  EXPECT_EQ(masked(AF_VARIANT_MASK_BITS, bits, "nan@k:at=1,0"), InputTier::kNonFiniteMasked);
  EXPECT_EQ(masked(AF_VARIANT_MASK_BITS, bits, "nan@k:at=2,0"), InputTier::kNonFiniteVisible);
  // Block-sparse 2 x 2 blocks [2 heads, 2 x 2]: head 1's query block 1 x key block 0 empty hides keys 0, 1.
  std::vector<uint8_t> blocks(8, kBlockFull);
  blocks[1 * 4 + 1 * 2 + 0] = kBlockEmpty;
  EXPECT_EQ(masked(AF_VARIANT_BLOCK_SPARSE, blocks, "nan@k:at=1,0"), InputTier::kNonFiniteMasked);
  EXPECT_EQ(masked(AF_VARIANT_BLOCK_SPARSE, blocks, "nan@k:at=2,0"), InputTier::kNonFiniteVisible);
}

// Explicit values (a minimized case): a visible logit |scale q.k| above 50 is extreme, as extreme:MAG is; a logit of
// that size a row must not see is not.
TEST(InputTier, ExplicitValuesWithHugeVisibleLogitsAreExtreme) {
  auto explicit_case = [](float q, float k1, const char* mask) {
    Case c = test_util::text_case(make_problem(1, 1, 1, 1, 2, 1, 1), mask);
    c.problem.scale = 1;
    c.explicit_values = ExplicitValues{{q}, {1.0f, k1}, {1.0f, 1.0f}, {}};
    return c;
  };
  EXPECT_EQ(input_tier(explicit_case(2, 3, "none")), InputTier::kOrdinary);     // logits 2, 6
  EXPECT_EQ(input_tier(explicit_case(9.5f, 9.5f, "none")), InputTier::kExtreme);  // 90.25
  EXPECT_EQ(input_tier(explicit_case(2, 40, "causal-tl")), InputTier::kOrdinary);  // 80, but key 1 is masked
  Case custom = explicit_case(2, 40, "none");  // 80 at key 1, which only the custom mask hides (issue 28)
  ASSERT_EQ(set_mask_variants(custom, AF_VARIANT_MASK_DENSE), "");
  custom.variants.custom_mask = {1, 0};
  EXPECT_EQ(input_tier(custom), InputTier::kOrdinary);
  custom.variants.custom_mask = {1, 1};
  EXPECT_EQ(input_tier(custom), InputTier::kExtreme);
}

// MLA's shared K/V latent (issue 28 item 5, docs/semantics.md "Shared K/V latent"): the case model.
TEST(KvShared, StridesValidityAndGeneratedView) {
  Case c = make_case(make_problem(2, 4, 2, 3, 9, 12, 8), 5);
  ASSERT_EQ(set_variants(c, AF_VARIANT_KV_SHARED), "");
  const Problem& p = c.problem;
  EXPECT_TRUE(kv_shared(p));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(p.v_stride[i], p.k_stride[i]);
  EXPECT_EQ(validate(c), "");
  EXPECT_NE(describe(c).find("variants=kv-shared"), std::string::npos) << describe(c);
  // V is K's first Dv columns, specials of V included (written into K).
  c.values.specials.push_back({SpecialKind::kNaN, Tensor::kV, Placement::kAt, 1, 1, 1, 4, 1});
  const Tensors t = generate(c);
  ASSERT_EQ(t.v.size(), static_cast<size_t>(v_elements(p)));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < p.seq_k; ++s)
      for (int64_t h = 0; h < p.heads_kv; ++h)
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          ASSERT_EQ(std::bit_cast<uint32_t>(t.v[v_index(p, b, s, h, d)]),
                    std::bit_cast<uint32_t>(t.k[k_index(p, b, s, h, d)]));
  EXPECT_TRUE(std::isnan(t.k[k_index(p, 1, 4, 1, 1)]));  // (b, s, h, d)
  // set_variants keeps kv-shared (a geometry, like dropout); a reshape keeps V a view.
  ASSERT_EQ(set_variants(c, AF_VARIANT_SINK), "");
  EXPECT_TRUE(kv_shared(c.problem));
  const Problem r = reshape_problem(c.problem, 1, 2, 5, 16, 16);
  EXPECT_TRUE(kv_shared(r));
  EXPECT_EQ(validate(r), "");
}

TEST(KvShared, RefusedWithAReason) {
  Case c = make_case(make_problem(1, 2, 1, 3, 9, 8, 12), 1);  // Dv > D
  ASSERT_EQ(set_variants(c, AF_VARIANT_KV_SHARED), "");
  EXPECT_NE(validate(c).find("needs Dv <= D"), std::string::npos) << validate(c);
  Case s = make_case(make_problem(1, 2, 1, 3, 9, 12, 8), 1);
  ASSERT_EQ(set_variants(s, AF_VARIANT_KV_SHARED), "");
  s.problem.v_stride[1] += 1;
  EXPECT_NE(validate(s).find("v_stride = k_stride"), std::string::npos) << validate(s);
  Case bwd = make_case(make_problem(1, 2, 1, 3, 9, 12, 8), 1);
  ASSERT_EQ(set_variants(bwd, AF_VARIANT_KV_SHARED), "");
  bwd.pass = Pass::kBwd;
  EXPECT_NE(validate(bwd).find("forward pass only"), std::string::npos) << validate(bwd);
  // An explicit V must repeat K's first Dv columns.
  Case e = make_case(make_problem(1, 1, 1, 2, 3, 4, 2), 1);
  ASSERT_EQ(set_variants(e, AF_VARIANT_KV_SHARED), "");
  ExplicitValues ev;
  ev.q.assign(static_cast<size_t>(q_elements(e.problem)), 0.5f);
  ev.k.assign(static_cast<size_t>(k_elements(e.problem)), 0.25f);
  e.explicit_values = ev;
  EXPECT_EQ(validate(e), "");  // no V: derived from K
  ev.v.assign(static_cast<size_t>(v_elements(e.problem)), 0.25f);
  e.explicit_values = ev;
  EXPECT_EQ(validate(e), "");
  ev.v[static_cast<size_t>(v_index(e.problem, 0, 2, 0, 1))] = 1.0f;
  e.explicit_values = ev;
  EXPECT_NE(validate(e).find("explicit v differs from k"), std::string::npos) << validate(e);
}

// Issue 28: sinks, softcap and ALiBi are valid on every sequence layout; the bias, the custom masks and per-head
// descales stay dense-only, refused with a reason that names the variant; the layout sweep's variant axis likewise.
TEST(LayoutVariants, SinkSoftcapAlibiOnLayoutsOthersRefused) {
  Case c = make_case(make_problem(1, 2, 1, 1, 1, 8, 8), 1);
  c.problem.q_layout = c.problem.kv_layout = AF_SEQ_PACKED;
  c.seqs.q = {3, 0, 5};
  c.seqs.k = {4, 2, 5};
  c.problem.batch = 3;
  ASSERT_EQ(set_sequence_fields(c), "");
  ASSERT_EQ(set_variants(c, AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI, 5.0f), "");
  EXPECT_EQ(validate(c), "");
  EXPECT_NE(describe(c).find("sinks=uniform:2"), std::string::npos) << describe(c);
  const Tensors t = generate(c);
  EXPECT_EQ(t.sinks.size(), 2u);
  EXPECT_EQ(t.alibi_slopes.size(), 2u);
  ASSERT_EQ(set_variants(c, AF_VARIANT_SINK | AF_VARIANT_BIAS), "");
  EXPECT_EQ(validate(c),
            "variant bias is checked on dense batches only, not on sequence layouts (yet): sink, softcap, alibi and "
            "kv-shared combine with every layout");
  EXPECT_THROW(layout_sweep_grid("decode", 0, AF_VARIANT_BIAS), std::invalid_argument);
  const std::vector<Case> grid = layout_sweep_grid("decode", 0, AF_VARIANT_SINK);
  EXPECT_GT(grid.size(), layout_sweep_grid("decode", 0).size());  // the edges
  for (const Case& g : grid) EXPECT_EQ(g.label.rfind("sink-", 0), 0u) << g.label;
}
}  // namespace
}  // namespace attnfuzz
