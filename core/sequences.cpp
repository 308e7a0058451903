// sequences.cpp - varlen / KV cache / paged KV cases: derived problem fields, offsets, dense view, generation.
#include "core/sequences.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <stdexcept>

namespace attnfuzz {

namespace {

int64_t pages_for(int64_t tokens, int64_t page) { return page > 0 ? (tokens + page - 1) / page : 0; }

std::string list_text(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

bool has_sequences(const Problem& p) {
  return p.q_layout != AF_SEQ_DENSE || p.kv_layout != AF_SEQ_DENSE || p.kv_capacity > 0;
}

uint32_t feature_bits(const Problem& p) {
  uint32_t f = 0;
  if (p.q_layout == AF_SEQ_PACKED) f |= AF_FEATURE_Q_PACKED;
  if (p.kv_layout == AF_SEQ_PACKED) f |= AF_FEATURE_KV_PACKED;
  if (p.kv_layout == AF_SEQ_PAGED) f |= AF_FEATURE_KV_PAGED;
  if (p.kv_capacity > 0) f |= AF_FEATURE_SEQUSED_K;
  return f;
}

std::string layout_name(const Problem& p) {
  if (p.kv_layout == AF_SEQ_PAGED) return p.q_layout == AF_SEQ_PACKED ? "paged+varlen-q" : "paged";
  std::string s;
  if (p.kv_layout == AF_SEQ_PACKED)
    s = p.q_layout == AF_SEQ_PACKED ? "varlen" : "varlen-k";
  else if (p.q_layout == AF_SEQ_PACKED)
    s = p.kv_capacity > 0 ? "kvcache+varlen-q" : "varlen-q";
  else
    return p.kv_capacity > 0 ? "kvcache" : "dense";
  if (p.kv_layout == AF_SEQ_PACKED && p.kv_capacity > 0) s += "+seqused";
  return s;
}

std::string set_sequence_fields(Case& c) {
  Problem& p = c.problem;
  const SeqLayout& s = c.seqs;
  const int64_t B = p.batch;
  if (B < 1) return "batch = " + std::to_string(B) + " is invalid: need >= 1";
  auto sized = [&](const std::vector<int64_t>& v, const char* what) -> std::string {
    if (static_cast<int64_t>(v.size()) != B)
      return std::string(what) + " lists " + std::to_string(v.size()) + " length(s) for batch = " +
             std::to_string(B) + " sequences";
    for (int64_t x : v)
      if (x < 0 || x > (int64_t{1} << 30)) return std::string(what) + " holds an invalid length " + std::to_string(x);
    return {};
  };
  if (p.q_layout != AF_SEQ_DENSE && p.q_layout != AF_SEQ_PACKED)
    return "q layout " + std::to_string(p.q_layout) + " is unknown (dense or packed)";
  if (p.kv_layout != AF_SEQ_DENSE && p.kv_layout != AF_SEQ_PACKED && p.kv_layout != AF_SEQ_PAGED)
    return "kv layout " + std::to_string(p.kv_layout) + " is unknown (dense, packed or paged)";
  // q
  p.total_q = 0;
  if (p.q_layout == AF_SEQ_PACKED) {
    if (auto e = sized(s.q, "seqlens-q"); !e.empty()) return e;
    p.total_q = std::accumulate(s.q.begin(), s.q.end(), int64_t{0});
    p.seq_q = *std::max_element(s.q.begin(), s.q.end());
    if (p.seq_q < 1) return "every sequence has 0 query tokens: nothing to check";
  } else if (!s.q.empty()) {
    return "seqlens-q given but q is dense (use a packed q layout, e.g. --layout varlen)";
  }
  // K / V
  if (!s.used.empty())
    if (auto e = sized(s.used, "seqused-k"); !e.empty()) return e;
  p.total_k = 0;
  p.kv_capacity = 0;
  p.page_size = p.kv_layout == AF_SEQ_PAGED ? p.page_size : 0;
  p.num_pages = 0;
  p.max_pages_per_seq = 0;
  std::vector<int64_t> used = s.used;
  if (p.kv_layout == AF_SEQ_DENSE) {
    if (!s.k.empty()) return "seqlens-k given but K/V are dense (use --layout varlen or paged)";
    if (s.spare_pages || s.page_order) return "page order and spare pages apply to paged K/V only";
    for (size_t b = 0; b < used.size(); ++b)
      if (used[b] > p.seq_k)
        return "seqused-k[" + std::to_string(b) + "] = " + std::to_string(used[b]) +
               " exceeds the cache capacity sk = " + std::to_string(p.seq_k);
    if (!used.empty()) {
      if (p.seq_k < 1) return "a KV cache (seqused-k) needs a capacity sk >= 1";
      p.kv_capacity = p.seq_k;
    }
  } else if (p.kv_layout == AF_SEQ_PACKED) {
    if (auto e = sized(s.k, "seqlens-k"); !e.empty()) return e;
    if (s.spare_pages || s.page_order) return "page order and spare pages apply to paged K/V only";
    p.total_k = std::accumulate(s.k.begin(), s.k.end(), int64_t{0});
    const int64_t slots = *std::max_element(s.k.begin(), s.k.end());
    for (size_t b = 0; b < used.size(); ++b)
      if (used[b] > s.k[b])
        return "seqused-k[" + std::to_string(b) + "] = " + std::to_string(used[b]) +
               " exceeds the sequence's packed length seqlens-k = " + std::to_string(s.k[b]);
    if (!used.empty()) {
      if (slots < 1) return "seqused-k needs a sequence with seqlens-k >= 1";
      p.kv_capacity = slots;
      p.seq_k = *std::max_element(used.begin(), used.end());
    } else {
      p.seq_k = slots;
    }
  } else {  // paged
    if (p.page_size < 1 || p.page_size > 1024)
      return "page size " + std::to_string(p.page_size) + " is invalid: need 1 .. 1024";
    if (used.empty()) return "paged K/V need seqused-k (the used length of every sequence)";
    if (s.spare_pages < 0 || s.spare_pages > (int64_t{1} << 20))
      return "spare pages = " + std::to_string(s.spare_pages) + " is invalid";
    std::vector<int64_t> slots = s.k.empty() ? used : s.k;
    if (!s.k.empty())
      if (auto e = sized(s.k, "seqlens-k"); !e.empty()) return e;
    int64_t referenced = 0, most = 1;
    for (int64_t b = 0; b < B; ++b) {
      if (used[b] > slots[b])
        return "seqused-k[" + std::to_string(b) + "] = " + std::to_string(used[b]) +
               " exceeds the sequence's slots seqlens-k = " + std::to_string(slots[b]);
      const int64_t n = pages_for(slots[b], p.page_size);
      referenced += n;
      most = std::max(most, n);
    }
    p.num_pages = referenced + s.spare_pages;
    if (p.num_pages < 1) return "the page pool is empty: give a sequence keys or a spare page";
    p.max_pages_per_seq = most;
    p.kv_capacity = most * p.page_size;
    p.seq_k = *std::max_element(used.begin(), used.end());
  }
  if (!has_sequences(p)) {
    if (s.page_order || s.spare_pages) return "page order and spare pages apply to paged K/V only";
    return {};
  }
  set_contiguous_strides(p);
  if (p.q_layout == AF_SEQ_PACKED) p.q_stride[0] = p.o_stride[0] = 0;
  if (p.kv_layout == AF_SEQ_PACKED) p.k_stride[0] = p.v_stride[0] = 0;
  if (p.kv_layout == AF_SEQ_PAGED) {
    p.k_stride[0] = p.page_size * p.k_stride[1];
    p.v_stride[0] = p.page_size * p.v_stride[1];
  }
  for (int i = 0; i < 3; ++i) {
    p.do_stride[i] = p.o_stride[i];
    p.dq_stride[i] = p.q_stride[i];
    p.dk_stride[i] = p.k_stride[i];
    p.dv_stride[i] = p.v_stride[i];
  }
  return {};
}

std::string validate_sequences(const Case& c) {
  const Problem& p = c.problem;
  const SeqLayout& s = c.seqs;
  if (!has_sequences(p)) {
    if (!s.q.empty() || !s.k.empty() || !s.used.empty() || s.page_order || s.spare_pages)
      return "sequence lengths are given but the problem's layouts are dense (no seqused-k)";
    return {};
  }
  Case d = c;
  if (std::string e = set_sequence_fields(d); !e.empty()) return e;
  const Problem& q = d.problem;
  auto same3 = [](const int64_t* a, const int64_t* b) { return std::equal(a, a + 3, b); };
  if (q.seq_q != p.seq_q || q.seq_k != p.seq_k || q.total_q != p.total_q || q.total_k != p.total_k ||
      q.kv_capacity != p.kv_capacity || q.page_size != p.page_size || q.num_pages != p.num_pages ||
      q.max_pages_per_seq != p.max_pages_per_seq)
    return "the problem's sequence fields (seq_q, seq_k, totals, capacity, pages) disagree with the sequence "
           "lengths (set_sequence_fields derives them)";
  if (!same3(q.q_stride, p.q_stride) || !same3(q.k_stride, p.k_stride) || !same3(q.v_stride, p.v_stride) ||
      !same3(q.o_stride, p.o_stride) || !same3(q.lse_stride, p.lse_stride))
    return "sequence layouts use contiguous strides in the layout (custom strides are not supported)";
  if (c.explicit_values && finite_domain(c.values.domain) &&
      c.explicit_values->q.size() == static_cast<size_t>(q_elements(p)) &&
      c.explicit_values->k.size() == static_cast<size_t>(k_elements(p)) &&
      c.explicit_values->v.size() == static_cast<size_t>(v_elements(p))) {
    Tensors t;  // the sequences' tokens must be finite (the gaps are poison, not values)
    detail::build_sequence_arrays(c, t);
    const ExplicitValues& e = *c.explicit_values;
    for (int64_t b = 0; b < p.batch; ++b) {
      bool bad = false;
      for (int64_t s = 0; s < seq_len_q(p, t, b) && !bad; ++s)
        for (int64_t h = 0; h < p.heads_q; ++h)
          for (int64_t d = 0; d < p.head_dim; ++d)
            bad |= !value_in_domain(e.q[q_offset(p, t, b, s, h, d)], c.values.domain);
      for (int64_t s = 0; s < seq_len_k(p, t, b) && !bad; ++s)
        for (int64_t h = 0; h < p.heads_kv; ++h) {
          for (int64_t d = 0; d < p.head_dim; ++d)
            bad |= !value_in_domain(e.k[k_offset(p, t, b, s, h, d)], c.values.domain);
          for (int64_t d = 0; d < p.head_dim_v; ++d)
            bad |= !value_in_domain(e.v[v_offset(p, t, b, s, h, d)], c.values.domain);
        }
      if (bad)
        return "explicit values of sequence " + std::to_string(b) + " hold a value outside the " +
               value_domain_name(c.values.domain) + " value domain" +
               (c.values.domain == ValueDomain::kActivations ? " (finite, |x| <= 64)" : " (a NaN or Inf)");
    }
  }
  for (const SpecialValue& sv : c.values.specials)
    if (sv.placement != Placement::kRandom && sv.placement != Placement::kAt)
      return "special value '" + to_string(sv) +
             "': sequence layouts take random or at= placements only (visible / masked / hidden are judged "
             "per sequence)";
  return {};
}

std::string describe_sequences(const Case& c) {
  const Problem& p = c.problem;
  if (!has_sequences(p)) return {};
  std::string t = " layout=" + layout_name(p);
  if (!c.seqs.q.empty()) t += " seqlens-q=" + list_text(c.seqs.q);
  if (!c.seqs.k.empty()) t += " seqlens-k=" + list_text(c.seqs.k);
  if (!c.seqs.used.empty()) t += " seqused-k=" + list_text(c.seqs.used);
  if (p.kv_layout == AF_SEQ_PAGED) {
    t += " page-size=" + std::to_string(p.page_size) + " pages=" + std::to_string(p.num_pages);
    if (c.seqs.spare_pages) t += " spare-pages=" + std::to_string(c.seqs.spare_pages);
    char buf[40];
    std::snprintf(buf, sizeof buf, " page-order=0x%llx", static_cast<unsigned long long>(c.seqs.page_order));
    t += buf;
  }
  if (c.seqs.malformed.kind != Malformation::kNone) t += " malformed=" + to_string(c.seqs.malformed);
  return t;
}

// ------------------------------------------------------------------------------------------ lengths

int64_t seq_len_q(const Problem& p, const Tensors& t, int64_t b) {
  return p.q_layout == AF_SEQ_PACKED ? t.cu_seqlens_q[b + 1] - t.cu_seqlens_q[b] : p.seq_q;
}
int64_t seq_slots_k(const Problem& p, const Tensors& t, int64_t b) {
  if (p.kv_layout == AF_SEQ_PACKED) return t.cu_seqlens_k[b + 1] - t.cu_seqlens_k[b];
  if (p.kv_layout == AF_SEQ_PAGED) return p.kv_capacity;
  return p.seq_k;
}
int64_t seq_len_k(const Problem& p, const Tensors& t, int64_t b) {
  if (p.kv_capacity > 0 && !t.seqused_k.empty()) return t.seqused_k[b];
  return seq_slots_k(p, t, b);
}

int64_t q_offset(const Problem& p, const Tensors& t, int64_t b, int64_t s, int64_t h, int64_t d) {
  if (p.q_layout == AF_SEQ_PACKED) return (t.cu_seqlens_q[b] + s) * p.q_stride[1] + h * p.q_stride[2] + d;
  return q_index(p, b, s, h, d);
}
int64_t o_offset(const Problem& p, const Tensors& t, int64_t b, int64_t s, int64_t h, int64_t d) {
  if (p.q_layout == AF_SEQ_PACKED) return (t.cu_seqlens_q[b] + s) * p.o_stride[1] + h * p.o_stride[2] + d;
  return o_index(p, b, s, h, d);
}
namespace {
int64_t kv_offset(const Problem& p, const int64_t* stride, const Tensors& t, int64_t b, int64_t s, int64_t h,
                  int64_t d) {
  if (p.kv_layout == AF_SEQ_PAGED) {
    const int64_t page = t.block_table[b * p.max_pages_per_seq + s / p.page_size];
    return page * stride[0] + (s % p.page_size) * stride[1] + h * stride[2] + d;
  }
  if (p.kv_layout == AF_SEQ_PACKED) return (t.cu_seqlens_k[b] + s) * stride[1] + h * stride[2] + d;
  return b * stride[0] + s * stride[1] + h * stride[2] + d;
}
}  // namespace
int64_t k_offset(const Problem& p, const Tensors& t, int64_t b, int64_t s, int64_t h, int64_t d) {
  return kv_offset(p, p.k_stride, t, b, s, h, d);
}
int64_t v_offset(const Problem& p, const Tensors& t, int64_t b, int64_t s, int64_t h, int64_t d) {
  return kv_offset(p, p.v_stride, t, b, s, h, d);
}
int64_t lse_offset(const Problem& p, const Tensors&, int64_t b, int64_t h, int64_t s) {
  return lse_index(p, b, h, s);
}

// ---------------------------------------------------------------------------------------- dense views

Problem dense_view(const Problem& p, const Tensors& t) {
  if (!has_sequences(p)) return p;
  int64_t sk = 0;
  for (int64_t b = 0; b < p.batch; ++b) sk = std::max(sk, seq_len_k(p, t, b));
  return reshape_problem(p, p.batch, p.seq_q, sk, p.head_dim, p.head_dim_v);
}

Problem sequence_problem(const Problem& p, const Tensors& t, int64_t b) {
  return reshape_problem(p, 1, seq_len_q(p, t, b), seq_len_k(p, t, b), p.head_dim, p.head_dim_v);
}

Tensors sequence_tensors(const Problem& p, const Tensors& t, int64_t b) {
  const Problem sp = sequence_problem(p, t, b);
  Tensors out;
  out.q.assign(static_cast<size_t>(std::max<int64_t>(0, q_elements(sp))), 0.0f);
  out.k.assign(static_cast<size_t>(std::max<int64_t>(0, k_elements(sp))), 0.0f);
  out.v.assign(static_cast<size_t>(std::max<int64_t>(0, v_elements(sp))), 0.0f);
  for (int64_t s = 0; s < sp.seq_q; ++s)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t d = 0; d < p.head_dim; ++d) out.q[q_index(sp, 0, s, h, d)] = t.q[q_offset(p, t, b, s, h, d)];
  for (int64_t s = 0; s < sp.seq_k; ++s)
    for (int64_t h = 0; h < p.heads_kv; ++h) {
      for (int64_t d = 0; d < p.head_dim; ++d) out.k[k_index(sp, 0, s, h, d)] = t.k[k_offset(p, t, b, s, h, d)];
      for (int64_t d = 0; d < p.head_dim_v; ++d) out.v[v_index(sp, 0, s, h, d)] = t.v[v_offset(p, t, b, s, h, d)];
    }
  return out;
}

void fill_outside(const Problem& p, Tensors& t, uint32_t bits) {
  if (p.kv_layout == AF_SEQ_DENSE && p.kv_capacity == 0) return;  // q is never gapped (cu_seqlens_q is dense)
  const float gap = std::bit_cast<float>(bits);
  std::vector<char> in_k(t.k.size(), 0), in_v(t.v.size(), 0);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < seq_len_k(p, t, b); ++s)
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        for (int64_t d = 0; d < p.head_dim; ++d) in_k[k_offset(p, t, b, s, h, d)] = 1;
        for (int64_t d = 0; d < p.head_dim_v; ++d) in_v[v_offset(p, t, b, s, h, d)] = 1;
      }
  for (size_t i = 0; i < t.k.size(); ++i)
    if (!in_k[i]) t.k[i] = gap;
  for (size_t i = 0; i < t.v.size(); ++i)
    if (!in_v[i]) t.v[i] = gap;
}

namespace detail {

void build_sequence_arrays(const Case& c, Tensors& t) {
  const Problem& p = c.problem;
  const SeqLayout& s = c.seqs;
  const int64_t B = p.batch;
  auto prefix = [&](const std::vector<int64_t>& len, std::vector<int32_t>& cu) {
    cu.assign(static_cast<size_t>(B) + 1, 0);
    for (int64_t b = 0; b < B; ++b) cu[b + 1] = static_cast<int32_t>(cu[b] + len[b]);
  };
  if (p.q_layout == AF_SEQ_PACKED) prefix(s.q, t.cu_seqlens_q);
  if (p.kv_layout == AF_SEQ_PACKED) prefix(s.k, t.cu_seqlens_k);
  if (p.kv_capacity > 0) t.seqused_k.assign(s.used.begin(), s.used.end());
  t.malformed = s.malformed;  // applied at upload only (malformed_arrays)
  if (p.kv_layout != AF_SEQ_PAGED) return;
  const std::vector<int64_t>& slots = s.k.empty() ? s.used : s.k;
  int64_t referenced = 0;
  for (int64_t b = 0; b < B; ++b) referenced += pages_for(slots[b], p.page_size);
  // Pool index of the i-th page in sequence order (referenced pages first, then spares).
  std::vector<int32_t> pool(static_cast<size_t>(p.num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  if (s.page_order != 0) {
    Rng rng(s.page_order, 7);
    for (size_t i = pool.size(); i > 1; --i) std::swap(pool[i - 1], pool[rng.below(i)]);
  }
  const int32_t filler = s.spare_pages > 0 ? pool[static_cast<size_t>(referenced)] : 0;
  t.block_table.assign(static_cast<size_t>(B * p.max_pages_per_seq), filler);
  int64_t next = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < pages_for(slots[b], p.page_size); ++j)
      t.block_table[b * p.max_pages_per_seq + j] = pool[static_cast<size_t>(next++)];
}

Tensors generate_sequences(const Case& c) {
  const Problem& p = c.problem;
  Tensors out;
  build_sequence_arrays(c, out);
  if (c.explicit_values) {
    out.q = c.explicit_values->q;
    out.k = c.explicit_values->k;
    out.v = c.explicit_values->v;
    return out;
  }
  // The values of the dense view (so sequence b of a packed batch holds what the same case would hold
  // dense), scattered into the layout; the rest is gap poison.
  Case vc = c;
  vc.problem = dense_view(p, out);
  vc.seqs = {};
  vc.merge = {};  // the dense view of a merge case's q, k, v: the states are built from them later (check/merge.h)
  vc.label.clear();
  // An at= position past every sequence (e.g. in a KV cache's capacity tail) has no place in the view.
  int64_t dropped = 0;
  std::erase_if(vc.values.specials, [&](const SpecialValue& sv) {
    const bool out = sv.placement == Placement::kAt &&
                     sv.s >= (sv.tensor == Tensor::kQ ? vc.problem.seq_q : vc.problem.seq_k);
    dropped += out ? sv.count : 0;
    return out;
  });
  const Tensors dv = generate(vc);
  const float gap = std::bit_cast<float>(kSeqGapBits);
  out.q.assign(static_cast<size_t>(q_elements(p)), gap);
  out.k.assign(static_cast<size_t>(k_elements(p)), gap);
  out.v.assign(static_cast<size_t>(v_elements(p)), gap);
  const Problem& w = vc.problem;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t s = 0; s < seq_len_q(p, out, b); ++s)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim; ++d) out.q[q_offset(p, out, b, s, h, d)] = dv.q[q_index(w, b, s, h, d)];
    for (int64_t s = 0; s < seq_len_k(p, out, b); ++s)
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        for (int64_t d = 0; d < p.head_dim; ++d) out.k[k_offset(p, out, b, s, h, d)] = dv.k[k_index(w, b, s, h, d)];
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          out.v[v_offset(p, out, b, s, h, d)] = dv.v[v_index(w, b, s, h, d)];
      }
  }
  out.unplaced = dv.unplaced + dropped;
  for (PlacedSpecial ps : dv.placed) {
    const bool isq = ps.tensor == Tensor::kQ;
    if (ps.s >= (isq ? seq_len_q(p, out, ps.b) : seq_len_k(p, out, ps.b))) {
      ++out.unplaced;  // it fell past the end of its sequence
      continue;
    }
    ps.index = isq ? q_offset(p, out, ps.b, ps.s, ps.h, ps.d)
               : ps.tensor == Tensor::kK ? k_offset(p, out, ps.b, ps.s, ps.h, ps.d)
                                         : v_offset(p, out, ps.b, ps.s, ps.h, ps.d);
    out.placed.push_back(ps);
  }
  return out;
}

}  // namespace detail

}  // namespace attnfuzz

// ------------------------------------------------------------------------------------- the case space

namespace attnfuzz {

namespace space {

const std::vector<int64_t>& page_sizes() {
  static const std::vector<int64_t> p{16, 32, 64, 128, 256};
  return p;
}

std::vector<std::vector<int64_t>> seq_length_lists(int64_t max_len) {
  const std::vector<std::vector<int64_t>> all = {
      {17, 0, 33},          // a zero-length sequence between two
      {1, 1, 1, 1},         // single tokens
      {16, 32, 64, 128},    // residue 0 mod every tile
      {15, 31, 63, 127},    // residue -1
      {17, 33, 65, 129},    // residue +1 (a decode kv_len % 32 == 1)
      {3, 200, 5, 2},       // one long among short ones
      {7, 7, 7},            // equal lengths
      {113, 1, 0, 64},      // awkward, single, empty, tile
  };
  std::vector<std::vector<int64_t>> out;
  for (const auto& l : all)
    if (std::all_of(l.begin(), l.end(), [&](int64_t x) { return x <= max_len; })) out.push_back(l);
  return out;
}

}  // namespace space

const std::vector<std::string>& sequence_layouts() {
  static const std::vector<std::string> l{"varlen", "varlen-q", "varlen-k", "kvcache", "paged", "decode"};
  return l;
}

namespace {
// The layout's sweep without variants (layout_sweep_grid).
std::vector<Case> plain_layout_grid(const std::string& layout, uint64_t base_seed) {
  std::vector<Case> out;
  const auto lists = space::seq_length_lists();
  const std::vector<std::pair<int64_t, int64_t>> heads = {{1, 1}, {4, 2}, {4, 1}};
  const std::vector<int64_t> dims = {32, 59, 64};
  auto add = [&](Case c, const std::string& label) {
    if (std::string e = set_sequence_fields(c); !e.empty()) throw std::logic_error(label + ": " + e);
    c.label = label;
    std::replace(c.label.begin(), c.label.end(), ':', '=');  // labels stay usable in file names
    std::replace(c.label.begin(), c.label.end(), ',', '.');
    c.seed = grid_seed(base_seed, label);
    if (std::string e = validate(c); !e.empty()) throw std::logic_error(label + ": " + e);
    out.push_back(std::move(c));
  };
  auto base = [&](size_t i, int64_t batch, int64_t sq, int64_t sk, const std::string& mask) {
    const auto [hq, hkv] = heads[i % heads.size()];
    const int64_t d = dims[(i / 3) % dims.size()];
    Problem p = make_problem(batch, hq, hkv, sq, sk, d, d);
    if (std::string e = parse_mask(mask, p); !e.empty()) throw std::logic_error(e);
    return make_case(p);
  };
  auto tag = [](const std::vector<int64_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s;
  };
  auto name = [&](const Case& c) {
    return "-" + mask_to_string(c.problem) + "-h" + std::to_string(c.problem.heads_q) + "x" +
           std::to_string(c.problem.heads_kv) + "-d" + std::to_string(c.problem.head_dim);
  };
  size_t i = 0;
  if (layout == "varlen") {
    const std::vector<std::string> masks = {"none", "causal-br", "causal-tl", "window:8,0-br", "window:3,2-tl"};
    for (const auto& lq : lists)
      for (size_t m = 0; m < masks.size(); ++m, ++i) {
        Case c = base(i, static_cast<int64_t>(lq.size()), 1, 0, masks[m]);
        c.problem.q_layout = c.problem.kv_layout = AF_SEQ_PACKED;
        c.seqs.q = lq;
        c.seqs.k = lq;
        if (m % 2 == 1)  // cross lengths: Sk_b != Sq_b both ways
          for (size_t b = 0; b < lq.size(); ++b) c.seqs.k[b] = b % 2 ? lq[b] / 2 : lq[b] + 16 * (b + 1) + 1;
        add(c, "varlen-q" + tag(c.seqs.q) + "-k" + tag(c.seqs.k) + name(c));
      }
    for (const auto& lq : lists) {  // packed K/V with seqused_k below the packed length (padding between)
      Case c = base(i++, static_cast<int64_t>(lq.size()), 1, 0, "causal-br");
      c.problem.q_layout = c.problem.kv_layout = AF_SEQ_PACKED;
      c.seqs.q = lq;
      c.seqs.used = lq;
      c.seqs.k = lq;
      for (size_t b = 0; b < lq.size(); ++b) c.seqs.k[b] = lq[b] + 1 + static_cast<int64_t>(b) * 7;
      add(c, "varlen-seqused-q" + tag(c.seqs.q) + "-k" + tag(c.seqs.k) + name(c));
    }
  } else if (layout == "varlen-q" || layout == "varlen-k") {
    // One side packed, the other dense: packed q over a dense K/V of Sk keys that every sequence sees, or a
    // dense q of Sq rows per sequence over packed K/V.
    const bool packed_q = layout == "varlen-q";
    const std::vector<std::string> masks = {"none", "causal-br", "causal-tl", "window:8,0-br"};
    const std::vector<int64_t> dense = {16, 1, 33, 7, 64};
    for (const auto& l : lists)
      for (size_t m = 0; m < masks.size(); ++m, ++i) {
        const int64_t n = dense[i % dense.size()];
        Case c = base(i, static_cast<int64_t>(l.size()), packed_q ? 1 : n, packed_q ? n : 0, masks[m]);
        if (packed_q) {
          c.problem.q_layout = AF_SEQ_PACKED;
          c.seqs.q = l;
        } else {
          c.problem.kv_layout = AF_SEQ_PACKED;
          c.seqs.k = l;
        }
        add(c, layout + (packed_q ? "-q" + tag(l) + "-sk" + std::to_string(n) : "-sq" + std::to_string(n) + "-k" + tag(l)) +
                   name(c));
      }
  } else if (layout == "kvcache") {
    const std::vector<std::string> masks = {"none", "causal-br", "window:16,0-br"};
    const std::vector<int64_t> sqs = {1, 4, 16};
    for (const auto& used : lists)
      for (size_t m = 0; m < masks.size(); ++m, ++i) {
        const int64_t sq = sqs[(i + m) % sqs.size()];
        const int64_t cap = *std::max_element(used.begin(), used.end()) + 5;
        Case c = base(i, static_cast<int64_t>(used.size()), sq, cap, masks[m]);
        c.seqs.used = used;
        add(c, "kvcache-sq" + std::to_string(sq) + "-used" + tag(used) + "-cap" + std::to_string(cap) + name(c));
      }
  } else if (layout == "paged" || layout == "decode") {
    const bool decode = layout == "decode";
    const std::vector<std::string> masks = decode ? std::vector<std::string>{"none", "causal-br", "window:8,0-br"}
                                                  : std::vector<std::string>{"none", "causal-br", "causal-tl",
                                                                             "window:8,0-br"};
    const std::vector<int64_t> sqs = decode ? std::vector<int64_t>{1, 2, 1, 4, 8, 3} : std::vector<int64_t>{16, 7, 33, 1, 4};
    for (const auto& used : lists)
      for (size_t m = 0; m < masks.size(); ++m, ++i) {
        const int64_t sq = sqs[i % sqs.size()];
        Case c = base(i, static_cast<int64_t>(used.size()), sq, 0, masks[m]);
        c.problem.kv_layout = AF_SEQ_PAGED;
        c.problem.page_size = static_cast<int32_t>(space::page_sizes()[i % space::page_sizes().size()]);
        c.seqs.used = used;
        c.seqs.page_order = i % 3 ? 0x9e3779b9u + i : 0;  // two in three shuffled
        c.seqs.spare_pages = static_cast<int64_t>(i % 3);
        if (i % 4 == 1) {  // reserved slots beyond the used length (whole capacity pages)
          c.seqs.k = used;
          for (auto& x : c.seqs.k) x += c.problem.page_size;
        }
        add(c, layout + "-sq" + std::to_string(sq) + "-used" + tag(used) + "-p" +
                   std::to_string(c.problem.page_size) + (c.seqs.page_order ? "-shuffled" : "") + "-spare" +
                   std::to_string(c.seqs.spare_pages) + name(c));
      }
  }
  // Malformed metadata (docs/semantics.md "Malformed metadata"): each defect the layout's arrays can carry, once, on
  // the first well-formed case it fits: a cu_seqlens defect in the last sequence (a kernel that accepts it then reads
  // and writes nothing past the buffers, so the verdict is about the acceptance), others in sequence 1 when there is one.
  const size_t n = out.size();
  for (int k = 1; k <= static_cast<int>(Malformation::kPageUnusedOutOfPool); ++k)
    for (size_t j = 0; j < n; ++j) {
      Case c = out[j];
      const auto kind = static_cast<Malformation>(k);
      const bool cu = kind == Malformation::kCuQDecreasing || kind == Malformation::kCuKDecreasing ||
                      kind == Malformation::kCuKPastTotal;
      c.seqs.malformed = {kind, cu ? c.problem.batch - 1 : std::min<int64_t>(1, c.problem.batch - 1)};
      if (!validate_malformed(c).empty()) continue;
      const std::string label = std::string("malformed-") + malformation_name(c.seqs.malformed.kind) + "-" + c.label;
      add(std::move(c), label);
      break;
    }
  return out;
}

// A sequence-layout case of B = lengths' size: packed q and K/V (varlen) or a paged K/V of `sq` query tokens per
// sequence (decode), heads hq : hkv, D = d, the mask, the values; the score variants `score` with softcap `cap`.
Case layout_edge(bool paged, const std::vector<int64_t>& lengths, int64_t sq, int64_t hq, int64_t hkv, int64_t d,
                 const std::string& mask, ValueDist dist, uint32_t score, float cap) {
  Case c = make_case(make_problem(static_cast<int64_t>(lengths.size()), hq, hkv, sq, 0, d, d));
  if (std::string e = parse_mask(mask, c.problem); !e.empty()) throw std::logic_error(e);
  c.values.dist = dist;
  if (paged) {
    c.problem.kv_layout = AF_SEQ_PAGED;
    c.problem.page_size = 16;
    c.seqs.used = lengths;
    c.seqs.page_order = 0x5eed;
  } else {
    c.problem.q_layout = c.problem.kv_layout = AF_SEQ_PACKED;
    c.seqs.q = lengths;
    c.seqs.k = lengths;
    for (size_t b = 0; b < lengths.size(); b += 2) c.seqs.k[b] += 9;  // unequal Sk_b - Sq_b: ALiBi's offsets differ
  }
  if (std::string e = set_sequence_fields(c); !e.empty()) throw std::logic_error(e);
  if (std::string e = set_variants(c, score, cap); !e.empty()) throw std::logic_error(e);
  return c;
}

// The variant edges of a layout (score: the sweep's kLayoutVariants): a dominant sink where a window hides a token's
// first KV splits (a split-KV kernel's empty splits), logits far past a small cap, ALiBi over 12 heads (not a power
// of two) with per-sequence offsets.
std::vector<Case> layout_variant_edges(const std::string& layout, uint32_t score) {
  std::vector<Case> out;
  const bool paged = layout == "paged" || layout == "decode";
  if (!paged && layout != "varlen") return out;  // varlen-q / varlen-k / kvcache: the grid's cases only
  const std::vector<int64_t> long_short = paged ? std::vector<int64_t>{200, 64, 0} : std::vector<int64_t>{40, 17, 0};
  Case sink = layout_edge(paged, long_short, 2, 4, 1, 32, "window:16,0-br", {}, score, 30.0f);
  sink.variants.sink_range = 8;  // some heads' sinks near or above the rows' LSE
  sink.label = "window16-empty-front";
  out.push_back(std::move(sink));
  Case cap = layout_edge(paged, {33, 17, 5}, paged ? 3 : 1, 2, 1, 32, "causal-br",
                         {Distribution::kExtreme, 100.0}, score, 5.0f);
  cap.label = "cap5-extreme100-33.17.5";
  out.push_back(std::move(cap));
  Case alibi = layout_edge(paged, {7, 40, 20}, paged ? 4 : 1, 12, 4, 16, paged ? "none" : "causal-br", {}, score, 30.0f);
  alibi.label = "alibi-12h4-7.40.20";
  out.push_back(std::move(alibi));
  return out;
}
}  // namespace

std::vector<Case> layout_sweep_grid(const std::string& layout, uint64_t base_seed, uint32_t variants) {
  std::vector<Case> grid = plain_layout_grid(layout, base_seed);
  if (variants & ~(kLayoutVariants | AF_VARIANT_KV_SHARED))
    throw std::invalid_argument("variant " + variant_names(variants & ~(kLayoutVariants | AF_VARIANT_KV_SHARED)) +
                                " is checked on dense batches only, not in a sequence-layout sweep");
  if (!variants) return grid;
  const uint32_t score = variants & kLayoutVariants, kvs = variants & AF_VARIANT_KV_SHARED;
  std::vector<Case> out;
  for (Case& c : grid) {
    if (kvs && c.problem.head_dim_v > c.problem.head_dim) continue;  // V cannot be a view of a shorter K row
    if (std::string e = set_variants(c, variants); !e.empty()) throw std::logic_error(c.label + ": " + e);
    out.push_back(std::move(c));
  }
  if (score) {
    for (Case& c : layout_variant_edges(layout, score)) {
      if (kvs) share_kv(c.problem);
      c.label = layout + "-edge-" + c.label;
      out.push_back(std::move(c));
    }
    const std::string name = variant_names(score);
    for (Case& c : out) {  // kv-shared alone keeps the grid's labels and seeds (it is geometry)
      c.label = name + "-" + c.label;
      c.seed = grid_seed(base_seed, c.label);
    }
  }
  for (const Case& c : out)
    if (std::string e = validate(c); !e.empty()) throw std::logic_error(c.label + ": " + e);
  return out;
}

}  // namespace attnfuzz
