// generators.cpp - RapidCheck generators of attn-fuzz cases over attnfuzz::space, weighted toward the edges.
#include "properties/generators.h"

#include "attnfuzz/dropout.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "attnfuzz/problem.h"

namespace attnfuzz {

void showValue(const Case& c, std::ostream& os) {
  os << describe(c);
  if (!c.label.empty()) os << " label=" << c.label;
}

namespace props {

rc::Gen<size_t> index_below(size_t n) {
  return [n](const rc::Random& random, int) {
    if (n == 0) throw rc::GenerationFailure("index_below(0)");
    const size_t i = static_cast<size_t>(rc::Random(random).next() % n);
    return rc::shrinkable::shrinkRecur(i, [](size_t x) { return rc::shrink::towards<size_t>(x, 0); });
  };
}

rc::Gen<int64_t> in_range(int64_t lo, int64_t hi) {
  return rc::gen::map(index_below(static_cast<size_t>(hi - lo + 1)),
                      [lo](size_t i) { return lo + static_cast<int64_t>(i); });
}

rc::Gen<size_t> weighted_index(std::vector<int> weights) {
  int total = 0;
  for (int w : weights) total += std::max(0, w);
  if (total <= 0) throw std::invalid_argument("weighted_index: no positive weight");
  return [weights, total](const rc::Random& random, int) {
    int r = static_cast<int>(rc::Random(random).next() % static_cast<uint64_t>(total));
    size_t i = 0;
    while (r >= std::max(0, weights[i])) r -= std::max(0, weights[i]), ++i;
    // Shrinks toward earlier options that have a positive weight.
    return rc::shrinkable::shrinkRecur(i, [weights](size_t x) {
      return rc::seq::filter(rc::shrink::towards<size_t>(x, 0),
                             [weights](size_t y) { return weights[y] > 0; });
    });
  };
}

CaseLimits limits_for(const af_kernel& k, CaseLimits base) {
  if (k.max_head_dim > 0) base.max_d = std::min(base.max_d, k.max_head_dim);
  if (k.max_head_dim_v > 0) base.max_dv = std::min(base.max_dv, k.max_head_dim_v);
  if (k.needs_dv_eq_d) base.dv_eq_d = true;
  if (base.dv_eq_d) base.max_d = base.max_dv = std::min(base.max_d, base.max_dv);
  if (k.masks != 0) base.masks &= k.masks;
  return base;
}

namespace {

// The listed values within [lo, hi], in their order (simplest first), or {lo} if none is.
std::vector<int64_t> within(std::vector<int64_t> v, int64_t lo, int64_t hi) {
  std::erase_if(v, [&](int64_t x) { return x < lo || x > hi; });
  if (v.empty()) v.push_back(lo);
  return v;
}

}  // namespace

rc::Gen<int64_t> gen_seq_len(int64_t lo, int64_t max) {
  max = std::max(lo, max);
  return weighted_one_of<int64_t>(
      {{3, element_of(within(space::edge_seq_lengths(max), lo, max))}, {1, in_range(lo, max)}});
}

rc::Gen<int64_t> gen_head_dim(int64_t max) {
  max = std::max<int64_t>(1, max);
  return weighted_one_of<int64_t>(
      {{3, element_of(within(space::edge_head_dims(max), 1, max))}, {1, in_range(1, max)}});
}

rc::Gen<std::string> gen_mask_masked(const std::vector<std::string>& forms, bool tl, bool br);

rc::Gen<std::string> gen_mask(const CaseLimits& limits) {
  std::vector<std::string> forms;
  for (const std::string& m : space::mask_forms()) {
    Problem p = make_problem(1, 1, 1, 8, 8, 8, 8);
    if (!parse_mask(m, p).empty()) continue;
    if (limits.require_mask && p.mask_kind == AF_MASK_NONE) continue;
    if (limits.masks & mask_support_bit(p)) forms.push_back(m);
  }
  const bool tl = limits.masks & AF_SUPPORTS_WINDOW_TL, br = limits.masks & AF_SUPPORTS_WINDOW_BR;
  if (forms.empty() && !tl && !br) throw std::invalid_argument("gen_mask: no mask allowed by the limits");
  // "none" (when allowed) a third of the time: key permutation and key shift are strongest without a mask.
  const bool none = !forms.empty() && forms.front() == "none";
  if (none && forms.size() > 1) {
    std::vector<std::string> masked(forms.begin() + 1, forms.end());
    return weighted_one_of<std::string>(
        {{1, rc::gen::just<std::string>("none")}, {2, gen_mask_masked(masked, tl, br)}});
  }
  return gen_mask_masked(forms, tl, br);
}

// Masked forms (from the case space) and random windows "window:L,R-tl|br" of the supported alignments.
rc::Gen<std::string> gen_mask_masked(const std::vector<std::string>& forms, bool tl, bool br) {
  if (!tl && !br) return element_of(forms);
  // Random windows: each side a small width (0 .. 20) or unbounded, either supported alignment.
  auto side = weighted_one_of<std::string>(
      {{4, rc::gen::map(in_range(0, 20), [](int64_t w) { return std::to_string(w); })},
       {1, rc::gen::just<std::string>("inf")}});
  std::vector<std::string> aligns;
  if (br) aligns.push_back("br");
  if (tl) aligns.push_back("tl");
  auto windows = rc::gen::apply([](const std::string& l, const std::string& r,
                                   const std::string& a) { return "window:" + l + "," + r + "-" + a; },
                                side, side, element_of(aligns));
  if (forms.empty()) return windows;
  return weighted_one_of<std::string>({{4, element_of(forms)}, {1, windows}});
}

rc::Gen<ValueDist> gen_value_dist(bool extreme) {
  auto dist = [](Distribution k, double p) { return ValueDist{k, p}; };
  auto uniform1 = rc::gen::just(dist(Distribution::kUniform, 1));
  auto uniform = rc::gen::map(element_of(std::vector<double>{0.5, 2, 10, 1e-3}),
                              [=](double a) { return dist(Distribution::kUniform, a); });
  auto normal = rc::gen::map(element_of(std::vector<double>{1, 0.5, 3}),
                             [=](double s) { return dist(Distribution::kNormal, s); });
  auto extremes = rc::gen::map(element_of(space::extreme_magnitudes()),
                               [=](double m) { return dist(Distribution::kExtreme, m); });
  if (!extreme) return weighted_one_of<ValueDist>({{4, uniform1}, {1, uniform}, {1, normal}});
  return weighted_one_of<ValueDist>({{4, uniform1}, {1, uniform}, {1, normal}, {2, extremes}});
}

rc::Gen<SpecialValue> gen_special(ValueDomain domain) {
  return rc::gen::apply(
      [](SpecialKind kind, Tensor t, Placement pl, int64_t count) {
        SpecialValue s;
        s.kind = kind;
        s.tensor = t;
        s.placement = pl;
        s.count = count;
        return s;
      },
      element_of(space::special_kinds(domain)),
      element_of(std::vector<Tensor>{Tensor::kQ, Tensor::kK, Tensor::kV}),
      element_of(std::vector<Placement>{Placement::kRandom, Placement::kVisible, Placement::kMasked,
                                        Placement::kHidden}),
      in_range(1, 3));
}

// Custom masks (issue 28 item 4): none / dense / bits (those allowed), block-sparse or not, a pattern, block pattern
// and size, a broadcast; each shrinking toward the first option.
void gen_masks(Case& c, uint32_t allowed) {
  std::vector<uint32_t> custom = {0};
  for (uint32_t bit : {AF_VARIANT_MASK_DENSE, AF_VARIANT_MASK_BITS})
    if (allowed & bit) custom.push_back(bit);
  uint32_t bits = *element_of(custom);
  if ((allowed & AF_VARIANT_BLOCK_SPARSE) && *element_of(std::vector<bool>{false, true})) bits |= AF_VARIANT_BLOCK_SPARSE;
  if (!bits) return;
  const std::string pattern = *element_of(std::vector<std::string>{"random:0.5", "rows:0.6", "random:0.1", "ones", "causal"});
  const std::string blocks = *element_of(std::vector<std::string>{"mixed", "empty-some", "partial", "full"});
  const auto size = *element_of(std::vector<std::pair<int32_t, int32_t>>{{16, 16}, {4, 8}, {1, 1}, {32, 64}});
  const std::string bcast = *element_of(std::vector<std::string>{"", "h", "b", "i", "bh"});
  if (std::string e = set_mask_variants(c, bits, pattern, blocks, bcast, size.first, size.second); !e.empty())
    throw std::logic_error(e);
}

rc::Gen<Case> gen_case(const CaseLimits& limits) {
  return rc::gen::exec([limits]() {
    // Heads (MHA / GQA / MQA from the case space) and batch, with min_bh <= B * Hq <= max_bh.
    std::vector<std::pair<int64_t, int64_t>> heads;
    for (auto hc : space::head_configs())
      if (hc.first <= limits.max_bh) heads.push_back(hc);
    if (heads.empty()) heads.push_back({1, 1});
    const auto [hq, hkv] = *element_of(heads);
    const int64_t max_b = std::max<int64_t>(1, limits.max_bh / hq);
    const int64_t min_b = std::min(max_b, std::max<int64_t>(1, (limits.min_bh + hq - 1) / hq));
    const int64_t b = *weighted_one_of<int64_t>(
        {{3, rc::gen::just(min_b)}, {1, in_range(min_b, std::max(min_b, std::min<int64_t>(max_b, 3)))}});

    // Sequence lengths: Sq == Sk half the time (the square case most kernels are tuned for).
    const int64_t sq = *gen_seq_len(limits.min_seq_q, limits.max_seq);
    int64_t sk;
    const int shape = *weighted_one_of<int>(
        {{10, rc::gen::just(0)}, {9, rc::gen::just(1)}, {limits.allow_empty_k ? 1 : 0, rc::gen::just(2)}});
    if (shape == 0)
      sk = sq;
    else if (shape == 1)
      sk = *gen_seq_len(1, limits.max_seq);
    else
      sk = 0;

    // Head dims: Dv == D unless the kernel allows otherwise and 1 time in 4.
    const int64_t d = *gen_head_dim(limits.dv_eq_d ? std::min(limits.max_d, limits.max_dv) : limits.max_d);
    int64_t dv = std::min(d, limits.max_dv);
    if (!limits.dv_eq_d && *weighted_one_of<bool>({{3, rc::gen::just(false)}, {1, rc::gen::just(true)}}))
      dv = *gen_head_dim(limits.max_dv);
    // MLA's shared K/V latent (issue 28 item 5): half the time V is a view of K's rows (Dv <= D: half of
    // those with a Dv below D, as MLA's 512 of 576), shrinking toward not shared.
    const bool shared = (limits.variants & AF_VARIANT_KV_SHARED) &&
                        *weighted_one_of<bool>({{1, rc::gen::just(false)}, {1, rc::gen::just(true)}});
    if (shared) {
      dv = std::min(dv, d);
      if (dv == d && d > 1 && *weighted_one_of<bool>({{1, rc::gen::just(false)}, {1, rc::gen::just(true)}}))
        dv = *in_range(1, d - 1);
    }

    Case c;
    c.problem = make_problem(b, hq, hkv, sq, sk, d, dv);
    if (shared) share_kv(c.problem);
    const std::string mask = *gen_mask(limits);
    if (std::string e = parse_mask(mask, c.problem); !e.empty()) throw std::logic_error(e);
    const float def = default_scale(d);
    c.problem.scale = *weighted_one_of<float>(
        {{8, rc::gen::just(def)},
         {1, element_of(std::vector<float>{1.0f, 0.5f * def, 2.0f * def, 1.0f / static_cast<float>(d)})},
         {1, element_of(std::vector<float>{1e-3f, 0.0f, 16.0f})}});

    c.values.dist = *gen_value_dist(limits.extreme);
    c.values.domain = limits.domain;
    c.problem.dtype = limits.dtype;
    if (limits.dtype != AF_DTYPE_F32) {
      std::vector<ValueDist> stress;
      if (limits.extreme)
        for (double m : space::lowp_extreme_magnitudes(limits.dtype)) stress.push_back({Distribution::kExtreme, m});
      for (double a : space::lowp_uniform_widths(limits.dtype)) stress.push_back({Distribution::kUniform, a});
      for (double a : space::lowp_wide_v(limits.dtype)) stress.push_back({Distribution::kWideV, a});
      if (!stress.empty() && *weighted_one_of<bool>({{3, rc::gen::just(false)}, {1, rc::gen::just(true)}}))
        c.values.dist = *element_of(stress);
      if (limits.dtype == AF_DTYPE_FP8_E4M3 || limits.dtype == AF_DTYPE_FP8_E5M2) {
        c.problem.q_descale = *element_of(space::fp8_descales());
        c.problem.k_descale = *element_of(space::fp8_descales());
        c.problem.v_descale = *element_of(space::fp8_descales());
      }
    }
    c.pass = limits.pass;
    if (limits.variants & kMaskVariants) gen_masks(c, limits.variants);
    if (limits.variants & kScoreVariants) {
      uint32_t bits = 0;
      for (uint32_t bit = 1; bit <= AF_VARIANT_BIAS; bit <<= 1)
        if ((limits.variants & bit) && *weighted_one_of<bool>({{1, rc::gen::just(false)}, {1, rc::gen::just(true)}}))
          bits |= bit;
      const float cap = *element_of(std::vector<float>{30.0f, 5.0f, 1.0f, 50.0f});
      c.variants.sink_range = *element_of(std::vector<double>{2, 0.5, 10});
      const std::string bcast = *element_of(std::vector<std::string>{"", "b", "h", "bh", "i", "j"});
      const Case masked = c;  // set_variants keeps the score bits only: the masks drawn above stay
      if (std::string e = set_variants(c, bits, cap, bcast); !e.empty()) throw std::logic_error(e);
      if (masked.problem.variants & kMaskVariants) {
        c.problem.variants |= masked.problem.variants & kMaskVariants;
        for (int d = 0; d < 3; ++d)
          c.problem.mask_stride[d] = masked.problem.mask_stride[d],
          c.problem.block_mask_stride[d] = masked.problem.block_mask_stride[d];
        c.problem.block_q = masked.problem.block_q, c.problem.block_k = masked.problem.block_k;
      }
    }
    if ((limits.variants & AF_VARIANT_HEAD_DESCALE) &&
        (limits.dtype == AF_DTYPE_FP8_E4M3 || limits.dtype == AF_DTYPE_FP8_E5M2) &&
        *weighted_one_of<bool>({{1, rc::gen::just(false)}, {1, rc::gen::just(true)}})) {
      // Per-head fp8 descales (issue 28 item 6): per batch 1 time in 4, each value from space::fp8_descales()
      // (shrinking toward 1, its first); the per-tensor ones stay as drawn above (the kernel must not read
      // them).
      c.problem.variants |= AF_VARIANT_HEAD_DESCALE;
      set_descale_strides(c.problem,
                          *weighted_one_of<bool>({{3, rc::gen::just(false)}, {1, rc::gen::just(true)}}));
      for (auto [a, query] :
           {std::pair{&c.variants.q_descale_h, true}, std::pair{&c.variants.k_descale_h, false},
            std::pair{&c.variants.v_descale_h, false}}) {
        a->resize(static_cast<size_t>(descale_h_elements(c.problem, query)));
        for (float& x : *a) x = *element_of(space::fp8_descales());
      }
    }
    if (limits.variants & AF_VARIANT_DROPOUT) {  // issue 29: p, generator, seed, offset (shrinking toward the first)
      const double drop_p = *element_of(std::vector<double>{0.1, 0.0, 0.5, 0.9, 0.999});
      const int32_t rng = *element_of(std::vector<int32_t>{AF_DROPOUT_RNG_PHILOX_FLASH, AF_DROPOUT_RNG_EXPORTED});
      const uint64_t offset = *element_of(std::vector<uint64_t>{0, (uint64_t{1} << 32) - 40, 12345});
      const uint64_t dseed = 1 + *index_below(1000);
      if (std::string e = set_dropout(c.problem, drop_p, rng, dseed, offset); !e.empty()) throw std::logic_error(e);
    }
    if (limits.specials && *weighted_one_of<bool>({{1, rc::gen::just(false)}, {1, rc::gen::just(true)}})) {
      // 1..3 specials; the container shrinks by dropping elements, each element toward nan@q:random*1.
      c.values.specials =
          *rc::gen::resize(3, rc::gen::container<std::vector<SpecialValue>>(gen_special(limits.domain)));
      if (c.values.specials.size() > 3) c.values.specials.resize(3);
    }
    c.seed = *rc::gen::map(in_range(0, (int64_t{1} << 32) - 1),
                           [](int64_t x) { return static_cast<uint64_t>(x); });
    fit_value_domain(c);  // activations: distribution, scale and specials in its bounds
    if (std::string e = validate(c); !e.empty())
      throw std::logic_error("gen_case made an invalid case: " + e);
    return c;
  });
}

rc::Gen<std::vector<int64_t>> gen_seq_lengths(int64_t max, int64_t max_n) {
  return rc::gen::exec([max, max_n]() {
    const int how = *weighted_one_of<int>({{2, rc::gen::just(0)}, {2, rc::gen::just(1)}, {1, rc::gen::just(2)}});
    const int64_t n = *in_range(1, std::max<int64_t>(1, max_n));
    std::vector<int64_t> v;
    if (how == 0) {  // from the case space's lists
      const auto lists = space::seq_length_lists(max);
      if (!lists.empty()) v = *element_of(lists);
      if (static_cast<int64_t>(v.size()) > max_n) v.resize(static_cast<size_t>(max_n));
    } else if (how == 1) {  // each length: zero, one, a tile residue, any
      std::vector<int64_t> edges{1, 0};
      for (int64_t t : space::tile_sizes())
        for (int64_t x : {t - 1, t, t + 1})
          if (x <= max) edges.push_back(x);
      for (int64_t i = 0; i < n; ++i)
        v.push_back(*weighted_one_of<int64_t>({{3, element_of(edges)}, {1, in_range(0, max)}}));
    } else {  // one long among short ones
      const int64_t long_at = *in_range(0, n - 1);
      for (int64_t i = 0; i < n; ++i) v.push_back(i == long_at ? *in_range(std::min<int64_t>(max, 64), max) : *in_range(0, 3));
    }
    if (v.empty()) v.push_back(1);
    return v;
  });
}

rc::Gen<Case> gen_sequence_case(const CaseLimits& limits, uint32_t features, uint32_t variants) {
  return rc::gen::exec([limits, features, variants]() {
    std::vector<int> kinds;  // 0 varlen, 1 varlen + seqused, 2 kvcache, 3 paged, 4 decode
    const bool used = features & AF_FEATURE_SEQUSED_K;
    if ((features & AF_FEATURE_Q_PACKED) && (features & AF_FEATURE_KV_PACKED)) kinds.push_back(0);
    if ((features & AF_FEATURE_Q_PACKED) && (features & AF_FEATURE_KV_PACKED) && used) kinds.push_back(1);
    if (used) kinds.push_back(2);
    if ((features & AF_FEATURE_KV_PAGED) && used) kinds.push_back(3), kinds.push_back(4);
    if (kinds.empty()) throw rc::GenerationFailure("the kernel declares no sequence layout");
    const int kind = *element_of(kinds);
    std::vector<std::pair<int64_t, int64_t>> heads;
    for (auto hc : space::head_configs())
      if (hc.first <= limits.max_bh) heads.push_back(hc);
    if (heads.empty()) heads.push_back({1, 1});
    const auto [hq, hkv] = *element_of(heads);
    const int64_t max = std::min<int64_t>(limits.max_seq, 130);
    std::vector<int64_t> lens = *gen_seq_lengths(max, 4);
    const int64_t B = static_cast<int64_t>(lens.size());
    const int64_t d = *gen_head_dim(limits.dv_eq_d ? std::min(limits.max_d, limits.max_dv) : limits.max_d);
    const int64_t dv = std::min(d, limits.max_dv);
    Case c;
    c.problem = make_problem(B, hq, hkv, 1, 1, d, dv);
    const std::string mask = *gen_mask(limits);
    if (std::string e = parse_mask(mask, c.problem); !e.empty()) throw std::logic_error(e);
    Problem& p = c.problem;
    SeqLayout& s = c.seqs;
    if (kind <= 1) {
      p.q_layout = p.kv_layout = AF_SEQ_PACKED;
      s.q = lens;
      if (*std::max_element(s.q.begin(), s.q.end()) == 0) s.q[0] = 1;
      s.k = *weighted_one_of<std::vector<int64_t>>({{1, rc::gen::just(s.q)}, {1, rc::gen::container<std::vector<int64_t>>(static_cast<size_t>(B), in_range(0, max))}});
      if (kind == 1) {
        for (int64_t& x : s.k) x = std::max<int64_t>(x, 1);
        for (int64_t x : s.k) s.used.push_back(*in_range(0, x));
      }
    } else {
      p.seq_q = kind == 4 ? *in_range(1, 8) : *gen_seq_len(1, std::min<int64_t>(max, 40));
      s.used = lens;
      if (kind == 2) {
        p.seq_k = *std::max_element(lens.begin(), lens.end()) + *element_of(std::vector<int64_t>{0, 1, 16});
        p.seq_k = std::max<int64_t>(p.seq_k, 1);
      } else {
        p.kv_layout = AF_SEQ_PAGED;
        p.page_size = static_cast<int32_t>(*element_of(space::page_sizes()));
        s.page_order = *weighted_one_of<uint64_t>({{1, rc::gen::just<uint64_t>(0)}, {2, rc::gen::map(in_range(1, 1 << 30), [](int64_t x) { return static_cast<uint64_t>(x); })}});
        s.spare_pages = *in_range(0, 2);
        if (*weighted_one_of<bool>({{3, rc::gen::just(false)}, {1, rc::gen::just(true)}})) {
          s.k = lens;
          for (int64_t& x : s.k) x += p.page_size;  // a reserved page past the used length
        }
        if (std::all_of(lens.begin(), lens.end(), [](int64_t x) { return x == 0; }) && s.spare_pages == 0)
          s.spare_pages = 1;
      }
    }
    if (std::string e = set_sequence_fields(c); !e.empty()) throw std::logic_error("gen_sequence_case: " + e);
    c.values.dist = *gen_value_dist(limits.extreme);
    c.values.domain = limits.domain;
    if (limits.specials && *weighted_one_of<bool>({{2, rc::gen::just(false)}, {1, rc::gen::just(true)}})) {
      SpecialValue sv = *gen_special(limits.domain);
      sv.placement = Placement::kRandom;
      c.values.specials.push_back(sv);
    }
    c.seed = *rc::gen::map(in_range(0, (int64_t{1} << 32) - 1), [](int64_t x) { return static_cast<uint64_t>(x); });
    const uint32_t layout_vars = (features & AF_FEATURE_LAYOUT_VARIANTS) ? variants & kLayoutVariants : 0;
    if (layout_vars && *weighted_one_of<bool>({{1, rc::gen::just(false)}, {1, rc::gen::just(true)}})) {
      const uint32_t bits = *rc::gen::suchThat(in_range(1, kLayoutVariants), [layout_vars](int64_t x) {
        return (static_cast<uint32_t>(x) & ~layout_vars) == 0;
      });
      const float cap = *element_of(std::vector<float>{5.0f, 30.0f});
      if (std::string e = set_variants(c, static_cast<uint32_t>(bits), cap); !e.empty())
        throw std::logic_error("gen_sequence_case: " + e);
    }
    fit_value_domain(c);
    if (std::string e = validate(c); !e.empty()) throw std::logic_error("gen_sequence_case made an invalid case: " + e);
    return c;
  });
}

}  // namespace props
}  // namespace attnfuzz
