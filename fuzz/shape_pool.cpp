// shape_pool.cpp - compile-aware fuzzing: shape keys, snapping an input onto a compiled shape, the pool's budget and
// the first-call measurement.
#include "fuzz/shape_pool.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

namespace attnfuzz::fuzz {

namespace {

// "b" per dimension whose stride is 0 (broadcast), "." otherwise: the shape of a broadcast buffer.
template <size_t N>
std::string zero_pattern(const int64_t (&s)[N]) {
  std::string out;
  for (int64_t x : s) out += x == 0 ? 'b' : '.';
  return out;
}

template <typename T>
void copy_if_fits(std::vector<T>& to, const std::vector<T>& from) {
  if (from.size() == to.size()) to = from;
}

}  // namespace

std::string shape_key(const Case& c, uint32_t data_variants) {
  const Problem& p = c.problem;
  const uint32_t code = p.variants & ~(data_variants & kScoreVariants);  // the variants compiled in
  std::ostringstream k;
  k << p.batch << ' ' << p.heads_q << ' ' << p.heads_kv << ' ' << p.seq_q << ' ' << p.seq_k << ' ' << p.head_dim
    << ' ' << p.head_dim_v << ' ' << dtype_name(p.dtype) << ' ' << pass_name(c.pass) << " | " << p.q_layout << ' '
    << p.kv_layout << ' ' << p.page_size << ' ' << p.total_q << ' ' << p.total_k << ' ' << p.kv_capacity << ' '
    << p.num_pages << ' ' << p.max_pages_per_seq << " | " << p.mask_kind << ' ' << p.mask_align << ' '
    << p.window_left << ' ' << p.window_right << " | " << code;
  if (code & AF_VARIANT_SOFTCAP) k << " cap=" << p.softcap;
  if (p.variants & AF_VARIANT_DROPOUT) k << " p=" << p.dropout_p;
  if (code & AF_VARIANT_BIAS) k << " bias=" << zero_pattern(p.bias_stride);
  if (p.variants & (AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS)) k << " mask=" << zero_pattern(p.mask_stride);
  if (p.variants & AF_VARIANT_BLOCK_SPARSE)
    k << " blocks=" << p.block_q << 'x' << p.block_k << zero_pattern(p.block_mask_stride);
  if (p.variants & AF_VARIANT_HEAD_DESCALE) k << " descale=" << zero_pattern(p.descale_stride);
  for (int32_t t : p.tunables) k << ' ' << t;
  if (is_merge(p)) k << " merge=" << p.n_states << ',' << c.merge.layout << ',' << c.merge.pad;
  return k.str();
}

Case snap_shape(const Case& shape_of, const Case& values_of, const FuzzLimits& lim, uint32_t data_variants) {
  Case r = shape_of;
  r.values = values_of.values;
  r.seed = values_of.seed;
  r.problem.scale = values_of.problem.scale;
  if (const uint32_t data = data_variants & kScoreVariants) {  // values_of's choice of the data variants
    Problem& p = r.problem;
    p.variants = (p.variants & ~data) | (values_of.problem.variants & data);
    if (data & AF_VARIANT_SOFTCAP) p.softcap = values_of.problem.softcap;
    if ((data & AF_VARIANT_BIAS) && (p.variants & AF_VARIANT_BIAS))
      set_bias_strides(p, bias_broadcast(values_of.problem));
    else if (data & AF_VARIANT_BIAS)
      std::fill(std::begin(p.bias_stride), std::end(p.bias_stride), 0);
  }
  if (r.problem.variants & values_of.problem.variants & AF_VARIANT_DROPOUT) {
    r.problem.dropout_seed = values_of.problem.dropout_seed;
    r.problem.dropout_offset = values_of.problem.dropout_offset;
  }
  r.explicit_values.reset();
  if (const auto& e = values_of.explicit_values;
      e && static_cast<int64_t>(e->q.size()) == q_elements(r.problem) &&
      static_cast<int64_t>(e->k.size()) == k_elements(r.problem) &&
      static_cast<int64_t>(e->v.size()) == v_elements(r.problem) &&
      (e->dout.empty() || static_cast<int64_t>(e->dout.size()) == o_elements(r.problem)))
    r.explicit_values = e;
  VariantSpec& v = r.variants;
  const VariantSpec& w = values_of.variants;
  v.sink_range = w.sink_range, v.bias_range = w.bias_range;
  v.mask_pattern = w.mask_pattern, v.block_pattern = w.block_pattern;
  copy_if_fits(v.sinks, w.sinks), copy_if_fits(v.alibi_slopes, w.alibi_slopes), copy_if_fits(v.bias, w.bias);
  copy_if_fits(v.custom_mask, w.custom_mask), copy_if_fits(v.block_mask, w.block_mask);
  copy_if_fits(v.q_descale_h, w.q_descale_h), copy_if_fits(v.k_descale_h, w.k_descale_h);
  copy_if_fits(v.v_descale_h, w.v_descale_h);
  if (in_domain(r, lim).empty()) return r;
  std::erase_if(r.values.specials, [](const SpecialValue& s) { return s.placement == Placement::kAt; });
  if (in_domain(r, lim).empty()) return r;
  Case plain = shape_of;
  plain.seed = values_of.seed;
  return plain;
}

void same_shape_steps_first(const Case& cur, std::vector<Case>& candidates) {
  const std::string key = shape_key(cur);
  std::stable_partition(candidates.begin(), candidates.end(), [&](const Case& c) { return shape_key(c) == key; });
}

const char* compile_mode_name(CompileMode m) {
  switch (m) {
    case CompileMode::kOff: return "off";
    case CompileMode::kProbe: return "probe";
    case CompileMode::kPooled: return "pooled";
  }
  return "?";
}

bool ShapePool::takes(const std::string& key) const {
  if (mode_ == CompileMode::kOff || index_.count(key)) return true;
  if (shapes_.empty()) return refused_.empty();  // nothing compiled yet: as drawn until the kernel refuses one
  if (refused_.count(key)) return false;
  if (mode_ == CompileMode::kProbe) return firsts_.size() <= repeats_.size() && firsts_.size() < kProbeSamples;
  if (share_ >= 1) return true;  // every new shape, as without a pool (the pool still counts them)
  return shapes_.size() < kMaxShapes && new_s_ <= share_ * check_s_;
}

const Case* ShapePool::pick(uint64_t r) const { return shapes_.empty() ? nullptr : &shapes_[r % shapes_.size()]; }

bool ShapePool::record(const Case& c, const std::string& key, double first_call_s, double check_s) {
  if (mode_ == CompileMode::kOff) return false;
  ++checks_;
  check_s_ += check_s;
  const bool fresh = !index_.count(key);
  if (fresh && shapes_.size() < kMaxShapes) {
    index_.emplace(key, shapes_.size());
    shapes_.push_back(c);
  }
  if (fresh) ++admitted_, new_s_ += first_call_s;
  if (mode_ != CompileMode::kProbe) return false;
  (fresh ? firsts_ : repeats_).push_back(first_call_s);
  return decide();
}

bool ShapePool::decide() {
  if (firsts_.size() < kProbeSamples || repeats_.size() < kProbeSamples) return false;
  const double first = *std::min_element(firsts_.begin(), firsts_.end());
  const double repeat = *std::max_element(repeats_.begin(), repeats_.end());
  const bool compiles = first >= kCompileRatio * repeat && first - repeat >= kCompileExtraS;
  char why[160];
  std::snprintf(why, sizeof why, "measured: first call at a new shape >= %.3f s, repeat calls <= %.3f s", first,
                repeat);
  set_mode(compiles ? CompileMode::kPooled : CompileMode::kOff, why);
  return true;
}

void ShapePool::note_refused(const std::string& key, double support_s) {
  if (mode_ == CompileMode::kOff) return;
  ++refusals_;
  new_s_ += support_s;
  check_s_ += support_s;
  refused_.insert(key);
}

void ShapePool::reset() {
  shapes_.clear();
  index_.clear();
}

nlohmann::json ShapePool::stats() const {
  return {{"mode", compile_mode_name(mode_)}, {"why", why_},         {"shapes", admitted_},
          {"checks", checks_},                {"snapped", snapped_}, {"refused", refusals_}, {"new_shape_s", new_s_},
          {"check_s", check_s_}};
}

}  // namespace attnfuzz::fuzz
