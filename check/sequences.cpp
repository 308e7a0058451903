// sequences.cpp - sequence-layout cases in the checker: per-sequence oracle, dense view of outputs, gap canaries.
#include "check/sequences.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

namespace attnfuzz {

OracleResult sequence_oracle(const Problem& p, const Tensors& t, const OracleOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  OracleResult R;
  R.problem = dense_view(p, t);
  const Problem& w = R.problem;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const size_t no = static_cast<size_t>(w.batch * w.seq_q * w.heads_q * w.head_dim_v);
  const size_t nl = static_cast<size_t>(w.batch * w.heads_q * w.seq_q);
  for (auto* x : {&R.o, &R.o_bound, &R.o_err}) x->assign(no, nan);
  for (auto* x : {&R.lse, &R.lse_bound, &R.lse_err}) x->assign(nl, nan);
  if (opts.baseline) {
    R.base_o.assign(no, std::numeric_limits<float>::quiet_NaN());
    R.base_lse.assign(nl, std::numeric_limits<float>::quiet_NaN());
  }
  R.rows.assign(nl, RowInfo{});
  R.compute_dtype = opts.compute_dtype < 0 ? p.dtype : opts.compute_dtype;
  R.compute_model = opts.compute_model;
  std::vector<char> sampled(static_cast<size_t>(w.seq_q), 0);
  // The variants of a layout (kLayoutVariants: sinks [Hq], ALiBi slopes [Hq], the softcap in the problem) are the
  // same for every sequence; each sequence's dense problem aligns ALiBi's positions to its own Sq_b, Sk_b.
  VariantInputs vars;
  vars.sinks = t.sinks.empty() ? nullptr : t.sinks.data();
  vars.alibi_slopes = t.alibi_slopes.empty() ? nullptr : t.alibi_slopes.data();
  for (int64_t b = 0; b < p.batch; ++b) {
    const Problem sp = sequence_problem(p, t, b);
    if (sp.seq_q < 1) continue;  // a sequence without queries has no output rows
    const Tensors st = sequence_tensors(p, t, b);
    const OracleResult S = compute_oracle(sp, st.q.data(), st.k.data(), st.v.data(), vars, opts);
    R.mp_bits_used = S.mp_bits_used;
    R.mp_backend_used = S.mp_backend_used;
    R.compute_dtype = S.compute_dtype;
    R.rows_computed += S.rows_computed;
    R.rows_fast += S.rows_fast;
    R.rows_mp += S.rows_mp;
    R.rows_fallback += S.rows_fallback;
    R.rows_outside += S.rows_outside;
    for (int64_t s : S.sampled) {
      sampled[static_cast<size_t>(s)] = 1;
      for (int64_t h = 0; h < w.heads_q; ++h) {
        const size_t dl = R.lse_at(b, h, s), sl = S.lse_at(0, h, s);
        R.rows[dl] = S.rows[sl];
        R.lse[dl] = S.lse[sl];
        R.lse_bound[dl] = S.lse_bound[sl];
        R.lse_err[dl] = S.lse_err[sl];
        if (!S.base_lse.empty() && !R.base_lse.empty()) R.base_lse[dl] = S.base_lse[sl];
        for (int64_t d = 0; d < w.head_dim_v; ++d) {
          const size_t di = R.o_at(b, s, h, d), si = S.o_at(0, s, h, d);
          R.o[di] = S.o[si];
          R.o_bound[di] = S.o_bound[si];
          R.o_err[di] = S.o_err[si];
          if (!S.base_o.empty() && !R.base_o.empty()) R.base_o[di] = S.base_o[si];
        }
      }
    }
  }
  for (int64_t s = 0; s < w.seq_q; ++s)
    if (sampled[static_cast<size_t>(s)]) R.sampled.push_back(s);
  R.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return R;
}

void outputs_to_view(const Problem& p, const Tensors& t, const std::vector<float>& o, const std::vector<float>& lse,
                     float fill, std::vector<float>& view_o, std::vector<float>& view_lse) {
  const Problem w = dense_view(p, t);
  view_o.assign(static_cast<size_t>(o_elements(w)), fill);
  view_lse.assign(lse.empty() ? 0 : static_cast<size_t>(lse_elements(w)), fill);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < seq_len_q(p, t, b); ++s)
      for (int64_t h = 0; h < p.heads_q; ++h) {
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          view_o[static_cast<size_t>(o_index(w, b, s, h, d))] = o[static_cast<size_t>(o_offset(p, t, b, s, h, d))];
        if (!lse.empty())
          view_lse[static_cast<size_t>(lse_index(w, b, h, s))] = lse[static_cast<size_t>(lse_offset(p, t, b, h, s))];
      }
}

int64_t output_gap_writes(const Problem& p, const Tensors& t, const std::vector<float>& lse, uint32_t poison,
                          std::string& first, int64_t& first_offset, uint32_t& first_bits) {
  int64_t n = 0;
  first.clear();
  if (lse.empty()) return 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = seq_len_q(p, t, b); s < p.seq_q; ++s)
      for (int64_t h = 0; h < p.heads_q; ++h) {
        const int64_t off = lse_offset(p, t, b, h, s);
        const uint32_t bits = std::bit_cast<uint32_t>(lse[static_cast<size_t>(off)]);
        if (bits == poison) continue;
        if (n++ == 0) {
          first = "LSE row s=" + std::to_string(s) + " h=" + std::to_string(h) + " of " + sequence_text(p, t, b) +
                  " is past the sequence's last query but was written";
          first_offset = off * 4;
          first_bits = bits;
        }
      }
  return n;
}

Tensors sequence_view_tensors(const Problem& p, const Tensors& t) {
  const Problem w = dense_view(p, t);
  Tensors out;
  out.q.assign(static_cast<size_t>(q_elements(w)), 0.0f);
  out.k.assign(static_cast<size_t>(std::max<int64_t>(0, k_elements(w))), 0.0f);
  out.v.assign(static_cast<size_t>(std::max<int64_t>(0, v_elements(w))), 0.0f);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t s = 0; s < seq_len_q(p, t, b); ++s)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim; ++d) out.q[q_index(w, b, s, h, d)] = t.q[q_offset(p, t, b, s, h, d)];
    for (int64_t s = 0; s < seq_len_k(p, t, b); ++s)
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        for (int64_t d = 0; d < p.head_dim; ++d) out.k[k_index(w, b, s, h, d)] = t.k[k_offset(p, t, b, s, h, d)];
        for (int64_t d = 0; d < p.head_dim_v; ++d) out.v[v_index(w, b, s, h, d)] = t.v[v_offset(p, t, b, s, h, d)];
      }
  }
  return out;
}

std::string sequence_text(const Problem& p, const Tensors& t, int64_t b) {
  const int64_t sq = seq_len_q(p, t, b), sk = seq_len_k(p, t, b), slots = seq_slots_k(p, t, b);
  std::string s = "sequence " + std::to_string(b) + " (" + std::to_string(sq) + " query token(s), " +
                  std::to_string(sk) + " key(s)";
  if (p.kv_capacity > 0) s += " used of " + std::to_string(slots) + " slot(s)";
  if (p.q_layout == AF_SEQ_PACKED)
    s += "; packed q rows [" + std::to_string(t.cu_seqlens_q[b]) + ", " + std::to_string(t.cu_seqlens_q[b + 1]) + ")";
  if (p.kv_layout == AF_SEQ_PACKED) {
    s += "; packed key rows [" + std::to_string(t.cu_seqlens_k[b]) + ", " +
         std::to_string(t.cu_seqlens_k[b] + sk) + ")";
    s += ", the next row " + std::to_string(t.cu_seqlens_k[b] + sk) + " is " +
         (sk < slots ? "its capacity tail (poison)"
                     : (b + 1 < p.batch ? "sequence " + std::to_string(b + 1) + "'s first key" : "past the last sequence"));
  } else if (p.kv_layout == AF_SEQ_PAGED) {
    s += "; pages";
    const int64_t np = (sk + p.page_size - 1) / p.page_size;
    for (int64_t j = 0; j < np && j < 8; ++j)
      s += (j ? "," : " ") + std::to_string(t.block_table[b * p.max_pages_per_seq + j]);
    if (np > 8) s += ",...";
    if (np == 0) s += " none";
    s += " of " + std::to_string(p.page_size) + " tokens; key " + std::to_string(sk) + " is the boundary";
    if (sk % p.page_size) s += " (slots " + std::to_string(sk % p.page_size) + ".." + std::to_string(p.page_size - 1) +
                               " of its last page are poison)";
  } else if (p.kv_capacity > 0) {
    s += "; keys [" + std::to_string(sk) + ", " + std::to_string(slots) + ") are its capacity tail (poison)";
  }
  return s + ")";
}

}  // namespace attnfuzz
