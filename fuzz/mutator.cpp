// mutator.cpp - the structured case domain (CaseDomain): random cases, mutations, cross-over, shrinks.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <tuple>

#include "attnfuzz/dropout.h"
#include "fuzz/codec.h"
#include "fuzz/codec_shared.h"

namespace attnfuzz::fuzz {

using namespace detail;

namespace {

int64_t pick(Rng& rng, const std::vector<int64_t>& v) { return v[rng.below(v.size())]; }

// A sequence length near a tile boundary, or any edge length.
int64_t near_tile(Rng& rng, int64_t max_len) {
  const int64_t t = pick(rng, space::tile_sizes());
  const int64_t m = 1 + static_cast<int64_t>(rng.below(3));
  const int64_t v = t * m + static_cast<int64_t>(rng.below(3)) - 1;
  if (v >= 1 && v <= max_len) return v;
  return pick(rng, space::edge_seq_lengths(max_len));
}

int64_t near_vector(Rng& rng, int64_t max_d) {
  const int64_t w = rng.below(2) ? 4 : 8;
  const int64_t v =
      w * (1 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(std::max<int64_t>(max_d / w, 1))))) +
      static_cast<int64_t>(rng.below(3)) - 1;
  return std::clamp<int64_t>(v, 1, max_d);
}

// Copies explicit values onto a new shape (overlapping region kept, the rest zero).
Case reshape(const Case& c, Problem np) {
  Case n = c;
  np.n_states = c.problem.n_states;  // merged states (issue 29) survive a reshape, their cuts fitted to the new Sk
  n.problem = np;
  fit_merge(n);
  if (has_sequences(np) || has_sequences(c.problem)) n.explicit_values.reset();  // not encoded with a layout
  if (!n.explicit_values) return n;
  const Problem& p = c.problem;
  ExplicitValues e;
  e.q.assign(static_cast<size_t>(q_elements(np)), 0.f);
  e.k.assign(static_cast<size_t>(k_elements(np)), 0.f);
  e.v.assign(static_cast<size_t>(v_elements(np)), 0.f);
  const ExplicitValues& o = *c.explicit_values;
  for (int64_t b = 0; b < std::min(p.batch, np.batch); ++b) {
    for (int64_t s = 0; s < std::min(p.seq_q, np.seq_q); ++s)
      for (int64_t h = 0; h < std::min(p.heads_q, np.heads_q); ++h)
        for (int64_t d = 0; d < std::min(p.head_dim, np.head_dim); ++d)
          e.q[static_cast<size_t>(q_index(np, b, s, h, d))] =
              o.q[static_cast<size_t>(q_index(p, b, s, h, d))];
    for (int64_t s = 0; s < std::min(p.seq_k, np.seq_k); ++s)
      for (int64_t h = 0; h < std::min(p.heads_kv, np.heads_kv); ++h) {
        for (int64_t d = 0; d < std::min(p.head_dim, np.head_dim); ++d)
          e.k[static_cast<size_t>(k_index(np, b, s, h, d))] =
              o.k[static_cast<size_t>(k_index(p, b, s, h, d))];
        for (int64_t d = 0; d < std::min(p.head_dim_v, np.head_dim_v); ++d)
          e.v[static_cast<size_t>(v_index(np, b, s, h, d))] =
              o.v[static_cast<size_t>(v_index(p, b, s, h, d))];
      }
  }
  if (np.batch == p.batch && np.seq_q == p.seq_q && np.heads_q == p.heads_q &&
      np.head_dim_v == p.head_dim_v && o_elements(np) == o_elements(p))
    e.dout = o.dout;  // dO keeps its place when O's shape does; otherwise it comes from the seed again
  n.explicit_values = std::move(e);
  return n;
}

// A problem with a new shape, keeping mask, scale (if not default), dtype; strides made contiguous.
Problem reshaped(const Problem& p, int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d,
                 int64_t dv) {
  Problem n = make_problem(b, hq, hkv, sq, sk, d, dv);
  n.mask_kind = p.mask_kind;
  n.mask_align = p.mask_align;
  n.window_left = p.window_left;
  n.window_right = p.window_right;
  n.dtype = p.dtype;
  n.q_descale = p.q_descale, n.k_descale = p.k_descale, n.v_descale = p.v_descale, n.o_scale = p.o_scale;
  if (float_bits(p.scale) != float_bits(default_scale(p.head_dim))) n.scale = p.scale;
  n.variants = p.variants;  // score variants (issue 28): the bias keeps its broadcast dimensions
  n.softcap = p.softcap;
  if (p.variants & AF_VARIANT_BIAS) (void)set_bias_strides(n, broadcast_text(broadcast_bits(p)));
  if (p.variants & AF_VARIANT_DROPOUT)  // dropout (issue 29): the same p, generator, seed and offset
    (void)set_dropout(n, p.dropout_p, p.dropout_rng, p.dropout_seed, p.dropout_offset);
  if (kv_shared(p)) share_kv(n);  // V stays a view of K's rows (the decoder drops it where Dv > D)
  return n;
}

// Drops specials placed "at" a position the shape no longer has.
void fix_specials(Case& c) {
  std::erase_if(c.values.specials, [&](const SpecialValue& s) {
    if (s.placement != Placement::kAt) return false;
    const Problem& p = c.problem;
    return s.b >= p.batch || s.h >= tensor_heads(p, s.tensor) || s.s >= tensor_seq(p, s.tensor) ||
           s.d >= tensor_dim(p, s.tensor);
  });
}

// Normalises through the codec (limits, budget, strides), so every mutation result is in the domain.
void normalise(FuzzInput& in, const FuzzLimits& l) {
  fix_specials(in.the_case);
  if (in.the_case.explicit_values && !attnfuzz::validate(in.the_case).empty())
    in.the_case.explicit_values.reset();
  const std::string label = in.the_case.label;
  const auto bytes = encode(in, l);
  in = decode(bytes.data(), bytes.size(), l);
  in.the_case.label = label;
}

// Merged states (issue 29): a merge case made or dropped, a cut moved, the shifts, or the state layout and pad
// redrawn (c's problem keeps its shape; normalise() refuses what the case cannot take).
void merge_step(Case& c, Rng& rng) {
  const int64_t sk = c.problem.seq_k;
  if (!is_merge(c.problem) || rng.below(5) == 0) {
    if (is_merge(c.problem)) {
      c.problem.n_states = 0;
      c.merge = {};
      return;
    }
    const int64_t n = 1 + static_cast<int64_t>(rng.below(kMaxFuzzStates));
    std::vector<int64_t> cuts{0};
    for (int64_t i = 1; i < n; ++i) cuts.push_back(static_cast<int64_t>(rng.below(static_cast<uint64_t>(sk + 1))));
    cuts.push_back(sk);
    std::sort(cuts.begin(), cuts.end());
    (void)set_merge(c, cuts);
    return;
  }
  MergeSpec& m = c.merge;
  switch (rng.below(3)) {
    case 0:
      if (m.cuts.size() > 2)
        m.cuts[1 + rng.below(m.cuts.size() - 2)] = static_cast<int64_t>(rng.below(static_cast<uint64_t>(sk + 1)));
      std::sort(m.cuts.begin(), m.cuts.end());
      break;
    case 1:
      m.lse_shift.clear();
      if (rng.below(2))
        for (int32_t i = 0; i < c.problem.n_states; ++i)
          m.lse_shift.push_back(merge_shift_menu()[rng.below(merge_shift_menu().size())]);
      break;
    default:
      m.layout = static_cast<int32_t>(rng.below(2));
      m.pad = merge_pad_menu()[rng.below(merge_pad_menu().size())];
  }
  (void)set_merge_fields(c);
}

SpecialValue random_special(Rng& rng, const Problem& p) {
  SpecialValue s;
  s.kind = space::special_kinds()[rng.below(space::special_kinds().size())];
  s.tensor = static_cast<Tensor>(rng.below(3));
  // Masked and hidden placements are where NaN must not leak: favour them.
  static const Placement kPlacements[] = {Placement::kMasked, Placement::kHidden, Placement::kVisible,
                                          Placement::kRandom, Placement::kMasked, Placement::kAt};
  s.placement = kPlacements[rng.below(6)];
  s.count = 1 + static_cast<int64_t>(rng.below(4));
  if (s.placement == Placement::kAt) {
    const int64_t seq = tensor_seq(p, s.tensor);
    if (seq == 0) {
      s.placement = Placement::kRandom;
    } else {
      s.b = static_cast<int64_t>(rng.below(static_cast<uint64_t>(p.batch)));
      s.h = static_cast<int64_t>(rng.below(static_cast<uint64_t>(tensor_heads(p, s.tensor))));
      // Tile edges are the interesting rows and keys.
      const int64_t t = pick(rng, space::tile_sizes());
      const int64_t cand[] = {0, seq - 1, t - 1, t, seq / 2};
      s.s = std::clamp<int64_t>(cand[rng.below(5)], 0, seq - 1);
      s.d = static_cast<int64_t>(rng.below(static_cast<uint64_t>(tensor_dim(p, s.tensor))));
    }
  }
  return s;
}

// One structured change of a case's sequence layout: switch to a layout with a length list of the case space,
// change one length (zero, one, a tile residue, one long), the page size, order or spare pages, or go dense.
// Custom masks (issue 28 item 4): the mask bits `bits` with, half of the time, another pattern, block pattern,
// block size and broadcast from the codec's menus (else the case's own).
void mutate_masks(Case& c, uint32_t bits, Rng& rng) {
  const Problem& p = c.problem;
  std::string pattern = c.variants.mask_pattern, blocks = c.variants.block_pattern;
  std::pair<int32_t, int32_t> size{p.block_q ? p.block_q : 16, p.block_k ? p.block_k : 16};
  std::string bcast = (p.variants & (AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS)) ? mask_broadcast(p) : "";
  if (rng.below(2)) {
    pattern = mask_pattern_menu()[rng.below(mask_pattern_menu().size())];
    blocks = block_pattern_menu()[rng.below(block_pattern_menu().size())];
    size = block_size_menu()[rng.below(block_size_menu().size())];
    bcast.clear();
    for (int d = 0; d < 3; ++d)
      if (rng.below(3) == 0) bcast += "bhi"[d];
  }
  if (set_mask_variants(c, bits, pattern, blocks, bcast, size.first, size.second).empty()) return;
  (void)set_mask_variants(c, 0);  // a shape the masks cannot take: none
}

void mutate_sequences(Case& c, Rng& rng, const FuzzLimits& lim) {
  Problem& p = c.problem;
  SeqLayout& s = c.seqs;
  const bool seqs = has_sequences(p);
  const uint64_t what = seqs ? rng.below(5) : 0;
  c.explicit_values.reset();  // explicit values of a sequence layout are not encoded
  if (what == 0) {            // a layout with a list from the case space
    const auto lists = space::seq_length_lists(lim.max_seq);
    std::vector<int64_t> l = lists[rng.below(lists.size())];
    if (static_cast<int64_t>(l.size()) > lim.max_batch) l.resize(static_cast<size_t>(lim.max_batch));
    p.batch = static_cast<int64_t>(l.size());
    s = {};
    p.q_layout = p.kv_layout = AF_SEQ_DENSE;
    p.page_size = 0;
    p.kv_capacity = 0;
    switch (rng.below(4)) {
      case 0:
        p.q_layout = p.kv_layout = AF_SEQ_PACKED;
        s.q = l;
        s.k = l;
        if (rng.below(2)) std::reverse(s.k.begin(), s.k.end());
        break;
      case 1:
        p.seq_k = std::max<int64_t>(1, *std::max_element(l.begin(), l.end()));
        s.used = l;
        p.kv_capacity = p.seq_k;
        break;
      default:
        p.kv_layout = AF_SEQ_PAGED;
        p.page_size = static_cast<int32_t>(pick(rng, space::page_sizes()));
        s.used = l;
        if (rng.below(2)) p.seq_q = 1 + static_cast<int64_t>(rng.below(8));  // decode
        s.page_order = rng.below(2) ? rng.next() : 0;
        s.spare_pages = static_cast<int64_t>(rng.below(3));
    }
    return;
  }
  if (what == 1) {  // one length
    std::vector<int64_t>* lists[] = {&s.q, &s.k, &s.used};
    std::vector<int64_t>& v = *lists[rng.below(3)];
    if (v.empty()) return;
    int64_t& x = v[rng.below(v.size())];
    const int64_t t = pick(rng, space::tile_sizes());
    const int64_t cand[] = {0, 1, t - 1, t, t + 1, x + 1, std::max<int64_t>(0, x - 1), lim.max_seq};
    x = std::clamp<int64_t>(cand[rng.below(8)], 0, lim.max_seq);
    if (&v == &s.k && !s.used.empty()) {  // keep used <= slots
      for (size_t b = 0; b < s.used.size() && b < s.k.size(); ++b) s.used[b] = std::min(s.used[b], s.k[b]);
    } else if (&v == &s.used && !s.k.empty()) {
      for (size_t b = 0; b < s.used.size() && b < s.k.size(); ++b) s.k[b] = std::max(s.used[b], s.k[b]);
    }
    return;
  }
  if (what == 4) {  // malformed metadata (docs/semantics.md "Malformed metadata"): one defect, or none
    const std::vector<Malformation> kinds = malformations_for(p);
    s.malformed = {};
    if (!kinds.empty() && rng.below(4))
      s.malformed = {kinds[rng.below(kinds.size())], static_cast<int64_t>(rng.below(static_cast<uint64_t>(p.batch)))};
    if (!validate_malformed(c).empty()) s.malformed = {};
    return;
  }
  if (what == 2 && p.kv_layout == AF_SEQ_PAGED) {  // pages
    p.page_size = static_cast<int32_t>(pick(rng, space::page_sizes()));
    s.page_order = rng.below(3) ? rng.next() : 0;
    s.spare_pages = static_cast<int64_t>(rng.below(4));
    return;
  }
  // back to dense
  s = {};
  p.q_layout = p.kv_layout = AF_SEQ_DENSE;
  p.page_size = 0;
  p.kv_capacity = 0;
  p.total_q = p.total_k = p.num_pages = p.max_pages_per_seq = 0;
  set_contiguous_strides(p);
}

void set_window_side(Rng& rng, const Problem& p, int64_t& side) {
  const int64_t t = pick(rng, space::tile_sizes());
  const int64_t cand[] = {AF_UNBOUNDED, 0, 1, t - 1, t, t + 1, std::abs(p.seq_k - p.seq_q), 3};
  side = cand[rng.below(8)];
}

// One mutation step's working state: the case, the problem being changed (applied after the step) and the
// shape it is reshaped to.
struct Step {
  Case& c;
  Problem p;
  int64_t b, hq, hkv, sq, sk, d, dv;
  bool reshape_needed = false;
};

// Steps 0-3: Sq, Sk, head dims, heads and batch (the new shape is applied after the step).
void shape_step(uint64_t op, Step& ws, Rng& rng, const FuzzLimits& lim) {
  int64_t &b = ws.b, &hq = ws.hq, &hkv = ws.hkv, &sq = ws.sq, &sk = ws.sk, &d = ws.d, &dv = ws.dv;
  bool& reshape_needed = ws.reshape_needed;
  switch (op) {
    case 0:  // Sq near a tile boundary, +-1, decode
      switch (rng.below(4)) {
        case 0:
          sq = near_tile(rng, lim.max_seq);
          break;
        case 1:
          sq = std::max<int64_t>(1, sq + (rng.below(2) ? 1 : -1));
          break;
        case 2:
          sq = 1;
          break;
        default:
          sq = pick(rng, space::edge_seq_lengths(lim.max_seq));
      }
      reshape_needed = true;
      break;
    case 1:  // Sk: tile boundary, relative to Sq, 0
      switch (rng.below(5)) {
        case 0:
          sk = near_tile(rng, lim.max_seq);
          break;
        case 1:
          sk = std::max<int64_t>(0, sk + (rng.below(2) ? 1 : -1));
          break;
        case 2:
          sk = std::clamp<int64_t>(sq + static_cast<int64_t>(rng.below(5)) - 2, 0, lim.max_seq);
          break;
        case 3:
          sk = rng.below(4) == 0 ? 0 : std::min(lim.max_seq, sq + pick(rng, space::tile_sizes()));
          break;
        default:
          sk = pick(rng, space::edge_seq_lengths(lim.max_seq));
      }
      reshape_needed = true;
      break;
    case 2:  // head dims: vector-width tails, edge dims, Dv != D
      switch (rng.below(4)) {
        case 0:
          d = near_vector(rng, lim.max_dim);
          break;
        case 1:
          d = pick(rng, space::edge_head_dims(lim.max_dim));
          break;
        case 2:
          dv = rng.below(2) ? d : pick(rng, space::edge_head_dims(lim.max_dim));
          break;
        default:
          d = std::clamp<int64_t>(d + (rng.below(2) ? 1 : -1), 1, lim.max_dim);
      }
      reshape_needed = true;
      break;
    case 3: {  // heads and batch
      const auto heads = head_menu(lim);
      std::tie(hq, hkv) = heads[rng.below(heads.size())];
      if (rng.below(3) == 0) b = 1 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(lim.max_batch)));
      reshape_needed = true;
      break;
    }
  }
}

// Steps 4-5: mask kind and alignment, window sides.
void mask_step(uint64_t op, Step& ws, Rng& rng) {
  Problem& p = ws.p;
  switch (op) {
    case 4: {  // mask kind and alignment from the case space, or flip the alignment
      if (rng.below(3) == 0 && p.mask_kind != AF_MASK_NONE) {
        p.mask_align = p.mask_align == AF_ALIGN_TOP_LEFT ? AF_ALIGN_BOTTOM_RIGHT : AF_ALIGN_TOP_LEFT;
      } else {
        const auto& masks = space::mask_forms();
        (void)parse_mask(masks[rng.below(masks.size())], p);
      }
      break;
    }
    case 5:  // window sides near tile sizes, zero, unbounded, |Sk - Sq|
      p.mask_kind = AF_MASK_WINDOW;
      if (rng.below(4) == 0) p.mask_align = rng.below(2) ? AF_ALIGN_BOTTOM_RIGHT : AF_ALIGN_TOP_LEFT;
      if (p.window_left < -1) p.window_left = AF_UNBOUNDED;
      set_window_side(rng, p, rng.below(2) ? p.window_left : p.window_right);
      break;
  }
}

// Steps 6-9: magnitudes and distribution, scale, special values added, changed or removed.
void values_step(uint64_t op, Step& ws, Rng& rng, const FuzzLimits& lim) {
  Case& c = ws.c;
  Problem& p = ws.p;
  switch (op) {
    case 6: {  // magnitudes: extreme scores around the exp overflow edge, or the plain parameter
      auto& dist = c.values.dist;
      if (rng.below(2)) {
        dist = {Distribution::kExtreme,
                space::extreme_magnitudes()[rng.below(space::extreme_magnitudes().size())]};
      } else if (rng.below(2)) {
        dist.param = std::ldexp(dist.param, static_cast<int>(rng.below(9)) - 4);
      } else {
        dist.kind = static_cast<Distribution>(rng.below(p.dtype == AF_DTYPE_F32 ? 3 : 4));
        const auto& m = param_menu(dist.kind);
        dist.param = m[rng.below(m.size())];
      }
      if (!(dist.param > 0) || !std::isfinite(dist.param)) dist.param = 1;
      break;
    }
    case 7:  // scale
      switch (rng.below(4)) {
        case 0:
          p.scale = default_scale(p.head_dim);
          break;
        case 1:
          p.scale = p.scale * (rng.below(2) ? 2.f : 0.5f);
          break;
        case 2:
          p.scale = scale_menu()[rng.below(scale_menu().size())];
          break;
        default:
          p.scale = -p.scale;
      }
      if (!std::isfinite(p.scale)) p.scale = default_scale(p.head_dim);
      break;
    case 8:  // add a special value (kind and placement from the case space)
      if (static_cast<int64_t>(c.values.specials.size()) < lim.max_specials)
        c.values.specials.push_back(random_special(rng, p));
      break;
    case 9:  // change or remove a special value
      if (!c.values.specials.empty()) {
        auto& s = c.values.specials[rng.below(c.values.specials.size())];
        switch (rng.below(5)) {
          case 0:
            c.values.specials.erase(c.values.specials.begin() + (&s - c.values.specials.data()));
            break;
          case 1:
            s.placement = static_cast<Placement>(rng.below(4));
            break;
          case 2:
            s.tensor = static_cast<Tensor>(rng.below(3));
            break;
          case 3:
            s.kind = space::special_kinds()[rng.below(space::special_kinds().size())];
            break;
          default:
            s.count = 1 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(lim.max_special_count)));
        }
      } else {
        c.values.specials.push_back(random_special(rng, p));
      }
      break;
  }
}

// Steps 12-13: padded strides; dtype, fp8 descales or the dtype's stress inputs.
void layout_dtype_step(uint64_t op, Step& ws, Rng& rng, const FuzzLimits& lim) {
  Case& c = ws.c;
  Problem& p = ws.p;
  switch (op) {
    case 12:  // layout: padded rows / heads, or back to contiguous
      if (rng.below(2)) {
        set_contiguous_strides(p);
      } else {
        const int64_t pad = 1 + static_cast<int64_t>(rng.below(8));
        struct Layout {
          int64_t* st;
          int64_t dim, h, s;
        };
        for (const Layout& l : {Layout{p.q_stride, p.head_dim, p.heads_q, p.seq_q},
                                Layout{p.k_stride, p.head_dim, p.heads_kv, p.seq_k},
                                Layout{p.v_stride, p.head_dim_v, p.heads_kv, p.seq_k},
                                Layout{p.o_stride, p.head_dim_v, p.heads_q, p.seq_q}}) {
          int64_t* st = l.st;
          const int64_t dim = l.dim, h = l.h, s = l.s;
          st[2] = dim + pad;
          st[1] = h * st[2];
          st[0] = std::max<int64_t>(s, 1) * st[1];
        }
      }
      break;
    case 13:  // dtype (unless the limits fix it), fp8 descales, or the dtype's stress inputs (case.h space::)
      switch (rng.below(3)) {
        case 0:
          if (lim.dtype < 0) p.dtype = space::dtypes()[rng.below(space::dtypes().size())];
          break;
        case 1:
          if (fp8(p.dtype)) {
            const auto& dm = space::fp8_descales();
            float* f[] = {&p.q_descale, &p.k_descale, &p.v_descale};
            *f[rng.below(3)] = dm[rng.below(dm.size())];
            if (rng.below(2)) p.o_scale = o_scale_menu()[rng.below(o_scale_menu().size())];
          }
          break;
        default: {
          const auto ext = space::lowp_extreme_magnitudes(p.dtype);
          const auto uni = space::lowp_uniform_widths(p.dtype);
          const auto wide = space::lowp_wide_v(p.dtype);  // issue 25: the accumulator past the format's range
          const uint64_t pick = rng.below(3);
          if (!ext.empty() && pick == 0)
            c.values.dist = {Distribution::kExtreme, ext[rng.below(ext.size())]};
          else if (!wide.empty() && pick == 1)
            c.values.dist = {Distribution::kWideV, wide[rng.below(wide.size())]};
          else if (!uni.empty())
            c.values.dist = {Distribution::kUniform, uni[rng.below(uni.size())]};
        }
      }
      if (!fp8(p.dtype)) p.q_descale = p.k_descale = p.v_descale = p.o_scale = 1.0f;
      break;
  }
}

// The other steps: explicit values nudged or dropped, rarely materialized, else a new seed.
void explicit_step(Step& ws, Rng& rng) {
  Case& c = ws.c;
  Problem& p = ws.p;
  if (c.explicit_values) {
    if (rng.below(4) == 0) {
      c.explicit_values.reset();
    } else {
      auto& e = *c.explicit_values;
      std::vector<float>* vs[] = {&e.q, &e.k, &e.v};
      auto& v = *vs[rng.below(3)];
      if (!v.empty()) {
        float& x = v[rng.below(v.size())];
        static const float kSpecial[] = {NAN, INFINITY, -INFINITY, 0.f, -0.f, 1e30f, 1e-40f};
        x = rng.below(2) ? kSpecial[rng.below(7)]
                         : x * static_cast<float>(std::ldexp(1.0, int(rng.below(9)) - 4));
      }
    }
  } else if (rng.below(8) == 0 && q_elements(p) + k_elements(p) + v_elements(p) <= 4096) {
    c = materialize(c);
  } else {
    c.seed = rng.next();
  }
}

}  // namespace

FuzzInput CaseDomain::init(Rng& rng) const {
  FuzzInput in;
  in.kernel = static_cast<uint32_t>(rng.below(256));
  const auto seqs = space::edge_seq_lengths(lim_.max_seq);
  const auto dims = space::edge_head_dims(lim_.max_dim);
  const auto heads = head_menu(lim_);
  const auto [hq, hkv] = heads[rng.below(heads.size())];
  const int64_t sq = pick(rng, seqs), d = pick(rng, dims);
  const int64_t sk = rng.below(3) == 0 ? sq : pick(rng, seqs);
  in.the_case =
      make_case(make_problem(1, hq, hkv, sq, sk, d, rng.below(4) == 0 ? pick(rng, dims) : d), rng.next());
  const auto& masks = space::mask_forms();
  (void)parse_mask(masks[rng.below(masks.size())], in.the_case.problem);
  if (rng.below(3) == 0) {
    in.the_case.values.dist = {Distribution::kExtreme,
                               space::extreme_magnitudes()[rng.below(space::extreme_magnitudes().size())]};
  }
  if (rng.below(3) == 0) in.the_case.values.specials.push_back(random_special(rng, in.the_case.problem));
  normalise(in, lim_);
  return in;
}

// MLA's shared K/V latent (issue 28 item 5): kv-shared switched off, or on (V a view of K's rows; Dv cut to
// D), half the time with DeepSeek's D = 576, Dv = 512 and one KV head when the limits allow MLA dims (dense
// only).
namespace {
void kv_shared_step(Step& ws, Rng& rng, const FuzzLimits& lim) {
  Problem& p = ws.p;
  if (kv_shared(p)) {
    p.variants &= ~AF_VARIANT_KV_SHARED;
    if (!has_sequences(p)) set_contiguous_strides(p);
    return;
  }
  p.variants |= AF_VARIANT_KV_SHARED;
  if (lim.mla_dims && !has_sequences(p) && rng.below(2)) {
    ws.d = kMlaHeadDim, ws.dv = kMlaHeadDimV, ws.hkv = 1;
    ws.reshape_needed = true;
  } else if (ws.dv > ws.d) {
    ws.dv = ws.d;
    ws.reshape_needed = true;
  } else {
    share_kv(p);
  }
}
}  // namespace

void CaseDomain::mutate(FuzzInput& in, Rng& rng) const {
  const int steps = 1 + static_cast<int>(rng.below(3));
  for (int step = 0; step < steps; ++step) {
    Case& c = in.the_case;
    const Problem& cp = c.problem;
    Step ws{c, cp, cp.batch, cp.heads_q, cp.heads_kv, cp.seq_q, cp.seq_k, cp.head_dim, cp.head_dim_v};
    Problem& p = ws.p;
    int64_t &b = ws.b, &hq = ws.hq, &hkv = ws.hkv, &sq = ws.sq, &sk = ws.sk, &d = ws.d, &dv = ws.dv;
    bool& reshape_needed = ws.reshape_needed;
    // Steps 0-12 and 14 are those of before issue 13; 13 changes the dtype (not under a fixed f32 campaign,
    // whose draws stay as before); 15 changes the sequence layout (issue 15).
    uint64_t op = rng.below(lim_.dtype == AF_DTYPE_F32 ? 15 : 16);
    if (lim_.dtype == AF_DTYPE_F32 && op == 13) op = 15;
    switch (op) {
      case 15:  // sequence layouts (issue 15): a layout, a length, the pages
        mutate_sequences(c, rng, lim_);
        p = c.problem;
        break;
      case 0:
      case 1:
      case 2:
      case 3:
        shape_step(op, ws, rng, lim_);
        break;
      case 4:
      case 5:
        mask_step(op, ws, rng);
        break;
      case 6:
      case 7:
      case 8:
      case 9:
        values_step(op, ws, rng, lim_);
        break;
      case 12:
      case 13:
        layout_dtype_step(op, ws, rng, lim_);
        break;
      case 10:
        c.seed = rng.next();
        break;
      case 11:
        in.kernel = static_cast<uint32_t>(rng.below(256));
        break;
      default:
        explicit_step(ws, rng);
    }
    // Score variants (issue 28): a bit, the softcap, a range, a broadcast, per-head descales per batch or not
    // (only when the limits allow one: a dropout-only campaign has none to toggle).
    constexpr uint32_t kToggled = kScoreVariants | kMaskVariants | AF_VARIANT_HEAD_DESCALE;
    if ((lim_.variants & (AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI | AF_VARIANT_BIAS |
                          AF_VARIANT_HEAD_DESCALE)) &&
        rng.below(4) == 0) {
      uint32_t bits = p.variants;
      float softcap = bits & AF_VARIANT_SOFTCAP ? p.softcap : softcap_menu()[0];
      uint8_t bcast = bits & AF_VARIANT_BIAS ? broadcast_bits(p) : 0;
      bool per_batch = (bits & AF_VARIANT_HEAD_DESCALE) && p.descale_stride[0] != 0;
      switch (rng.below((lim_.variants & AF_VARIANT_HEAD_DESCALE) ? 5 : 4)) {  // 4: only with head-descale
        case 0: {
          std::vector<uint32_t> allowed;
          for (uint32_t bit = 1; bit <= AF_VARIANT_HEAD_DESCALE; bit <<= 1)
            if (lim_.variants & bit & kToggled & (fp8(p.dtype) ? ~0u : ~AF_VARIANT_HEAD_DESCALE))
              allowed.push_back(bit);
          if (allowed.empty()) break;
          bits ^= allowed[rng.below(allowed.size())];
          if ((bits & AF_VARIANT_MASK_DENSE) && (bits & AF_VARIANT_MASK_BITS))  // exclusive: the new one stays
            bits &= ~(p.variants & (AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS));
          break;
        }
        case 1:
          softcap = softcap_menu()[rng.below(softcap_menu().size())];
          break;
        case 2:
          c.variants.sink_range = sink_range_menu()[rng.below(sink_range_menu().size())];
          c.variants.bias_range = bias_range_menu()[rng.below(bias_range_menu().size())];
          break;
        case 4:
          per_batch = !per_batch;
          break;
        default:
          bcast = static_cast<uint8_t>(rng.below(16));
      }
      if (!has_sequences(p)) {
        (void)set_variants(c, bits & lim_.variants & (kScoreVariants | AF_VARIANT_HEAD_DESCALE), softcap,
                           broadcast_text(bcast));
        if (c.problem.variants & AF_VARIANT_HEAD_DESCALE) set_descale_strides(c.problem, per_batch);
        mutate_masks(c, bits & lim_.variants & kMaskVariants, rng);
      } else {  // sequence layouts take sinks, softcap and ALiBi (docs/sequence-layouts.md "Variants")
        (void)set_variants(c, bits & lim_.variants & kLayoutVariants, softcap);
      }
      Problem& vp = p;  // the step's problem follows
      vp.variants = c.problem.variants;
      vp.softcap = c.problem.softcap;
      std::copy(std::begin(c.problem.bias_stride), std::end(c.problem.bias_stride), std::begin(vp.bias_stride));
      std::copy(std::begin(c.problem.mask_stride), std::end(c.problem.mask_stride), std::begin(vp.mask_stride));
      std::copy(std::begin(c.problem.block_mask_stride), std::end(c.problem.block_mask_stride),
                std::begin(vp.block_mask_stride));
      vp.block_q = c.problem.block_q, vp.block_k = c.problem.block_k;
      std::copy(std::begin(c.problem.descale_stride), std::end(c.problem.descale_stride),
                std::begin(vp.descale_stride));
    }
    if ((lim_.variants & AF_VARIANT_KV_SHARED) && rng.below(8) == 0) kv_shared_step(ws, rng, lim_);
    if (lim_.merge && rng.below(4) == 0) merge_step(c, rng);  // merged states (issue 29)
    if ((lim_.variants & AF_VARIANT_DROPOUT) && !has_sequences(p) && rng.below(4) == 0) {  // dropout (issue 29)
      const bool on = p.variants & AF_VARIANT_DROPOUT;
      double drop_p = on ? p.dropout_p : dropout_p_menu()[0];
      int32_t drng = on ? p.dropout_rng : AF_DROPOUT_RNG_PHILOX_FLASH;
      uint64_t dseed = on ? p.dropout_seed : rng.next(), offset = on ? p.dropout_offset : 0;
      switch (rng.below(5)) {
        case 0: break;  // switched on or off below
        case 1: drop_p = dropout_p_menu()[rng.below(dropout_p_menu().size())]; break;
        case 2: drng = drng == AF_DROPOUT_RNG_EXPORTED ? AF_DROPOUT_RNG_PHILOX_FLASH : AF_DROPOUT_RNG_EXPORTED; break;
        case 3: dseed = rng.next(); break;
        default: offset = dropout_offset_menu()[rng.below(dropout_offset_menu().size())];
      }
      const bool keep_on = on != (rng.below(3) == 0);
      p.variants &= ~AF_VARIANT_DROPOUT;
      if (keep_on) (void)set_dropout(p, drop_p, drng, dseed, offset);
      c.problem.variants = p.variants;
      c.problem.dropout_p = p.dropout_p, c.problem.dropout_rng = p.dropout_rng;
      c.problem.dropout_seed = p.dropout_seed, c.problem.dropout_offset = p.dropout_offset;
      std::copy(std::begin(p.dropout_mask_stride), std::end(p.dropout_mask_stride), std::begin(c.problem.dropout_mask_stride));
    }
    if (__builtin_popcount(lim_.passes) > 1 && rng.below(8) == 0) {  // another allowed pass
      const int now = static_cast<int>(c.pass);
      for (int i = 1; i < 3; ++i)
        if (lim_.passes & (1u << ((now + i) % 3))) {
          c.pass = static_cast<Pass>((now + i) % 3);
          break;
        }
      if (c.explicit_values && !has_backward(c.pass)) c.explicit_values->dout.clear();
    }
    if (reshape_needed) {
      if (hq % hkv) hkv = 1;
      Problem np = reshaped(p, b, hq, hkv, sq, sk, d, dv);
      // A sequence layout survives a reshape (the codec resizes the length lists to the new batch).
      np.q_layout = p.q_layout;
      np.kv_layout = p.kv_layout;
      np.page_size = p.page_size;
      np.kv_capacity = p.kv_capacity;
      fit(np, lim_);
      c = reshape(c, np);
    } else {
      c = reshape(c, p);  // same shape; explicit values follow new strides
    }
    normalise(in, lim_);
  }
}

FuzzInput CaseDomain::cross_over(const FuzzInput& a, const FuzzInput& b, Rng& rng) const {
  const bool first = rng.below(2) != 0;
  FuzzInput out = first ? a : b;
  const FuzzInput& other = first ? b : a;
  Case& c = out.the_case;
  const Problem& op = other.the_case.problem;
  switch (rng.below(3)) {
    case 0:  // the other's values
      c.values = other.the_case.values;
      c.seed = other.the_case.seed;
      c.explicit_values.reset();
      break;
    case 1:  // the other's mask
      c.problem.mask_kind = op.mask_kind;
      c.problem.mask_align = op.mask_align;
      c.problem.window_left = op.window_left;
      c.problem.window_right = op.window_right;
      break;
    default: {  // the other's sequence lengths (its per-sequence layout when it has one)
      if (has_sequences(op) && rng.below(2)) {
        c.problem.batch = op.batch;
        c.problem.q_layout = op.q_layout;
        c.problem.kv_layout = op.kv_layout;
        c.problem.page_size = op.page_size;
        c.problem.kv_capacity = op.kv_capacity;
        c.problem.seq_q = op.seq_q;
        c.problem.seq_k = op.seq_k;
        c.seqs = other.the_case.seqs;
        c.explicit_values.reset();
        break;
      }
      Problem np = reshaped(c.problem, c.problem.batch, c.problem.heads_q, c.problem.heads_kv, op.seq_q,
                            op.seq_k, c.problem.head_dim, c.problem.head_dim_v);
      fit(np, lim_);
      c = reshape(c, np);
    }
  }
  normalise(out, lim_);
  return out;
}

Case CaseDomain::plain_shape(const Case& c) const {
  const Problem& p = c.problem;
  if (has_sequences(p) || is_merge(p)) return c;
  const auto floor2 = [](int64_t x) { return x < 1 ? x : int64_t{1} << (63 - std::countl_zero(uint64_t(x))); };
  const auto dim = [&](int64_t d) { return std::max(floor2(d), std::min<int64_t>(16, floor2(lim_.max_dim))); };
  const Problem np = reshaped(p, p.batch, p.heads_q, p.heads_kv, floor2(p.seq_q), floor2(p.seq_k), dim(p.head_dim),
                              kv_shared(p) ? std::min(dim(p.head_dim_v), dim(p.head_dim)) : dim(p.head_dim_v));
  Case n = reshape(c, np);
  fix_specials(n);
  if (n.explicit_values && !attnfuzz::validate(n).empty()) n.explicit_values.reset();
  return attnfuzz::validate(n).empty() && in_domain(n, lim_).empty() ? n : c;
}

// One function of ~160 lines on purpose: the candidates form one list, simplest first, and the minimizer
// takes the first that still fails; split up, that order would be spread over several functions.
std::vector<Case> CaseDomain::shrinks(const Case& c) const {
  std::vector<Case> out;
  const Problem& p = c.problem;
  auto shape = [&](int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d, int64_t dv) {
    if (b == p.batch && hq == p.heads_q && hkv == p.heads_kv && sq == p.seq_q && sk == p.seq_k &&
        d == p.head_dim && dv == p.head_dim_v)
      return;
    if (b < 1 || hq < 1 || hkv < 1 || hq % hkv || sq < 1 || sk < 0 || d < 1 || dv < 1) return;
    // Only real shrinks (no dimension grows), so the greedy loop terminates.
    if (b > p.batch || hq > p.heads_q || hkv > p.heads_kv || sq > p.seq_q || sk > p.seq_k || d > p.head_dim ||
        dv > p.head_dim_v)
      return;
    Problem np = reshaped(p, b, hq, hkv, sq, sk, d, dv);  // contiguous strides
    Case n = reshape(c, np);
    fix_specials(n);
    if (attnfuzz::validate(n).empty()) out.push_back(std::move(n));
  };
  const int64_t B = p.batch, Hq = p.heads_q, Hk = p.heads_kv, Sq = p.seq_q, Sk = p.seq_k, D = p.head_dim,
                Dv = p.head_dim_v;
  if (has_sequences(p)) {  // sequence layouts: fewer sequences, shorter ones, plainer pages, heads and dims
    auto seq = [&](auto change) {
      Case n = c;
      change(n);
      if (set_sequence_fields(n).empty() && attnfuzz::validate(n).empty() &&
          !(n.seqs == c.seqs && n.problem.batch == B))
        out.push_back(std::move(n));
    };
    for (int64_t drop = B - 1; drop >= 0 && B > 1; --drop)
      seq([&](Case& n) {
        for (auto* v : {&n.seqs.q, &n.seqs.k, &n.seqs.used})
          if (!v->empty()) v->erase(v->begin() + drop);
        n.problem.batch = B - 1;
      });
    for (int div : {2, 0})
      for (auto member : {&SeqLayout::q, &SeqLayout::k, &SeqLayout::used})
        seq([&](Case& n) {
          for (int64_t& x : n.seqs.*member) x = div ? x / div : std::min<int64_t>(x, 1);
          if (member == &SeqLayout::k)
            for (size_t b = 0; b < n.seqs.used.size() && b < n.seqs.k.size(); ++b)
              n.seqs.used[b] = std::min(n.seqs.used[b], n.seqs.k[b]);
        });
    seq([&](Case& n) { n.seqs.page_order = 0; });
    seq([&](Case& n) { n.seqs.spare_pages = 0; });
    for (auto [hq, hk] : {std::pair{int64_t{1}, int64_t{1}}, std::pair{Hk, Hk}})
      if (hq < Hq)
        seq([&](Case& n) {
          n.problem.heads_q = hq;
          n.problem.heads_kv = hk;
          fix_specials(n);
        });
    for (int64_t d : {int64_t{1}, D / 2})
      if (d >= 1 && d < D)
        seq([&](Case& n) {
          n.problem.head_dim = d;
          if (Dv == D) n.problem.head_dim_v = d;
          n.problem.scale = float_bits(p.scale) == float_bits(default_scale(D)) ? default_scale(d) : p.scale;
          fix_specials(n);
        });
  }
  if (!has_sequences(p)) {  // dense reshapes (they would drop a sequence layout)
    shape(1, Hq, Hk, Sq, Sk, D, Dv);
    shape(1 == B ? B : B - 1, Hq, Hk, Sq, Sk, D, Dv);
    shape(B, 1, 1, Sq, Sk, D, Dv);
    shape(B, Hk, Hk, Sq, Sk, D, Dv);
    shape(B, Hq / Hk, 1, Sq, Sk, D, Dv);
    for (int64_t sq : {int64_t{1}, Sq / 2, Sq - 1}) shape(B, Hq, Hk, sq, Sk, D, Dv);
    for (int64_t sk : {int64_t{1}, Sk / 2, Sk - 1, Sq}) shape(B, Hq, Hk, Sq, sk, D, Dv);
    for (int64_t sq : {Sq / 2, Sq - 1})
      shape(B, Hq, Hk, sq, std::min(Sk, sq), D, Dv);  // both shrink together
    for (int64_t d : {int64_t{1}, D / 2, D - 1}) shape(B, Hq, Hk, Sq, Sk, d, Dv == D ? d : Dv);
    for (int64_t dv : {int64_t{1}, Dv / 2, Dv - 1, D}) shape(B, Hq, Hk, Sq, Sk, D, dv);
  }
  // Specials: remove each, then smaller counts (with explicit values they are provenance only).
  const size_t n_specials = c.explicit_values ? 0 : c.values.specials.size();
  for (size_t i = 0; i < n_specials; ++i) {
    Case n = c;
    n.values.specials.erase(n.values.specials.begin() + static_cast<long>(i));
    out.push_back(std::move(n));
  }
  for (size_t i = 0; i < n_specials; ++i)
    if (c.values.specials[i].count > 1) {
      Case n = c;
      n.values.specials[i].count = std::max<int64_t>(1, n.values.specials[i].count / 2);
      out.push_back(std::move(n));
    }
  // Plainer mask, scale, layout, distribution.
  auto with_problem = [&](auto edit) {
    Case n = c;
    edit(n.problem);
    if (std::memcmp(&n.problem, &p, sizeof p) != 0 && attnfuzz::validate(n).empty())
      out.push_back(std::move(n));
  };
  with_problem([](Problem& q) {
    q.mask_kind = AF_MASK_NONE;
    q.mask_align = AF_ALIGN_TOP_LEFT;
    q.window_left = q.window_right = AF_UNBOUNDED;
  });
  if (p.mask_kind == AF_MASK_WINDOW) {
    with_problem([](Problem& q) {
      q.mask_kind = AF_MASK_CAUSAL;
      q.window_left = AF_UNBOUNDED;
      q.window_right = 0;
    });
    with_problem([](Problem& q) {
      if (q.window_left > 0) q.window_left /= 2;
    });
    with_problem([](Problem& q) {
      if (q.window_right > 0) q.window_right /= 2;
    });
  }
  with_problem([](Problem& q) { q.scale = default_scale(q.head_dim); });
  with_problem([](Problem& q) { set_contiguous_strides(q); });
  if (!c.explicit_values) {
    const ValueDist& dist = c.values.dist;
    if (dist.kind != Distribution::kUniform || dist.param != 1.0) {
      Case n = c;
      n.values.dist = {Distribution::kUniform, 1.0};
      out.push_back(std::move(n));
    }
    if (dist.param > 1.0) {
      Case n = c;
      n.values.dist.param = dist.param / 2;
      out.push_back(std::move(n));
    }
  } else {
    // Explicit values: zero blocks of each tensor (halves down to sixteenths), then round every value.
    const ExplicitValues& e = *c.explicit_values;
    for (int which = 0; which < 3; ++which) {
      const std::vector<float>& v = which == 0 ? e.q : which == 1 ? e.k : e.v;
      for (size_t parts = 2; parts <= 16; parts *= 2) {
        const size_t chunk = (v.size() + parts - 1) / parts;
        if (chunk == 0) break;
        for (size_t start = 0; start < v.size(); start += chunk) {
          bool any = false;
          for (size_t i = start; i < std::min(v.size(), start + chunk); ++i) any |= float_bits(v[i]) != 0;
          if (!any) continue;
          Case n = c;
          auto& nv = which == 0   ? n.explicit_values->q
                     : which == 1 ? n.explicit_values->k
                                  : n.explicit_values->v;
          std::fill(nv.begin() + static_cast<long>(start),
                    nv.begin() + static_cast<long>(std::min(v.size(), start + chunk)), 0.f);
          out.push_back(std::move(n));
        }
      }
    }
    for (double grid : {1.0, 0.25}) {
      Case n = c;
      bool changed = false;
      for (auto* v : {&n.explicit_values->q, &n.explicit_values->k, &n.explicit_values->v})
        for (float& x : *v)
          if (std::isfinite(x)) {
            const float r = static_cast<float>(std::round(x / grid) * grid);
            changed |= float_bits(r) != float_bits(x);
            x = r;
          }
      if (changed) out.push_back(std::move(n));
    }
  }
  return out;
}

std::string CaseDomain::print(const FuzzInput& in) const {
  return "kernel#" + std::to_string(in.kernel) + " " + describe(in.the_case);
}

Case materialize(const Case& c) {
  if (has_sequences(c.problem)) return c;  // explicit values of a sequence layout are not encoded
  if (c.explicit_values) return c;
  Case n = c;
  Tensors t = generate(c);
  n.explicit_values = ExplicitValues{std::move(t.q), std::move(t.k), std::move(t.v), std::move(t.dout)};
  return n;
}

}  // namespace attnfuzz::fuzz
