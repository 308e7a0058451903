// dropout.cpp - dropout fields of a problem, the reference keep mask (Philox, FlashAttention layout) and the mask tests.
#include "attnfuzz/dropout.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "attnfuzz/philox.h"

namespace attnfuzz {

const char* dropout_rng_name(int32_t rng) {
  switch (rng) {
    case AF_DROPOUT_RNG_EXPORTED: return "exported";
    case AF_DROPOUT_RNG_PHILOX_FLASH: return "philox-flash";
    case AF_DROPOUT_RNG_PHILOX_TORCH: return "philox-torch";
  }
  return "?";
}

std::string parse_dropout_rng(const std::string& text, int32_t& out) {
  for (int32_t r = AF_DROPOUT_RNG_EXPORTED; r <= AF_DROPOUT_RNG_PHILOX_TORCH; ++r)
    if (text == dropout_rng_name(r)) {
      out = r;
      return {};
    }
  return "unknown dropout generator '" + text + "' (exported, philox-flash, philox-torch)";
}

std::string set_dropout(Problem& p, double drop_p, int32_t rng, uint64_t seed, uint64_t offset) {
  p.variants |= AF_VARIANT_DROPOUT;
  p.dropout_p = static_cast<float>(drop_p);
  p.dropout_rng = rng;
  p.dropout_seed = seed;
  p.dropout_offset = offset;
  set_dropout_mask_strides(p);
  if (!(drop_p >= 0 && drop_p < 1)) return "dropout p must be in [0, 1) (got " + std::to_string(drop_p) + ")";
  return validate_dropout(p);
}

void set_dropout_mask_strides(Problem& p) {
  p.dropout_mask_stride[2] = p.seq_k;
  p.dropout_mask_stride[1] = p.seq_q * p.seq_k;
  p.dropout_mask_stride[0] = p.heads_q * p.seq_q * p.seq_k;
}

std::string validate_dropout(const Problem& p) {
  if (!(p.variants & AF_VARIANT_DROPOUT)) return {};
  if (!(p.dropout_p >= 0 && p.dropout_p < 1)) return "dropout p must be in [0, 1)";
  if (p.dropout_rng < AF_DROPOUT_RNG_EXPORTED || p.dropout_rng > AF_DROPOUT_RNG_PHILOX_TORCH)
    return "unknown dropout generator " + std::to_string(p.dropout_rng);
  if (p.dropout_rng == AF_DROPOUT_RNG_PHILOX_TORCH)
    return "dropout generator philox-torch is not checked: PyTorch's memory-efficient layout (curand Philox with "
           "its per-thread subsequences) is not pinned from its sources here (docs/semantics.md \"Dropout\")";
  for (int64_t st : p.dropout_mask_stride)
    if (st < 0) return "a dropout mask stride is negative";
  if (dropout_mask_bytes(p) > kMaxElements) return "the dropout mask would exceed " + std::to_string(kMaxElements) + " bytes";
  return {};
}

std::string describe_dropout(const Problem& p) {
  if (!(p.variants & AF_VARIANT_DROPOUT)) return {};
  char pbuf[32], buf[192];
  for (int digits = 1; digits <= 9; ++digits) {  // the shortest text that reads back as the same fp32 p
    std::snprintf(pbuf, sizeof pbuf, "%.*g", digits, static_cast<double>(p.dropout_p));
    if (std::strtof(pbuf, nullptr) == p.dropout_p) break;
  }
  std::snprintf(buf, sizeof buf, " dropout=%s rng=%s dseed=0x%llx doffset=%llu", pbuf,
                dropout_rng_name(p.dropout_rng), static_cast<unsigned long long>(p.dropout_seed),
                static_cast<unsigned long long>(p.dropout_offset));
  return buf;
}

int64_t dropout_mask_bytes(const Problem& p) {
  if (p.batch <= 0 || p.heads_q <= 0 || p.seq_q <= 0 || p.seq_k <= 0) return 0;
  const int64_t* st = p.dropout_mask_stride;
  return (p.batch - 1) * st[0] + (p.heads_q - 1) * st[1] + (p.seq_q - 1) * st[2] + p.seq_k;
}

std::vector<uint8_t> reference_keep_mask(const Problem& p) {
  if (!(p.variants & AF_VARIANT_DROPOUT) || p.dropout_rng == AF_DROPOUT_RNG_PHILOX_TORCH) return {};
  std::vector<uint8_t> keep(static_cast<size_t>(p.batch * p.heads_q * p.seq_q * p.seq_k));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i)
        for (int64_t j = 0; j < p.seq_k; ++j)
          keep[keep_index(p, b, h, i, j)] = static_cast<uint8_t>(
              flash_dropout_keep(p.dropout_seed, p.dropout_offset, p.dropout_p, b, h, p.heads_q, i, j));
  return keep;
}

namespace {
std::string unit_name(int64_t b, int64_t h, int64_t i, int64_t j) {
  return "b=" + std::to_string(b) + " h=" + std::to_string(h) + " i=" + std::to_string(i) +
         (j >= 0 ? " j=" + std::to_string(j) : "");
}
// KL(x || q) of two Bernoulli distributions (natural log; 0 log 0 = 0).
double bernoulli_kl(double x, double q) {
  double kl = 0;
  if (x > 0) kl += x * std::log(x / q);
  if (x < 1) kl += (1 - x) * std::log((1 - x) / (1 - q));
  return std::max(kl, 0.0);
}
}  // namespace

std::vector<uint8_t> gather_keep_mask(const Problem& p, const uint8_t* exported, const float* lse, int64_t& bad,
                                      std::string& first_bad) {
  std::vector<uint8_t> keep(static_cast<size_t>(p.batch * p.heads_q * p.seq_q * p.seq_k), 0);
  bad = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const KeyRange kr = visible_keys(p, i);
        if (lse && !(lse[lse_index(p, b, h, i)] > -std::numeric_limits<float>::infinity())) {
          for (int64_t j = kr.first; j < kr.last; ++j) keep[keep_index(p, b, h, i, j)] = kKeepUnjudged;
          continue;
        }
        const uint8_t* row = exported + b * p.dropout_mask_stride[0] + h * p.dropout_mask_stride[1] +
                             i * p.dropout_mask_stride[2];
        for (int64_t j = kr.first; j < kr.last; ++j) {
          if (row[j] > 1 && bad++ == 0) first_bad = unit_name(b, h, i, j) + " holds " + std::to_string(row[j]);
          keep[keep_index(p, b, h, i, j)] = row[j] == 1;
        }
      }
  return keep;
}

std::string KeepTest::evidence() const {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "keep fraction: %s keeps %lld of %lld visible weights (%.4g), Binomial(n, q) with q in [%.6g, %.6g]: "
                "p-value <= %.3g (Chernoff bound) %s threshold %.3g = %.0e / %lld tests",
                worst_unit.c_str(), static_cast<long long>(worst_k), static_cast<long long>(worst_n),
                worst_n ? static_cast<double>(worst_k) / static_cast<double>(worst_n) : 0.0, q_lo, q_hi, worst_bound,
                failed ? "<" : ">=", threshold, threshold * static_cast<double>(tests), static_cast<long long>(tests));
  return buf;
}

void keep_probabilities(const Problem& p, double& lo, double& hi) {
  const double q_exact = 1.0 - static_cast<double>(p.dropout_p);
  const double q_8bit = (static_cast<double>(flash_keep_threshold(p.dropout_p)) + 1) / 256.0;
  lo = std::min(q_exact, q_8bit), hi = std::max(q_exact, q_8bit);
}

KeepTest keep_fraction_test(const Problem& p, const std::vector<uint8_t>& keep, double alpha) {
  KeepTest t;
  keep_probabilities(p, t.q_lo, t.q_hi);
  struct Unit {
    std::string name;
    int64_t k, n;
  };
  std::vector<Unit> units;
  int64_t K = 0, N = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      int64_t kh = 0, nh = 0;
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const KeyRange kr = visible_keys(p, i);
        int64_t k = 0;
        int64_t n = 0;
        for (int64_t j = kr.first; j < kr.last; ++j) {
          const uint8_t x = keep[keep_index(p, b, h, i, j)];
          if (x == kKeepUnjudged) continue;
          k += x, ++n;
        }
        if (n > 0) units.push_back({"row " + unit_name(b, h, i, -1), k, n});
        kh += k, nh += n;
      }
      if (nh > 0) units.push_back({"head b=" + std::to_string(b) + " h=" + std::to_string(h), kh, nh});
      K += kh, N += nh;
    }
  if (N > 0) units.push_back({"overall", K, N});
  t.tests = static_cast<int64_t>(units.size());
  t.threshold = t.tests ? alpha / static_cast<double>(t.tests) : alpha;
  for (const Unit& u : units) {
    const double x = static_cast<double>(u.k) / static_cast<double>(u.n);
    const double q = std::clamp(x, t.q_lo, t.q_hi);
    const double bound = x == q ? 1.0 : std::min(1.0, 2 * std::exp(-static_cast<double>(u.n) * bernoulli_kl(x, q)));
    if (bound < t.worst_bound || t.worst_unit.empty()) {
      t.worst_bound = bound, t.worst_unit = u.name, t.worst_k = u.k, t.worst_n = u.n;
    }
  }
  t.failed = t.worst_bound < t.threshold;
  return t;
}

int64_t keep_mask_differences(const Problem& p, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b_,
                              std::string& first) {
  int64_t n = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const KeyRange kr = visible_keys(p, i);
        for (int64_t j = kr.first; j < kr.last; ++j) {
          const size_t x = keep_index(p, b, h, i, j);
          if (a[x] != b_[x] && a[x] != kKeepUnjudged && b_[x] != kKeepUnjudged && n++ == 0) first = unit_name(b, h, i, j);
        }
      }
  return n;
}

std::vector<Case> dropout_sweep_grid(uint64_t base_seed, Pass pass, int32_t dtype) {
  struct Shape {
    const char* name;
    int64_t B, Hq, Hkv, Sq, Sk, D;
    const char* mask;
  };
  static const Shape kShapes[] = {
      {"1x1", 1, 1, 1, 1, 1, 8, "none"},          {"7x13-gqa", 1, 2, 1, 7, 13, 16, "none"},
      {"17x33-causal", 1, 2, 2, 17, 33, 8, "causal-br"}, {"b2-33x65", 2, 2, 1, 33, 65, 16, "none"},
      {"64x64-window", 1, 1, 1, 64, 64, 32, "window:8,8-br"}, {"40x100-tl", 1, 4, 2, 40, 100, 8, "causal-tl"},
  };
  struct Extra {
    int shape;
    double p;
    uint64_t offset;
    const char* tag;
  };
  constexpr uint64_t kNear32 = (uint64_t{1} << 32) - 40;  // (b Hq + h) 32 + lane crosses 2^32 from h = 1 on
  const Extra kExtras[] = {{0, 0.0, 0, ""},        {1, 0.0, 0, ""},        {2, 0.9, 0, ""},
                           {2, 0.999, 0, ""},      {2, 0.2, kNear32, "-offset2^32"}, {3, 0.2, kNear32, "-offset2^32"}};
  std::vector<Case> out;
  auto add = [&](int32_t rng, const Shape& s, double p, uint64_t offset, const char* tag) {
    char pbuf[32];
    std::snprintf(pbuf, sizeof pbuf, "%g", p);
    const std::string label = std::string(dtype == AF_DTYPE_F32 ? "" : std::string(dtype_name(dtype)) + "-") +
                              (rng == AF_DROPOUT_RNG_EXPORTED ? "exported-" : "philox-") + s.name + "-p" + pbuf + tag;
    Case c = make_case(make_problem(s.B, s.Hq, s.Hkv, s.Sq, s.Sk, s.D, s.D), base_seed ^ hash64(label));
    (void)parse_mask(s.mask, c.problem);
    (void)set_dropout(c.problem, p, rng, hash64(label + "/dseed") | 1, offset);
    c.problem.dtype = dtype;
    c.label = label;
    c.pass = pass;
    out.push_back(std::move(c));
  };
  for (int32_t rng : {AF_DROPOUT_RNG_EXPORTED, AF_DROPOUT_RNG_PHILOX_FLASH}) {
    for (const Shape& s : kShapes)
      for (double p : {0.1, 0.5}) add(rng, s, p, 0, "");
    for (const Extra& e : kExtras) add(rng, kShapes[e.shape], e.p, e.offset, e.tag);
  }
  return out;
}

}  // namespace attnfuzz
