// merge.cpp - merge cases (issue 29): key-range cuts, LSE shifts, state layouts and strides, the merge sweep grid.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <stdexcept>

#include "attnfuzz/case.h"
#include "core/case_internal.h"

namespace attnfuzz {

using case_detail::shortest;

namespace {
constexpr int32_t kMaxStates = 64;
constexpr double kMaxShift = 1e6;

// Query rows a state buffer spans per (state, head): B * Sq dense, total_q packed.
int64_t state_rows(const Problem& p) { return p.q_layout == AF_SEQ_PACKED ? p.total_q : p.batch * p.seq_q; }
}  // namespace

double merge_shift(const MergeSpec& m, int64_t st) {
  return m.lse_shift.empty() ? 0.0 : m.lse_shift[static_cast<size_t>(st)];
}

KeyRange merge_range(const MergeSpec& m, int64_t st, int64_t sk) {
  const int64_t a = std::min(m.cuts[static_cast<size_t>(st)], sk);
  const int64_t b = std::min(m.cuts[static_cast<size_t>(st) + 1], sk);
  return {a, b};
}

std::string set_merge_fields(Case& c) {
  Problem& p = c.problem;
  const MergeSpec& m = c.merge;
  if (m.cuts.size() < 2) return "a merge case needs at least one state (n_states + 1 cuts)";
  if (m.layout != 0 && m.layout != 1) return "state layout must be 0 (state-major) or 1 (token-major)";
  if (m.pad < 0 || m.pad > 64) return "state pad must be 0 .. 64";
  p.n_states = static_cast<int32_t>(m.cuts.size() - 1);
  const int64_t n = p.n_states, hs = p.head_dim_v + m.pad, packed = p.q_layout == AF_SEQ_PACKED;
  const int64_t sq = packed ? 0 : p.seq_q, rows = state_rows(p);
  if (m.layout == 0) {  // [n, B, Sq, Hq, Dv + pad] (packed: [n, total_q, Hq, Dv + pad])
    const int64_t ss = p.heads_q * hs;
    p.state_o_stride[0] = rows * ss;
    p.state_o_stride[1] = sq * ss;
    p.state_o_stride[2] = ss;
    p.state_o_stride[3] = hs;
    p.state_lse_stride[0] = p.batch * p.heads_q * p.seq_q;
    p.state_lse_stride[1] = p.heads_q * p.seq_q;
    p.state_lse_stride[2] = p.seq_q;
    p.state_lse_stride[3] = 1;
  } else {  // [B, Sq, n, Hq, Dv + pad]; LSE [B, Hq, Sq, n]
    const int64_t ss = n * p.heads_q * hs;
    p.state_o_stride[0] = p.heads_q * hs;
    p.state_o_stride[1] = sq * ss;
    p.state_o_stride[2] = ss;
    p.state_o_stride[3] = hs;
    p.state_lse_stride[0] = 1;
    p.state_lse_stride[1] = p.heads_q * p.seq_q * n;
    p.state_lse_stride[2] = p.seq_q * n;
    p.state_lse_stride[3] = n;
  }
  return {};
}

std::string set_merge(Case& c, std::vector<int64_t> cuts, std::vector<double> lse_shift, int32_t layout, int64_t pad) {
  c.merge = MergeSpec{std::move(cuts), std::move(lse_shift), layout, pad};
  return set_merge_fields(c);
}

std::string parse_merge(const std::string& cuts, const std::string& shifts, bool token_major, int64_t pad, Case& c) {
  auto split = [](const std::string& t, std::vector<std::string>& out) {
    size_t at = 0;
    while (at <= t.size()) {
      const size_t comma = std::min(t.find(',', at), t.size());
      out.push_back(t.substr(at, comma - at));
      at = comma + 1;
    }
  };
  std::vector<std::string> ct, st;
  split(cuts, ct);
  if (!shifts.empty()) split(shifts, st);
  std::vector<int64_t> cv;
  std::vector<double> sv;
  for (const std::string& x : ct) {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(x.data(), x.data() + x.size(), v);
    if (ec != std::errc() || end != x.data() + x.size() || x.empty())
      return "merge cuts '" + cuts + "' are not integers 0,C1,...,Sk";
    cv.push_back(v);
  }
  for (const std::string& x : st) {
    double v = 0;
    const auto [end, ec] = std::from_chars(x.data(), x.data() + x.size(), v);
    if (x == "-inf") v = -INFINITY;
    else if (ec != std::errc() || end != x.data() + x.size() || x.empty())
      return "merge shift '" + shifts + "' is not numbers (or -inf), one per state";
    sv.push_back(v);
  }
  if (std::string e = set_merge(c, cv, sv, token_major ? 1 : 0, pad); !e.empty()) return e;
  return validate_merge(c);
}

std::string validate_merge(const Case& c) {
  const Problem& p = c.problem;
  const MergeSpec& m = c.merge;
  if (!is_merge(p)) {
    if (!m.cuts.empty() || !m.lse_shift.empty()) return "merge cuts or shifts given, but the problem has no states";
    return {};
  }
  if (p.n_states > kMaxStates) return "n_states " + std::to_string(p.n_states) + " exceeds 64";
  if (static_cast<int64_t>(m.cuts.size()) != p.n_states + 1)
    return "a merge case of " + std::to_string(p.n_states) + " states needs " + std::to_string(p.n_states + 1) +
           " cuts, not " + std::to_string(m.cuts.size());
  if (m.cuts.front() != 0 || m.cuts.back() != p.seq_k)
    return "merge cuts must run from 0 to Sk = " + std::to_string(p.seq_k);
  for (size_t i = 1; i < m.cuts.size(); ++i)
    if (m.cuts[i] < m.cuts[i - 1]) return "merge cuts must not decrease";
  if (!m.lse_shift.empty() && static_cast<int64_t>(m.lse_shift.size()) != p.n_states)
    return "merge shifts: one per state (" + std::to_string(p.n_states) + "), not " + std::to_string(m.lse_shift.size());
  for (double s : m.lse_shift)
    if (!(std::isfinite(s) && std::fabs(s) <= kMaxShift) && s != -INFINITY)
      return "merge shift " + shortest(s) + " must be finite within 1e6, or -inf (the state dropped)";
  if (p.dtype != AF_DTYPE_F32 && p.dtype != AF_DTYPE_F16 && p.dtype != AF_DTYPE_BF16)
    return std::string("merge cases take f32, f16 or bf16 states, not ") + dtype_name(p.dtype);
  if (c.pass != Pass::kFwd) return "a merge has no backward pass";
  if (p.variants) return "merge cases take no score variants";
  Case copy = c;
  if (std::string e = set_merge_fields(copy); !e.empty()) return e;
  for (int i = 0; i < 4; ++i)
    if (copy.problem.state_o_stride[i] != p.state_o_stride[i] || copy.problem.state_lse_stride[i] != p.state_lse_stride[i])
      return "the state strides do not follow the merge layout and pad (set_merge_fields)";
  return {};
}

std::string describe_merge(const Case& c) {
  if (!is_merge(c.problem)) return {};
  std::string t = " merge=" + std::to_string(c.problem.n_states) + " cuts=";
  for (size_t i = 0; i < c.merge.cuts.size(); ++i) t += (i ? "," : "") + std::to_string(c.merge.cuts[i]);
  if (!c.merge.lse_shift.empty()) {
    t += " shift=";
    for (size_t i = 0; i < c.merge.lse_shift.size(); ++i) t += (i ? "," : "") + shortest(c.merge.lse_shift[i]);
  }
  if (c.merge.layout == 1) t += " state-layout=token";
  if (c.merge.pad) t += " pad=" + std::to_string(c.merge.pad);
  return t;
}

int64_t state_o_elements(const Problem& p) {
  if (!is_merge(p)) return 0;
  const int64_t rows = state_rows(p);
  if (rows == 0 || p.heads_q == 0 || p.head_dim_v == 0) return 0;
  const int64_t* st = p.state_o_stride;
  const int64_t bs = p.q_layout == AF_SEQ_PACKED ? 0 : (p.batch - 1) * st[1];
  const int64_t ss = (p.q_layout == AF_SEQ_PACKED ? rows - 1 : p.seq_q - 1) * st[2];
  return (p.n_states - 1) * st[0] + bs + ss + (p.heads_q - 1) * st[3] + p.head_dim_v;
}

int64_t state_lse_elements(const Problem& p) {
  if (!is_merge(p) || p.batch * p.heads_q * p.seq_q == 0) return 0;
  const int64_t* st = p.state_lse_stride;
  return (p.n_states - 1) * st[0] + (p.batch - 1) * st[1] + (p.heads_q - 1) * st[2] + (p.seq_q - 1) * st[3] + 1;
}

int64_t state_o_offset(const Problem& p, const std::vector<int32_t>& cu_seqlens_q, int64_t st, int64_t b, int64_t s,
                       int64_t h, int64_t d) {
  const int64_t* x = p.state_o_stride;
  const int64_t row = p.q_layout == AF_SEQ_PACKED ? (cu_seqlens_q[static_cast<size_t>(b)] + s) * x[2]
                                                  : b * x[1] + s * x[2];
  return st * x[0] + row + h * x[3] + d;
}

int64_t state_lse_offset(const Problem& p, int64_t st, int64_t b, int64_t h, int64_t s) {
  const int64_t* x = p.state_lse_stride;
  return st * x[0] + b * x[1] + h * x[2] + s * x[3];
}

// ---- the merge sweep -------------------------------------------------------------------------------------
std::vector<Case> merge_sweep_grid(uint64_t base_seed, int32_t dtype) {
  std::vector<Case> out;
  const std::string pre = dtype == AF_DTYPE_F32 ? "" : std::string(dtype_name(dtype)) + "-";
  auto add = [&](Case c, const std::string& label, std::vector<int64_t> cuts, std::vector<double> shift = {},
                 int32_t layout = 0, int64_t pad = 0) {
    c.problem.dtype = dtype;
    if (has_sequences(c.problem))
      if (std::string e = set_sequence_fields(c); !e.empty()) throw std::logic_error(label + ": " + e);
    if (std::string e = set_merge(c, std::move(cuts), std::move(shift), layout, pad); !e.empty())
      throw std::logic_error(label + ": " + e);
    c.label = pre + "merge-" + label;
    c.seed = grid_seed(base_seed, c.label);
    if (std::string e = validate(c); !e.empty()) throw std::logic_error(c.label + ": " + e);
    out.push_back(std::move(c));
  };
  auto dense = [](int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d, int64_t dv,
                  const char* mask = "none") {
    Problem p = make_problem(b, hq, hkv, sq, sk, d, dv);
    if (std::string e = parse_mask(mask, p); !e.empty()) throw std::logic_error(e);
    return make_case(p);
  };
  add(dense(2, 4, 2, 7, 29, 16, 16), "2-states", {0, 13, 29});
  add(dense(1, 2, 2, 33, 33, 32, 32, "causal-br"), "2-states-causal", {0, 17, 33});
  add(dense(1, 4, 1, 5, 70, 8, 24), "9-states-dv24", {0, 8, 8, 20, 33, 33, 40, 64, 70, 70});
  add(dense(1, 2, 1, 16, 16, 16, 16, "causal-tl"), "empty-states-causal-tl", {0, 4, 12, 16});
  add(dense(1, 2, 2, 4, 0, 16, 16), "all-empty-sk0", {0, 0, 0});
  add(dense(1, 2, 1, 12, 4, 16, 16, "window:2,0-tl"), "all-empty-masked-rows", {0, 2, 4});
  add(dense(1, 2, 2, 6, 20, 16, 16), "all-dropped", {0, 10, 20}, {-INFINITY, -INFINITY});
  add(dense(1, 2, 2, 6, 20, 16, 16), "one-dropped", {0, 7, 20}, {0, -INFINITY});
  add(dense(1, 2, 2, 6, 30, 16, 16), "dominating-1e4", {0, 10, 20, 30}, {0, -1e4, 0});
  add(dense(1, 2, 2, 6, 30, 16, 16), "dominating-high", {0, 15, 30}, {1e4, 0});
  add(dense(1, 2, 2, 6, 30, 16, 16), "all-low-lse", {0, 10, 20, 30}, {-200, -201, -199});
  add(dense(1, 2, 2, 6, 30, 16, 16), "all-high-lse", {0, 15, 30}, {150, 151});
  add(dense(2, 4, 2, 5, 24, 16, 16), "token-major", {0, 9, 24}, {}, 1);
  add(dense(2, 4, 2, 5, 24, 16, 16), "padded-heads", {0, 9, 24}, {}, 0, 5);
  add(dense(1, 3, 1, 9, 40, 16, 12), "token-major-padded-3-states", {0, 11, 29, 40}, {}, 1, 3);
  // Chunked prefill / cascade (item 3): a query chunk of 4 tokens at q_offset 36 (causal bottom-right) as the
  // merge of the shared prefix [0, 32) and the rest [32, 40); and the same chunk split at its own keys.
  add(dense(2, 2, 1, 4, 40, 16, 16, "causal-br"), "cascade-prefix32", {0, 32, 40});
  add(dense(1, 2, 2, 8, 40, 16, 16, "causal-br"), "chunk-own-keys", {0, 32, 40});
  Case v = dense(3, 2, 1, 1, 0, 16, 16, "causal-br");  // varlen: packed q and K/V, empty and long sequences
  v.problem.q_layout = v.problem.kv_layout = AF_SEQ_PACKED;
  v.seqs.q = {5, 0, 9};
  v.seqs.k = {17, 3, 0};
  Case vt = v;
  {
    Case probe = v;
    if (std::string e = set_sequence_fields(probe); !e.empty()) throw std::logic_error("merge varlen: " + e);
    add(v, "varlen", {0, 6, probe.problem.seq_k});
    add(vt, "varlen-token-major-padded", {0, 2, 2, probe.problem.seq_k}, {}, 1, 2);
  }
  return out;
}

}  // namespace attnfuzz
