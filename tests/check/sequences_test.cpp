// sequences_test.cpp - varlen / KV cache / paged cases end to end: case model, corpus, per-sequence oracle,
// runner (arrays, gap poison, LSE canaries) and the oob-read naming of a read across a sequence boundary,
// with small host-loop kernels on the cpu device.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "attnfuzz/case.h"
#include "attnfuzz/corpus.h"
#include "attnfuzz/device.h"
#include "check/classify.h"
#include "check/runner.h"
#include "check/sequences.h"

namespace attnfuzz {
namespace {

// ---- host-loop kernels (the cpu device calls launch() in its launch child; memory is host memory) ----

// kBatchOffsetNoGuard: the bottom-right offset from the batch's largest lengths (max Sk - max Sq), and O = acc / l
// with no empty-row guard (0 / 0 = NaN for a row it finds empty); kEmptyNaN: only the missing guard; kNoRescale:
// an online softmax that rescales l but not the accumulator when the running max grows.
enum class Bug { kNone, kNextKey, kWholePage, kLseTail, kLseRowNotPacked, kBatchOffsetNoGuard, kEmptyNaN, kNoRescale };
Bug g_bug = Bug::kNone;

int host_attention(const af_problem* p, const af_buffers* bf, void*) {
  const float* q = static_cast<const float*>(bf->q);
  const float* k = static_cast<const float*>(bf->k);
  const float* v = static_cast<const float*>(bf->v);
  float* o = static_cast<float*>(bf->o);
  for (int64_t b = 0; b < p->batch; ++b) {
    const int64_t q0 = p->q_layout == AF_SEQ_PACKED ? bf->cu_seqlens_q[b] : 0;
    const int64_t sq = p->q_layout == AF_SEQ_PACKED ? bf->cu_seqlens_q[b + 1] - q0 : p->seq_q;
    const int64_t k0 = p->kv_layout == AF_SEQ_PACKED ? bf->cu_seqlens_k[b] : 0;
    int64_t sk = p->kv_layout == AF_SEQ_PACKED ? bf->cu_seqlens_k[b + 1] - k0 : p->seq_k;
    if (bf->seqused_k) sk = bf->seqused_k[b];
    int64_t reach = sk;  // keys the loop reads
    if (g_bug == Bug::kNextKey) reach = sk + 1;
    if (g_bug == Bug::kWholePage && p->kv_layout == AF_SEQ_PAGED)
      reach = (sk + p->page_size - 1) / p->page_size * p->page_size;
    auto krow = [&](int64_t j, const int64_t* st) {
      if (p->kv_layout == AF_SEQ_PAGED)
        return bf->block_table[b * p->max_pages_per_seq + j / p->page_size] * st[0] + (j % p->page_size) * st[1];
      return (p->kv_layout == AF_SEQ_PACKED ? 0 : b * st[0]) + (k0 + j) * st[1];
    };
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t h = 0; h < p->heads_q; ++h) {
        const int64_t hk = h / (p->heads_q / p->heads_kv);
        const int64_t qr = (p->q_layout == AF_SEQ_PACKED ? 0 : b * p->q_stride[0]) + (q0 + i) * p->q_stride[1] +
                           h * p->q_stride[2];
        const int64_t orow = (p->q_layout == AF_SEQ_PACKED ? 0 : b * p->o_stride[0]) + (q0 + i) * p->o_stride[1] +
                             h * p->o_stride[2];
        // per-sequence mask alignment
        const int64_t off = p->mask_align != AF_ALIGN_BOTTOM_RIGHT ? 0
                            : g_bug == Bug::kBatchOffsetNoGuard ? p->seq_k - p->seq_q
                                                                : sk - sq;
        const int64_t left = p->mask_kind == AF_MASK_WINDOW ? p->window_left : AF_UNBOUNDED;
        const int64_t right = p->mask_kind == AF_MASK_CAUSAL ? 0 : p->mask_kind == AF_MASK_WINDOW ? p->window_right
                                                                                                   : AF_UNBOUNDED;
        int64_t first = 0, last = reach;
        if (p->mask_kind != AF_MASK_NONE) {
          first = left == AF_UNBOUNDED ? 0 : std::max<int64_t>(0, i + off - left);
          last = right == AF_UNBOUNDED ? reach : std::min<int64_t>(reach, i + off + right + 1);
        }
        double m = -INFINITY;
        std::vector<double> s;
        for (int64_t j = first; j < last; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < p->head_dim; ++d)
            dot += double(q[qr + d]) * double(k[krow(j, p->k_stride) + hk * p->k_stride[2] + d]);
          s.push_back(double(p->scale) * dot);
          m = std::max(m, s.back());
        }
        double l = 0;
        std::vector<double> acc(static_cast<size_t>(p->head_dim_v), 0.0);
        for (int64_t j = first; j < last; ++j) {
          const double w = std::exp(s[j - first] - m);
          l += w;
          for (int64_t d = 0; d < p->head_dim_v; ++d)
            acc[d] += w * double(v[krow(j, p->v_stride) + hk * p->v_stride[2] + d]);
        }
        if (g_bug == Bug::kNoRescale) {  // online: l follows the running max, acc keeps its old scale
          double mr = -INFINITY;
          l = 0;
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t j = first; j < last; ++j) {
            const double mn = std::max(mr, s[j - first]);
            l = l * std::exp(mr - mn) + std::exp(s[j - first] - mn);
            for (int64_t d = 0; d < p->head_dim_v; ++d)
              acc[d] += std::exp(s[j - first] - mn) * double(v[krow(j, p->v_stride) + hk * p->v_stride[2] + d]);
            mr = mn;
          }
        }
        const bool guard = g_bug != Bug::kBatchOffsetNoGuard && g_bug != Bug::kEmptyNaN;
        for (int64_t d = 0; d < p->head_dim_v; ++d)
          o[orow + d] = l > 0 || !guard ? float(acc[d] / l) : 0.0f;
        // ABI v3 packed lse [Hq, total_q]: the row of query i of sequence b is cu_seqlens_q[b] + i
        const int64_t lrow = p->lse_layout == AF_LSE_PACKED && g_bug != Bug::kLseRowNotPacked ? q0 + i : i;
        if (bf->lse) bf->lse[b * p->lse_stride[0] + h * p->lse_stride[1] + lrow * p->lse_stride[2]] =
            l > 0 ? float(m + std::log(l)) : -INFINITY;
      }
    if (g_bug == Bug::kLseTail && bf->lse && sq < p->seq_q) bf->lse[b * p->lse_stride[0] + sq * p->lse_stride[2]] = 0;
  }
  return 0;
}

KernelEntry entry(uint32_t features = AF_FEATURE_Q_PACKED | AF_FEATURE_KV_PACKED | AF_FEATURE_KV_PAGED |
                                      AF_FEATURE_SEQUSED_K) {
  af_kernel k{};
  k.name = "host-seq";
  k.family = "test";
  k.writes_lse = 1;
  k.launch = host_attention;
  k.features = features;
  return KernelEntry{k, Backend::kCpu, "test"};
}

Device& device() {
  static std::unique_ptr<Device> d = [] {
    DeviceOptions o;
    o.workers = 1;
    return open_device("cpu", o);
  }();
  return *d;
}

Case varlen_case(std::vector<int64_t> q, std::vector<int64_t> k, const char* mask = "causal-br") {
  Case c = make_case(make_problem(1, 4, 2, 1, 1, 8, 8), 42);
  c.problem.q_layout = c.problem.kv_layout = AF_SEQ_PACKED;
  EXPECT_EQ(parse_mask(mask, c.problem), "");
  c.seqs.q = std::move(q);
  c.seqs.k = std::move(k);
  c.problem.batch = static_cast<int64_t>(c.seqs.q.size());
  EXPECT_EQ(set_sequence_fields(c), "");
  return c;
}

Case paged_case(std::vector<int64_t> used, int32_t page, uint64_t order, int64_t spare, int64_t sq = 1) {
  Case c = make_case(make_problem(static_cast<int64_t>(used.size()), 2, 1, sq, 1, 8, 8), 7);
  c.problem.kv_layout = AF_SEQ_PAGED;
  c.problem.page_size = page;
  c.seqs.used = std::move(used);
  c.seqs.page_order = order;
  c.seqs.spare_pages = spare;
  EXPECT_EQ(set_sequence_fields(c), "");
  return c;
}

// ---- the case model ----

TEST(SequenceCase, PackedFieldsArraysAndGaps) {
  const Case c = varlen_case({3, 0, 17}, {5, 1, 40});
  EXPECT_EQ(c.problem.total_q, 20);
  EXPECT_EQ(c.problem.total_k, 46);
  EXPECT_EQ(c.problem.seq_q, 17);
  EXPECT_EQ(c.problem.seq_k, 40);
  EXPECT_EQ(c.problem.q_stride[0], 0);
  EXPECT_EQ(validate(c), "");
  const Tensors t = generate(c);
  EXPECT_EQ(t.cu_seqlens_q, (std::vector<int32_t>{0, 3, 3, 20}));
  EXPECT_EQ(t.cu_seqlens_k, (std::vector<int32_t>{0, 5, 6, 46}));
  EXPECT_EQ(t.q.size(), size_t(20 * 4 * 8));
  EXPECT_NE(describe(c).find("layout=varlen seqlens-q=3,0,17 seqlens-k=5,1,40"), std::string::npos);
  // Sequence b holds what the dense view holds at [b, s].
  Case dense = c;
  dense.problem = dense_view(c.problem, t);
  dense.seqs = {};
  const Tensors d = generate(dense);
  EXPECT_EQ(t.k[k_offset(c.problem, t, 2, 39, 1, 7)], d.k[k_index(dense.problem, 2, 39, 1, 7)]);
  EXPECT_EQ(t.q[q_offset(c.problem, t, 0, 2, 3, 0)], d.q[q_index(dense.problem, 0, 2, 3, 0)]);
}

TEST(SequenceCase, PagedTableShuffledSparePagesAndPoison) {
  const Case c = paged_case({33, 1, 0}, 16, 99, 2);
  EXPECT_EQ(c.problem.num_pages, 3 + 1 + 0 + 2);
  EXPECT_EQ(c.problem.max_pages_per_seq, 3);
  EXPECT_EQ(c.problem.kv_capacity, 48);
  const Tensors t = generate(c);
  ASSERT_EQ(t.block_table.size(), size_t(9));
  std::vector<int> uses(6, 0);
  for (int b = 0; b < 3; ++b)
    for (int j = 0; j < (b == 0 ? 3 : b == 1 ? 1 : 0); ++j) ++uses[t.block_table[b * 3 + j]];
  EXPECT_EQ(std::count(uses.begin(), uses.end(), 1), 4);  // four referenced pages, each once
  // Slot 1 of sequence 0's last page (key 33) and every slot of an unreferenced page are poison.
  const int64_t last = t.block_table[2];
  EXPECT_EQ(std::bit_cast<uint32_t>(t.k[(last * 16 + 1) * c.problem.k_stride[1]]), kSeqGapBits);
  EXPECT_NE(std::bit_cast<uint32_t>(t.k[(last * 16 + 0) * c.problem.k_stride[1]]), kSeqGapBits);
  EXPECT_EQ(t.seqused_k, (std::vector<int32_t>{33, 1, 0}));
  EXPECT_NE(paged_case({33, 1, 0}, 16, 0, 2).problem.num_pages, 0);
}

TEST(SequenceCase, InvalidInputsAreRefusedWithAReason) {
  Case c = paged_case({5}, 16, 0, 0);
  c.seqs.used = {};
  EXPECT_NE(set_sequence_fields(c).find("need seqused-k"), std::string::npos);
  Case v = varlen_case({3, 4}, {3, 4});
  v.seqs.used = {4, 1};
  EXPECT_NE(set_sequence_fields(v).find("exceeds"), std::string::npos);
  Case s = varlen_case({3, 4}, {3, 4});
  SpecialValue sv;
  ASSERT_EQ(parse_special("nan@k:masked", sv), "");
  s.values.specials.push_back(sv);
  EXPECT_NE(validate(s).find("random or at="), std::string::npos);
  Case z = varlen_case({3, 4}, {3, 4});
  z.problem.total_q = 8;  // disagrees with the lengths
  EXPECT_NE(validate(z), "");
  // Finite domain with explicit values: a NaN in a sequence is refused, the NaN gaps are not values.
  Case f = paged_case({17, 2}, 16, 0, 1);
  f.values.domain = ValueDomain::kFinite;
  const Tensors t = generate(f);
  f.explicit_values = ExplicitValues{t.q, t.k, t.v};
  EXPECT_EQ(validate(f), "");
  f.explicit_values->k[k_offset(f.problem, t, 1, 1, 0, 3)] = NAN;
  EXPECT_NE(validate(f).find("sequence 1"), std::string::npos);
}

TEST(SequenceCase, CorpusRoundTripKeepsTheBits) {
  for (const Case& c : {varlen_case({3, 0, 17}, {5, 1, 40}), paged_case({33, 1, 0}, 32, 5, 1, 3)}) {
    const Case back = case_from_json(case_to_json(c));
    EXPECT_EQ(back.seqs, c.seqs);
    EXPECT_EQ(describe(back), describe(c));
    const Tensors a = generate(c), b = generate(back);
    ASSERT_EQ(a.k.size(), b.k.size());
    EXPECT_EQ(0, std::memcmp(a.k.data(), b.k.data(), a.k.size() * 4));
    EXPECT_EQ(a.block_table, b.block_table);
  }
}

TEST(SequenceCase, LayoutSweepsAreValid) {
  for (const std::string& l : sequence_layouts()) {
    const auto grid = layout_sweep_grid(l, 0);
    EXPECT_GE(grid.size(), 20u) << l;
    for (const Case& c : grid) EXPECT_EQ(validate(c), "") << c.label;
  }
  EXPECT_TRUE(layout_sweep_grid("nonsense").empty());
}

// Issue 27 item 17: the paged sweep has decode-sized cases (1 and 4 query rows), so a decode kernel selected
// with --seq-layout paged --sweep checks something.
TEST(SequenceCase, PagedSweepHasDecodeSizedCases) {
  int64_t one = 0, four = 0;
  for (const Case& c : layout_sweep_grid("paged", 0)) {
    one += c.problem.seq_q == 1;
    four += c.problem.seq_q == 4;
  }
  EXPECT_GE(one, 3);
  EXPECT_GE(four, 3);
}

// ---- oracle ----

TEST(SequenceOracle, EachSequenceEqualsItsDenseProblem) {
  const Case c = varlen_case({3, 0, 17}, {5, 1, 40});
  const Tensors t = generate(c);
  const OracleResult R = sequence_oracle(c.problem, t, {});
  for (int64_t b : {0, 2}) {
    const Problem sp = sequence_problem(c.problem, t, b);
    const Tensors st = sequence_tensors(c.problem, t, b);
    const OracleResult S = compute_oracle(sp, st.q.data(), st.k.data(), st.v.data());
    for (int64_t s = 0; s < sp.seq_q; ++s)
      for (int64_t h = 0; h < 4; ++h) {
        EXPECT_EQ(R.lse[R.lse_at(b, h, s)], S.lse[S.lse_at(0, h, s)]);
        EXPECT_EQ(R.o[R.o_at(b, s, h, 5)], S.o[S.o_at(0, s, h, 5)]);
      }
  }
  EXPECT_FALSE(R.row(0, 0, 3).computed);  // past sequence 0's 3 queries
  EXPECT_FALSE(R.row(1, 0, 0).computed);  // sequence 1 has none
  EXPECT_EQ(R.rows_computed, (3 + 17) * 4);
}

// ---- runner and detectors ----

Judged check(const Case& c, const KernelEntry& k, bool classify = false) {
  PreparedCase pc(c);
  RunOptions o;
  Judged j = check_case(device(), k, pc, o);
  if (classify) {
    ClassifyOptions co;
    co.tsan = false;
    classify_failure(device(), k, pc, o, j, co);
  }
  return j;
}

// check() of entry() with g_bug planted for the one call.
Judged check_with(Bug bug, const Case& c, bool classify = false) {
  g_bug = bug;
  Judged j = check(c, entry(), classify);
  g_bug = Bug::kNone;
  return j;
}

// Issue 28: sinks, softcap and ALiBi per sequence. One row computed by hand in double (the softcap, ALiBi's distance
// from the diagonal of its own sequence, Sk_b - Sq_b = 2, the sink in the denominator only) matches the layout
// oracle; a sequence without keys has O = 0 and LSE = its head's sink.
TEST(SequenceOracle, VariantsApplyPerSequenceWithTheirOwnAlignment) {
  Case c = varlen_case({3, 0, 17, 4}, {5, 1, 40, 0});
  ASSERT_EQ(set_variants(c, AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI, 0.5f), "");
  ASSERT_EQ(validate(c), "");
  const Tensors t = generate(c);
  const Problem& p = c.problem;
  const OracleResult R = sequence_oracle(p, t, {});
  const int64_t b = 0, h = 3, i = 2, hk = kv_head(p, h), off = 5 - 3;
  double sum = std::exp(static_cast<double>(t.sinks[h]));
  for (int64_t j = 0; j <= i + off; ++j) {  // causal-br: keys 0 .. i + off
    double dot = 0;
    for (int64_t d = 0; d < p.head_dim; ++d)
      dot += static_cast<double>(t.q[q_offset(p, t, b, i, h, d)]) * t.k[k_offset(p, t, b, j, hk, d)];
    const double capped = 0.5 * std::tanh(static_cast<double>(p.scale) * dot / 0.5);
    sum += std::exp(capped - static_cast<double>(t.alibi_slopes[h]) * std::fabs(static_cast<double>(j - (i + off))));
  }
  EXPECT_NEAR(R.lse[R.lse_at(b, h, i)], std::log(sum), 1e-9);
  for (int64_t hh = 0; hh < p.heads_q; ++hh)
    for (int64_t s = 0; s < 4; ++s) {  // sequence 3: four queries, no key: the sink alone
      EXPECT_EQ(R.lse[R.lse_at(3, hh, s)], t.sinks[hh]);
      EXPECT_EQ(R.o[R.o_at(3, s, hh, 0)], 0.0);
    }
  Case off_c = c;  // the variants change the result: without them the row differs
  ASSERT_EQ(set_variants(off_c, 0), "");
  const OracleResult N = sequence_oracle(off_c.problem, generate(off_c), {});
  EXPECT_GT(std::fabs(N.lse[N.lse_at(b, h, i)] - R.lse[R.lse_at(b, h, i)]), 1e-3);
}

TEST(SequenceRunner, CorrectKernelPassesEveryLayoutSweepCase) {
  g_bug = Bug::kNone;
  const KernelEntry k = entry();
  for (const std::string& l : sequence_layouts()) {
    const auto grid = layout_sweep_grid(l, 0);
    for (size_t i = 0; i < grid.size(); i += 3) {  // a third of each sweep keeps the test short
      // The host-loop kernel trusts its metadata (the built-ins refuse malformed cases: tests/check/malformed_test.cpp).
      if (grid[i].seqs.malformed.kind != Malformation::kNone) continue;
      const Judged j = check(grid[i], k);
      EXPECT_EQ(j.result.verdict, Verdict::kPass) << grid[i].label << ": " << j.result.reason;
    }
  }
}

TEST(SequenceRunner, APackedLseKernelGetsHqByTotalQAndIsJudgedInTheDenseView) {
  KernelEntry k = entry();
  k.kernel.flags = AF_KERNEL_LSE_PACKED;
  g_bug = Bug::kNone;
  for (const char* mask : {"causal-br", "none"}) {
    const Judged j = check(varlen_case({3, 0, 5}, {4, 1, 6}, mask), k);
    EXPECT_EQ(j.result.verdict, Verdict::kPass) << mask << ": " << j.result.reason;
  }
  g_bug = Bug::kLseRowNotPacked;  // declares the packed layout, writes rows by their index in the sequence
  const Judged bad = check(varlen_case({3, 2, 5}, {4, 3, 6}, "none"), k);
  g_bug = Bug::kNone;
  EXPECT_EQ(bad.result.verdict, Verdict::kFail) << bad.result.reason;
}

TEST(SequenceRunner, KernelWithoutTheFeatureIsRefused) {
  const Judged j = check(paged_case({5, 9}, 16, 0, 0), entry(AF_FEATURE_KV_PAGED));
  EXPECT_EQ(j.result.verdict, Verdict::kUnsupported);
  EXPECT_NE(j.result.reason.find("seqused_k"), std::string::npos);
  const Judged d = check(varlen_case({3, 4}, {3, 4}), entry(0));
  EXPECT_EQ(d.result.verdict, Verdict::kUnsupported);
  EXPECT_NE(d.result.reason.find("packed"), std::string::npos);
}

TEST(SequenceRunner, ReadOfTheNextSequencesFirstKeyIsOobRead) {
  const Judged j = check_with(Bug::kNextKey, varlen_case({4, 6, 5}, {7, 9, 6}, "none"), true);
  EXPECT_EQ(j.result.verdict, Verdict::kFail);
  EXPECT_EQ(j.result.failure, FailureClass::kOobRead);
  bool named = false;
  for (const Evidence& e : j.result.evidence)
    named |= e.detector == "sequences" && e.detail.find("reads across its boundary, into sequence") != std::string::npos;
  EXPECT_TRUE(named) << j.result.reason;
  for (const Evidence& e : j.result.evidence)
    if (!named) ADD_FAILURE() << e.detector << ": " << e.detail;
}

TEST(SequenceRunner, ReadOfALastPageWholeIsOobRead) {
  const Judged j = check_with(Bug::kWholePage, paged_case({17, 33, 5}, 16, 3, 1), true);
  EXPECT_EQ(j.result.verdict, Verdict::kFail);
  EXPECT_EQ(j.result.failure, FailureClass::kOobRead);
  bool named = false;
  for (const Evidence& e : j.result.evidence)
    named |= e.detector == "poison-swap" && e.detail.find("pages") != std::string::npos;
  EXPECT_TRUE(named);
}

TEST(SequenceRunner, LseWrittenPastASequenceIsOobWrite) {
  const Judged j = check_with(Bug::kLseTail, varlen_case({2, 5}, {2, 5}));
  EXPECT_EQ(j.result.verdict, Verdict::kFail);
  EXPECT_EQ(j.result.failure, FailureClass::kOobWrite);
  EXPECT_NE(j.result.reason.find("outside every sequence"), std::string::npos);
}

// Issue 25 item 4: the detectors that used to skip sequence layouts run per sequence.
std::string evidence_text(const Judged& j) {
  std::string all;
  for (const Evidence& e : j.result.evidence) all += e.detector + ": " + e.detail + "\n";
  return all;
}

// The bottom-right offset taken from the batch maxima in a kernel without an empty-row guard: sequence 0
// (6 queries, 2 keys) loses the keys of rows 4 and 5, which come out NaN. Once non-finite with no mask evidence.
TEST(SequenceClassify, PerSequenceOffsetThatEmptiesRowsIsMask) {
  const Judged j = check_with(Bug::kBatchOffsetNoGuard, varlen_case({6, 2}, {2, 10}, "window:4,0-br"), true);
  EXPECT_EQ(j.result.failure, FailureClass::kMask) << evidence_text(j);
  const std::string ev = evidence_text(j);
  EXPECT_NE(ev.find("aligned with the batch's largest lengths"), std::string::npos) << ev;
  EXPECT_NE(ev.find("must see keys have none under it and came out NaN"), std::string::npos) << ev;
}

// The other direction (rows see keys they must not) was already mask; it stays so.
TEST(SequenceClassify, PerSequenceOffsetThatAddsKeysIsMask) {
  const Judged j = check_with(Bug::kBatchOffsetNoGuard, varlen_case({3, 5}, {10, 5}), true);
  EXPECT_EQ(j.result.failure, FailureClass::kMask) << evidence_text(j);
}

TEST(SequenceClassify, EmptyRowsOfASequenceAreEmptyRowWithTheirReason) {
  const Judged j = check_with(Bug::kEmptyNaN, varlen_case({5, 2}, {2, 4}), true);
  EXPECT_EQ(j.result.failure, FailureClass::kEmptyRow) << evidence_text(j);
  const std::string ev = evidence_text(j);
  EXPECT_NE(ev.find("no visible key under mask causal-br"), std::string::npos) << ev;
  EXPECT_NE(ev.find("query rows s = 0-2"), std::string::npos) << ev;
}

TEST(SequenceClassify, AMissingRescaleInAPagedCaseIsRescale) {
  g_bug = Bug::kNoRescale;
  Case c = paged_case({17, 33, 5}, 16, 3, 1, 3);
  c.values.dist = ValueDist{Distribution::kNormal, 3.0};
  const Judged j = check(c, entry(), true);
  g_bug = Bug::kNone;
  EXPECT_EQ(j.result.failure, FailureClass::kRescale) << evidence_text(j);
  EXPECT_NE(evidence_text(j).find("reordered by score: max key first -> err/bound"), std::string::npos);
}

}  // namespace
}  // namespace attnfuzz
