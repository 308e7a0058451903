// malformed.cpp - malformed sequence metadata (case.h Malformation): names, parsing, fit and the defect applied.
#include <cstdlib>
#include <string>

#include "attnfuzz/case.h"
#include "core/sequences.h"

namespace attnfuzz {

namespace {

constexpr Malformation kAll[] = {Malformation::kCuQDecreasing,       Malformation::kCuKDecreasing,
                                 Malformation::kCuKPastTotal,        Malformation::kSequsedOverCapacity,
                                 Malformation::kSequsedNegative,     Malformation::kPageOutOfPool,
                                 Malformation::kPageNegative,        Malformation::kPageUnusedOutOfPool};

bool is_page_kind(Malformation m) {
  return m == Malformation::kPageOutOfPool || m == Malformation::kPageNegative ||
         m == Malformation::kPageUnusedOutOfPool;
}

// Pages sequence b uses (its used keys over the page size).
int64_t used_pages(const Problem& p, const Tensors& t, int64_t b) {
  return (seq_len_k(p, t, b) + p.page_size - 1) / p.page_size;
}

// The block-table entry a page malformation edits: the last used page, or the first entry after them.
int64_t page_entry(const Problem& p, const Tensors& t, const Malformed& m) {
  const int64_t n = used_pages(p, t, m.seq);
  return m.seq * p.max_pages_per_seq + (m.kind == Malformation::kPageUnusedOutOfPool ? n : n - 1);
}

// The capacity seqused_k[b] must not pass: kv_capacity, or a packed sequence's slots.
int64_t capacity_of(const Problem& p, const Tensors& t, int64_t b) {
  return p.kv_layout == AF_SEQ_PACKED ? t.cu_seqlens_k[b + 1] - t.cu_seqlens_k[b] : p.kv_capacity;
}

std::string at(const char* name, int64_t i, int64_t v) {
  return std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(v);
}

}  // namespace

const char* malformation_name(Malformation m) {
  switch (m) {
    case Malformation::kNone: return "none";
    case Malformation::kCuQDecreasing: return "cu-q-decreasing";
    case Malformation::kCuKDecreasing: return "cu-k-decreasing";
    case Malformation::kCuKPastTotal: return "cu-k-past-total";
    case Malformation::kSequsedOverCapacity: return "seqused-over-capacity";
    case Malformation::kSequsedNegative: return "seqused-negative";
    case Malformation::kPageOutOfPool: return "page-out-of-pool";
    case Malformation::kPageNegative: return "page-negative";
    case Malformation::kPageUnusedOutOfPool: return "page-unused-out-of-pool";
  }
  return "?";
}

std::string parse_malformed(const std::string& text, Malformed& out) {
  const size_t at_pos = text.find('@');
  const std::string kind = text.substr(0, at_pos);
  Malformed m;
  bool known = kind == "none";
  for (Malformation k : kAll)
    if (kind == malformation_name(k)) m.kind = k, known = true;
  std::string names = "none";
  for (Malformation k : kAll) names += std::string(", ") + malformation_name(k);
  if (!known) return "malformation '" + kind + "' is not one of " + names;
  if (at_pos != std::string::npos) {
    const std::string n = text.substr(at_pos + 1);
    char* end = nullptr;
    const long long v = n.empty() ? -1 : std::strtoll(n.c_str(), &end, 10);
    if (n.empty() || *end || v < 0) return "malformation '" + text + "': the sequence after @ is not an integer >= 0";
    m.seq = v;
  }
  out = m;
  return {};
}

std::string to_string(const Malformed& m) {
  if (m.kind == Malformation::kNone) return "none";
  return std::string(malformation_name(m.kind)) + "@" + std::to_string(m.seq);
}

std::vector<Malformation> malformations_for(const Problem& p) {
  std::vector<Malformation> v;
  // A merge kernel reads the states, never the sequence arrays the tool cut them from: a defect there would be
  // "accepted" by every correct merge kernel (a 30 s cpu campaign named merge-states accepted-malformed 3 times).
  if (p.n_states > 0) return v;
  for (Malformation k : kAll) {
    const bool fits = k == Malformation::kCuQDecreasing   ? p.q_layout == AF_SEQ_PACKED
                      : k == Malformation::kCuKDecreasing ? p.kv_layout == AF_SEQ_PACKED
                      : k == Malformation::kCuKPastTotal  ? p.kv_layout == AF_SEQ_PACKED
                      : is_page_kind(k)                   ? p.kv_layout == AF_SEQ_PAGED
                                                          : p.kv_capacity > 0;
    if (fits) v.push_back(k);
  }
  return v;
}

bool malformation_has_answer(Malformation m) { return m == Malformation::kPageUnusedOutOfPool; }

std::string validate_malformed(const Case& c) {
  const Malformed& m = c.seqs.malformed;
  if (m.kind == Malformation::kNone) return {};
  const Problem& p = c.problem;
  const std::string what = "malformation " + to_string(m);
  if (p.n_states > 0) return what + ": a merge case's kernel reads the states, not the sequence arrays";
  bool fits = false;
  for (Malformation k : malformations_for(p)) fits |= k == m.kind;
  if (!fits) return what + ": the " + layout_name(p) + " layout has no such array";
  if (m.seq >= p.batch) return what + ": there are " + std::to_string(p.batch) + " sequences";
  if (!is_page_kind(m.kind)) return {};
  Tensors t;
  detail::build_sequence_arrays(c, t);
  const int64_t n = used_pages(p, t, m.seq);
  if (m.kind == Malformation::kPageUnusedOutOfPool && n >= p.max_pages_per_seq)
    return what + ": sequence " + std::to_string(m.seq) + " uses every entry of its block-table row";
  if (m.kind != Malformation::kPageUnusedOutOfPool && n == 0)
    return what + ": sequence " + std::to_string(m.seq) + " uses no page";
  return {};
}

Tensors malformed_arrays(const Problem& p, const Tensors& t) {
  Tensors a;
  a.cu_seqlens_q = t.cu_seqlens_q, a.cu_seqlens_k = t.cu_seqlens_k;
  a.seqused_k = t.seqused_k, a.block_table = t.block_table;
  const Malformed& m = t.malformed;
  const size_t b = static_cast<size_t>(m.seq);
  switch (m.kind) {
    case Malformation::kNone: break;
    case Malformation::kCuQDecreasing: a.cu_seqlens_q[b + 1] = a.cu_seqlens_q[b] - 1; break;
    case Malformation::kCuKDecreasing: a.cu_seqlens_k[b + 1] = a.cu_seqlens_k[b] - 1; break;
    case Malformation::kCuKPastTotal:
      for (size_t i = b + 1; i < a.cu_seqlens_k.size(); ++i) a.cu_seqlens_k[i] += 1;
      break;
    case Malformation::kSequsedOverCapacity:
      a.seqused_k[b] = static_cast<int32_t>(capacity_of(p, t, m.seq) + 1);
      break;
    case Malformation::kSequsedNegative: a.seqused_k[b] = -1; break;
    case Malformation::kPageOutOfPool:
      a.block_table[static_cast<size_t>(page_entry(p, t, m))] = static_cast<int32_t>(p.num_pages);
      break;
    case Malformation::kPageNegative: a.block_table[static_cast<size_t>(page_entry(p, t, m))] = -1; break;
    case Malformation::kPageUnusedOutOfPool:
      a.block_table[static_cast<size_t>(page_entry(p, t, m))] = static_cast<int32_t>(p.num_pages + 3);
      break;
  }
  return a;
}

std::string describe_malformation(const Problem& p, const Tensors& t) {
  const Malformed& m = t.malformed;
  const Tensors a = malformed_arrays(p, t);
  const int64_t b = m.seq;
  std::string s;
  switch (m.kind) {
    case Malformation::kNone: return {};
    case Malformation::kCuQDecreasing:
      s = at("cu_seqlens_q", b + 1, a.cu_seqlens_q[b + 1]) + " < " + at("cu_seqlens_q", b, a.cu_seqlens_q[b]);
      break;
    case Malformation::kCuKDecreasing:
      s = at("cu_seqlens_k", b + 1, a.cu_seqlens_k[b + 1]) + " < " + at("cu_seqlens_k", b, a.cu_seqlens_k[b]);
      break;
    case Malformation::kCuKPastTotal:
      s = at("cu_seqlens_k", p.batch, a.cu_seqlens_k.back()) + " > total_k = " + std::to_string(p.total_k);
      break;
    case Malformation::kSequsedOverCapacity:
      s = at("seqused_k", b, a.seqused_k[b]) + " > its capacity " + std::to_string(capacity_of(p, t, b));
      break;
    case Malformation::kSequsedNegative: s = at("seqused_k", b, a.seqused_k[b]) + " < 0"; break;
    case Malformation::kPageOutOfPool:
    case Malformation::kPageNegative:
    case Malformation::kPageUnusedOutOfPool: {
      const int64_t e = page_entry(p, t, m);
      s = "block_table[" + std::to_string(b) + ", " + std::to_string(e - b * p.max_pages_per_seq) +
          "] = " + std::to_string(a.block_table[e]) + " outside the pool of " + std::to_string(p.num_pages) +
          " pages (" + (m.kind == Malformation::kPageUnusedOutOfPool ? "an entry past the pages the sequence uses"
                                                                     : "a page the sequence uses") + ")";
      break;
    }
  }
  return s + " (" + malformation_name(m.kind) + ")";
}

}  // namespace attnfuzz
