// varlen_kernels_test.cpp - the varlen and paged-decode kernels on packed, KV-cache and paged layouts, each
// sequence against the fp64 reference of that sequence alone, with NaN everywhere outside the sequences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attnfuzz/device.h"
#include "attnfuzz/problem.h"
#include "attnfuzz/registry.h"
#include "oracle/reference_fp64.h"

namespace attnfuzz {
namespace {

constexpr uint32_t kPoisonBits = 0x7fc0dead;  // outputs and workspace before the launch
constexpr uint32_t kGapBits = 0x7fe5a5aau;    // q / k / v elements outside every sequence
float bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
bool is_poison(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u == kPoisonBits;
}

enum class Kv { kDense, kPacked, kPaged };

// A batch of sequences: query tokens (empty: dense q with sq tokens each), key slots and used keys.
struct Layout {
  std::vector<int64_t> q;     // packed q lengths, or empty (dense, dense_sq tokens)
  int64_t dense_sq = 1;
  Kv kv = Kv::kPacked;
  std::vector<int64_t> slots;  // packed: segment lengths; dense: capacity = max; paged: pages * page_size
  std::vector<int64_t> used;   // seqused_k, or empty
  int64_t page_size = 0;
  int64_t spare_pages = 0;
  uint64_t shuffle = 0;  // paged: pool order seed (0 = in order)
};

// The problem, the sequence arrays and the inputs with NaN outside the sequences.
struct Built {
  Problem p{};
  std::vector<int32_t> cu_q, cu_k, used, table;
  std::vector<float> q, k, v;
  int64_t sq(int64_t b) const { return cu_q.empty() ? p.seq_q : cu_q[b + 1] - cu_q[b]; }
  int64_t sk(int64_t b) const {
    if (!used.empty()) return used[b];
    return p.kv_layout == AF_SEQ_PACKED ? cu_k[b + 1] - cu_k[b] : p.seq_k;
  }
  int64_t q_at(int64_t b, int64_t s, int64_t h) const {
    return (cu_q.empty() ? b * p.q_stride[0] + s * p.q_stride[1] : (cu_q[b] + s) * p.q_stride[1]) +
           h * p.q_stride[2];
  }
  int64_t o_at(int64_t b, int64_t s, int64_t h) const {
    return (cu_q.empty() ? b * p.o_stride[0] + s * p.o_stride[1] : (cu_q[b] + s) * p.o_stride[1]) +
           h * p.o_stride[2];
  }
  int64_t kv_at(const int64_t* st, int64_t b, int64_t j, int64_t h) const {
    if (p.kv_layout == AF_SEQ_PAGED)
      return table[b * p.max_pages_per_seq + j / p.page_size] * st[0] + (j % p.page_size) * st[1] + h * st[2];
    if (p.kv_layout == AF_SEQ_PACKED) return (cu_k[b] + j) * st[1] + h * st[2];
    return b * st[0] + j * st[1] + h * st[2];
  }
};

Built build(const Layout& l, int64_t hq, int64_t hkv, int64_t d, int64_t dv, const std::string& mask,
            uint64_t seed) {
  Built x;
  Problem& p = x.p;
  const int64_t B = static_cast<int64_t>(l.slots.size());
  auto prefix = [](const std::vector<int64_t>& n) {
    std::vector<int32_t> cu{0};
    for (int64_t v : n) cu.push_back(cu.back() + static_cast<int32_t>(v));
    return cu;
  };
  const int64_t max_slots = *std::max_element(l.slots.begin(), l.slots.end());
  const int64_t sq = l.q.empty() ? l.dense_sq : std::max<int64_t>(1, *std::max_element(l.q.begin(), l.q.end()));
  p = make_problem(B, hq, hkv, sq, max_slots, d, dv);
  EXPECT_EQ(parse_mask(mask, p), "");
  if (!l.q.empty()) {
    x.cu_q = prefix(l.q);
    p.q_layout = AF_SEQ_PACKED;
    p.total_q = x.cu_q.back();
    for (int64_t* s : {p.q_stride, p.o_stride}) s[0] = 0;
    p.q_stride[1] = hq * d, p.o_stride[1] = hq * dv;
  }
  for (int64_t v : l.used) x.used.push_back(static_cast<int32_t>(v));
  if (!l.used.empty()) p.kv_capacity = max_slots;
  if (l.kv == Kv::kPacked) {
    x.cu_k = prefix(l.slots);
    p.kv_layout = AF_SEQ_PACKED;
    p.total_k = x.cu_k.back();
    p.k_stride[0] = p.v_stride[0] = 0;
  } else if (l.kv == Kv::kPaged) {
    p.kv_layout = AF_SEQ_PAGED;
    p.page_size = static_cast<int32_t>(l.page_size);
    int64_t pages = 0;
    p.max_pages_per_seq = 0;
    for (int64_t s : l.slots) {
      pages += s / l.page_size;
      p.max_pages_per_seq = std::max<int64_t>(p.max_pages_per_seq, s / l.page_size);
    }
    p.num_pages = pages + l.spare_pages;
    p.kv_capacity = p.max_pages_per_seq * l.page_size;
    std::vector<int32_t> order(static_cast<size_t>(p.num_pages));
    std::iota(order.begin(), order.end(), 0);
    if (l.shuffle) std::shuffle(order.begin(), order.end(), std::mt19937_64(l.shuffle));
    size_t next = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t pg = 0; pg < p.max_pages_per_seq; ++pg)
        // past the sequence's pages: a spare page if there is one (poisoned), else page 0
        x.table.push_back(pg < l.slots[b] / l.page_size ? order[next++]
                                                        : (l.spare_pages ? order[p.num_pages - 1] : 0));
    for (int64_t* s : {p.k_stride, p.v_stride}) {
      const int64_t dim = s == p.k_stride ? d : dv;
      s[2] = dim, s[1] = hkv * dim, s[0] = l.page_size * hkv * dim;
    }
  }
  p.seq_k = 0;  // the longest used length
  for (int64_t b = 0; b < B; ++b) p.seq_k = std::max(p.seq_k, x.sk(b));
  if (l.kv == Kv::kDense) p.seq_k = max_slots;  // dense K/V: Sk is the capacity
  const int64_t q_rows = l.q.empty() ? B * sq : p.total_q;
  const int64_t k_rows = l.kv == Kv::kPacked ? p.total_k : l.kv == Kv::kPaged ? p.num_pages * l.page_size : B * max_slots;
  x.q.assign(static_cast<size_t>(std::max<int64_t>(q_rows * hq * d, 1)), bits(kGapBits));
  x.k.assign(static_cast<size_t>(std::max<int64_t>(k_rows * hkv * d, 1)), bits(kGapBits));
  x.v.assign(static_cast<size_t>(std::max<int64_t>(k_rows * hkv * dv, 1)), bits(kGapBits));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < x.sq(b); ++s)
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t e = 0; e < d; ++e) x.q[x.q_at(b, s, h) + e] = u(rng);
    for (int64_t j = 0; j < x.sk(b); ++j)
      for (int64_t h = 0; h < hkv; ++h) {
        for (int64_t e = 0; e < d; ++e) x.k[x.kv_at(p.k_stride, b, j, h) + e] = u(rng);
        for (int64_t e = 0; e < dv; ++e) x.v[x.kv_at(p.v_stride, b, j, h) + e] = u(rng);
      }
  }
  return x;
}

struct Output {
  LaunchResult result;
  std::vector<float> o, lse;
};

Output run(Device& dev, const af_kernel& k, const Built& x) {
  auto put = [&](const void* src, size_t bytes) -> void* {
    if (bytes == 0) return nullptr;
    void* m = dev.alloc(bytes);
    dev.to_device(m, src, bytes);
    return m;
  };
  const Problem& p = x.p;
  const int64_t q_rows = p.q_layout == AF_SEQ_PACKED ? p.total_q : p.batch * p.seq_q;
  const size_t o_bytes = static_cast<size_t>(std::max<int64_t>(q_rows * p.heads_q * p.head_dim_v, 1)) * 4;
  const size_t lse_bytes = static_cast<size_t>(p.batch * p.heads_q * p.seq_q) * 4;
  const size_t ws_bytes = k.workspace_bytes ? k.workspace_bytes(&p) : 0;
  std::vector<void*> mem;
  af_buffers b{};
  mem.push_back(const_cast<void*>(b.q = put(x.q.data(), x.q.size() * 4)));
  mem.push_back(const_cast<void*>(b.k = put(x.k.data(), x.k.size() * 4)));
  mem.push_back(const_cast<void*>(b.v = put(x.v.data(), x.v.size() * 4)));
  mem.push_back(b.o = dev.alloc(o_bytes));
  mem.push_back(b.lse = static_cast<float*>(dev.alloc(lse_bytes)));
  dev.fill(b.o, &kPoisonBits, 4, o_bytes);
  dev.fill(b.lse, &kPoisonBits, 4, lse_bytes);
  if (ws_bytes) {
    mem.push_back(b.workspace = dev.alloc(ws_bytes));
    dev.fill(b.workspace, &kPoisonBits, 4, ws_bytes & ~size_t{3});
  }
  auto ints = [&](const std::vector<int32_t>& a) {
    void* m = put(a.data(), a.size() * 4);
    mem.push_back(m);
    return static_cast<const int32_t*>(m);
  };
  b.cu_seqlens_q = ints(x.cu_q);
  b.cu_seqlens_k = ints(x.cu_k);
  b.seqused_k = ints(x.used);
  b.block_table = ints(x.table);
  Output out;
  out.result = dev.launch(k, p, b);
  out.o.resize(o_bytes / 4);
  out.lse.resize(lse_bytes / 4);
  dev.to_host(out.o.data(), b.o, o_bytes);
  dev.to_host(out.lse.data(), b.lse, lse_bytes);
  for (void* m : mem)
    if (m) dev.free(m);
  return out;
}

std::string compare_one(double ref, float got) {
  if (is_poison(got)) return "never written (poison)";
  if (std::isnan(ref) || std::isnan(got)) return std::isnan(ref) && std::isnan(got) ? "" : "NaN mismatch";
  if (std::isinf(ref) || std::isinf(got)) return ref == static_cast<double>(got) ? "" : "Inf mismatch";
  return std::fabs(static_cast<double>(got) - ref) <= 3e-5 * (1.0 + std::fabs(ref)) ? "" : "beyond tolerance";
}

// Sequence b alone, as a dense B = 1 problem with the same heads, dims, mask and scale.
void check_sequences(const af_kernel& k, const Built& x, const Output& out) {
  ASSERT_EQ(out.result.status, LaunchStatus::kOk) << k.name << ": " << out.result.message;
  const Problem& p = x.p;
  int64_t bad = 0;
  std::string first;
  auto fail = [&](const std::string& what) {
    if (bad++ == 0) first = what;
  };
  std::vector<char> lse_written(out.lse.size(), 0);
  for (int64_t b = 0; b < p.batch; ++b) {
    Problem one = make_problem(1, p.heads_q, p.heads_kv, x.sq(b), x.sk(b), p.head_dim, p.head_dim_v);
    one.mask_kind = p.mask_kind, one.mask_align = p.mask_align;
    one.window_left = p.window_left, one.window_right = p.window_right, one.scale = p.scale;
    if (one.seq_q == 0) continue;
    std::vector<float> q(std::max<int64_t>(q_elements(one), 1)), kk(std::max<int64_t>(k_elements(one), 1)),
        v(std::max<int64_t>(v_elements(one), 1));
    for (int64_t s = 0; s < one.seq_q; ++s)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t e = 0; e < p.head_dim; ++e) q[q_index(one, 0, s, h, e)] = x.q[x.q_at(b, s, h) + e];
    for (int64_t j = 0; j < one.seq_k; ++j)
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        for (int64_t e = 0; e < p.head_dim; ++e) kk[k_index(one, 0, j, h, e)] = x.k[x.kv_at(p.k_stride, b, j, h) + e];
        for (int64_t e = 0; e < p.head_dim_v; ++e) v[v_index(one, 0, j, h, e)] = x.v[x.kv_at(p.v_stride, b, j, h) + e];
      }
    const Fp64Result ref = reference_fp64(one, q.data(), kk.data(), v.data());
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < one.seq_q; ++s) {
        const std::string at = "b=" + std::to_string(b) + " h=" + std::to_string(h) + " s=" + std::to_string(s);
        for (int64_t e = 0; e < p.head_dim_v; ++e) {
          const double r = ref.o[fp64_o_index(one, 0, s, h, e)];
          if (std::string w = compare_one(r, out.o[x.o_at(b, s, h) + e]); !w.empty())
            fail("O[" + at + " d=" + std::to_string(e) + "] ref " + std::to_string(r) + " got " +
                 std::to_string(out.o[x.o_at(b, s, h) + e]) + ": " + w);
        }
        const size_t li = static_cast<size_t>(lse_index(p, b, h, s));
        lse_written[li] = 1;
        const double r = ref.lse[fp64_lse_index(one, 0, h, s)];
        if (std::string w = compare_one(r, out.lse[li]); !w.empty())
          fail("LSE[" + at + "] ref " + std::to_string(r) + " got " + std::to_string(out.lse[li]) + ": " + w);
      }
  }
  for (size_t i = 0; i < out.lse.size(); ++i)  // rows past a sequence's Sq_b are not the kernel's
    if (!lse_written[i] && !is_poison(out.lse[i])) fail("LSE entry " + std::to_string(i) + " past its sequence written");
  EXPECT_EQ(bad, 0) << k.name << ": " << bad << " bad elements; first: " << first;
}

const char* const kMasks[] = {"none", "causal-tl", "causal-br", "window:5,3-br", "window:2,0-tl", "window:0,0-br"};

class SeqKernel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    entry_ = Registry::global().find(Backend::kCpu, GetParam());
    ASSERT_NE(entry_, nullptr) << GetParam();
    dev_ = open_device("cpu", DeviceOptions{});
  }
  // Runs every mask (and every tunable value when asked); returns how many launches ran.
  int check(const Layout& l, int64_t hq, int64_t hkv, int64_t d, int64_t dv, bool all_tunables = false) {
    int ran = 0;
    for (const char* mask : kMasks) {
      Built x = build(l, hq, hkv, d, dv, mask, 1000 + ran);
      const af_kernel& k = entry_->kernel;
      if (!unsupported_reason(k, x.p).empty()) continue;
      resolve_tunables(k, x.p);
      const int32_t n = all_tunables && k.n_tunables ? k.tunables[0].n_values : 1;
      for (int32_t vi = 0; vi < n; ++vi) {
        if (k.n_tunables) x.p.tunables[0] = k.tunables[0].values[vi];
        SCOPED_TRACE(describe(x.p) + " " + tunables_to_string(k, x.p));
        check_sequences(k, x, run(*dev_, k, x));
        ++ran;
        if (::testing::Test::HasFailure()) return ran;
      }
    }
    return ran;
  }
  const KernelEntry* entry_ = nullptr;
  std::unique_ptr<Device> dev_;
};

bool is_decode(const std::string& name) { return name == "paged-decode"; }

// Packed q and K/V (varlen), lengths with zero-length and single-token sequences and tile residues; GQA.
TEST_P(SeqKernel, PackedBatch) {
  Layout l;
  l.q = is_decode(GetParam()) ? std::vector<int64_t>{1, 0, 8, 3, 5} : std::vector<int64_t>{3, 0, 17, 1, 33};
  l.slots = {5, 1, 40, 0, 33};
  EXPECT_GT(check(l, 4, 2, 59, 59), 0);
  l.q = {1, 1, 1, 1, 1};
  l.slots = {17, 64, 1, 33, 65};
  EXPECT_GT(check(l, 2, 1, 16, 24), 0);
}

// Packed K/V with seqused_k below each segment: the rest of every segment is NaN and must not be read.
TEST_P(SeqKernel, PackedWithSeqused) {
  Layout l;
  l.q = {2, 7, 1};
  l.slots = {20, 40, 9};
  l.used = {17, 33, 0};
  EXPECT_GT(check(l, 2, 2, 32, 32), 0);
}

// KV cache: dense q and K/V of capacity 64, used lengths below it (the capacity tails are NaN).
TEST_P(SeqKernel, KvCache) {
  Layout l;
  l.kv = Kv::kDense;
  l.dense_sq = 4;
  l.slots = {64, 64, 64, 64};
  l.used = {1, 33, 64, 0};
  EXPECT_GT(check(l, 4, 1, 40, 40), 0);
}

// Paged K/V: shuffled pool pages, spare (unreferenced) pages, a last partial page; decode (Sq = 1) and
// 1..8 packed query tokens per sequence.
TEST_P(SeqKernel, Paged) {
  for (int64_t ps : {16, 32}) {
    Layout l;
    l.kv = Kv::kPaged;
    l.page_size = ps;
    l.spare_pages = 3;
    l.shuffle = 7 + ps;
    l.slots = {64, 64, 2 * ps, 96};
    l.used = {17, 64, 1, 95};
    l.dense_sq = 1;
    EXPECT_GT(check(l, 4, 2, 64, 64), 0);
    l.q = {8, 3, 1, 5};
    EXPECT_GT(check(l, 2, 1, 33, 20), 0);
  }
}

// Every accepted num_splits (the split-kv detector re-runs with each) on a paged decode batch.
TEST_P(SeqKernel, EveryTunableValue) {
  if (entry_->kernel.n_tunables == 0) GTEST_SKIP() << GetParam() << " declares no tunable";
  Layout l;
  l.kv = Kv::kPaged;
  l.page_size = 16;
  l.spare_pages = 1;
  l.shuffle = 3;
  l.slots = {48, 16, 80};
  l.used = {37, 2, 80};
  l.q = {2, 1, 4};
  EXPECT_GT(check(l, 2, 1, 16, 16, /*all_tunables=*/true), 0);
}

INSTANTIATE_TEST_SUITE_P(Kernels, SeqKernel,
                         ::testing::Values("varlen-bm16-bn16", "varlen-bm32-bn32", "paged-decode"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace attnfuzz
