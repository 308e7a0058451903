// case.h - the one definition of a test case (problem + value specification + seed + optional values).
//
// Every driver (attn-check, attn-fuzz, properties, corpus replay) describes an input with a Case and
// turns it into numbers with generate(). The numbers are a pure function of the Case: the project's
// own RNG (splitmix64 -> xoshiro256**) and Box-Muller normal, no std:: distributions, so the same
// Case gives the same bits on every run of the same build.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnfuzz/problem.h"

namespace attnfuzz {

// ---------------------------------------------------------------------------------------------------
// Random numbers.

// splitmix64 step: returns the next output and advances x. Also used to derive stream seeds.
uint64_t splitmix64(uint64_t& x);

// xoshiro256** seeded through splitmix64 from (seed, stream). Streams with different ids are
// independent, so adding a special value never changes the base values of q, k or v.
class Rng {
 public:
  explicit Rng(uint64_t seed, uint64_t stream = 0);
  uint64_t next();
  double uniform01();          // [0, 1), 53 random bits
  uint64_t below(uint64_t n);  // [0, n), n >= 1 (unbiased, rejection)
  double normal();             // standard normal, Box-Muller (cos branch only)

 private:
  uint64_t s_[4];
};

// ---------------------------------------------------------------------------------------------------
// Value specification.

enum class Distribution {
  kUniform,  // q, k, v uniform in [-param, param]
  kNormal,   // q, k, v normal(0, sigma = param)
  kExtreme,  // q, k uniform in [-c, c] with c = sqrt(3 * param / (|scale| * sqrt(D))), v uniform [-1, 1]:
             // the RMS of the scores s = scale * q.k over random q, k is param (= MAG), so a row's
             // largest |s| is typically 2-3 x MAG. MAG = 30 already overflows exp(s) without max
             // subtraction in ~1/3 of rows; MAG = 100 makes every row do.
  kVBias,    // q, k uniform in [-param, param], v uniform in [0, param]: O keeps a non-zero mean at any Sk, so
             // errors of sums that drift with Sk (half-precision row sums / accumulators) stay visible
  kWideV,    // q, k uniform in [-1, 1] (near-uniform weights), v uniform in [param / 2, param] (one sign): the
             // un-normalised accumulator sum exp(s - m) v reaches ~0.75 n param before the division by the row
             // sum, past a storage format's range where n param is (issue 25: f16 accumulators)
};
const char* distribution_name(Distribution d);  // "uniform", "normal", "extreme", "vbias", "widev"

struct ValueDist {
  Distribution kind = Distribution::kUniform;
  double param = 1.0;  // uniform: half-width a > 0; normal: sigma > 0; extreme: MAG > 0
};
// "uniform[:A]", "normal[:SIGMA]", "extreme:MAG", "vbias[:A]", "widev[:A]" (A, SIGMA default 1). Returns an error sentence
// or empty.
std::string parse_distribution(const std::string& text, ValueDist& out);
std::string to_string(const ValueDist& d);  // "uniform:1", "extreme:30" (shortest round-trip form)

enum class Tensor { kQ, kK, kV };
const char* tensor_name(Tensor t);  // "q", "k", "v"

enum class SpecialKind {
  kNaN,        // quiet NaN 0x7fc00000
  kPosInf,     // +inf
  kNegInf,     // -inf
  kSubnormal,  // random sign, random non-zero 23-bit mantissa, exponent 0
  kHuge,       // +-FLT_MAX (random sign): products overflow, usually outside the fp32 contract
  kNegZero,    // -0.0
};
const char* special_kind_name(SpecialKind k);  // "nan", "inf", "-inf", "subnormal", "huge", "-0"

// Where special values go. Positions are sequence positions of the chosen tensor: query rows for q,
// key positions for k and v. (b, head and the head-dim index are drawn uniformly.)
enum class Placement {
  kRandom,   // any position
  kVisible,  // q: a row with at least one visible key; k/v: a key that at least one query row sees
  kMasked,   // q: a fully masked row; k/v: a key masked for at least one query row
  kHidden,   // q: a fully masked row; k/v: a key that no query row sees (must not reach any output)
  kAt,       // exactly at (b, h, s, d) (h: q head for q, kv head for k and v)
};
const char* placement_name(Placement p);  // "random", "visible", "masked", "hidden", "at"

struct SpecialValue {
  SpecialKind kind = SpecialKind::kNaN;
  Tensor tensor = Tensor::kK;
  Placement placement = Placement::kRandom;
  int64_t count = 1;                   // values to place, >= 0 (positions drawn with replacement)
  int64_t b = 0, h = 0, s = 0, d = 0;  // Placement::kAt only
};
// "KIND[@TENSOR][:PLACEMENT][*COUNT]": KIND nan|inf|+inf|-inf|subnormal|huge|-0, TENSOR q|k|v (default
// k), PLACEMENT random|visible|masked|hidden|at=S,D|at=B,H,S,D (default random), COUNT >= 0 (default 1).
// Examples: "nan@k:masked", "inf@v:visible*3", "-inf@q:at=0,0,5,3". Returns an error sentence or empty.
std::string parse_special(const std::string& text, SpecialValue& out);
std::string to_string(const SpecialValue& s);  // canonical form of the above, e.g. "nan@k:masked*2"

// Low-precision cases (problem.dtype f16 / bf16 / fp8): q, k and v hold the values the device buffers store
// (the "stored" values; for fp8 the real input is stored * descale), each exactly representable in the dtype
// and kept here as floats (every such value is an fp32 value). generate() rounds every base value, special
// value and explicit value to the dtype (oracle/lowp.h to_stored): a special takes the format's own value
// (huge = +-max of the format, subnormal = a subnormal of the format, inf = +-Inf except in fp8-e4m3, which
// has no Inf and stores +-448 instead, the saturating conversion's result).

// Which fp values a case may hold in q, k and v (docs/semantics.md "Value domains"). ieee: every fp32 value incl.
// NaN and +-Inf. finite: no NaN / +-Inf (extreme magnitudes, FLT_MAX, subnormals and -0 stay), for kernels
// whose contract excludes non-finite inputs. activations: what an LLM's q, k and v hold, for kernels whose
// contract is model activations: finite, |x| <= kActivationBound, a few outlier channels per head scaled 10-50x
// (generate()), no special value but -0, a uniform / normal / vbias / widev distribution of parameter in
// [kActivationParamMin, kActivationParamMax], a scale within kActivationScaleRange x of default_scale(D); its
// cases are always of the ordinary input tier. Stride gaps (kStrideGapBits) are not values of q, k or v.
enum class ValueDomain : uint8_t { kIeee = 0, kFinite, kActivations };
const char* value_domain_name(ValueDomain d);  // "ieee", "finite", "activations"
// "ieee" | "finite" | "activations". Returns an error sentence or empty.
std::string parse_value_domain(const std::string& text, ValueDomain& out);
// Whether a special value of kind k may be placed under domain d (finite: not nan, inf, -inf; activations: -0 only).
bool special_in_domain(SpecialKind k, ValueDomain d);
inline bool finite_domain(ValueDomain d) { return d != ValueDomain::kIeee; }  // no NaN / Inf in q, k, v
constexpr double kActivationBound = 64;                                       // activations: |q|, |k|, |v| <= 64
constexpr double kActivationParamMin = 1e-3, kActivationParamMax = 4;         // activations: distribution parameter
constexpr double kActivationScaleRange = 8;  // activations: default_scale(D) / 8 <= scale <= 8 default_scale(D)
// Whether an explicit q / k / v value x is in domain d, and x moved into it (finite: NaN -> 0, +-Inf -> +-FLT_MAX;
// activations: NaN -> 0, clamped to +-kActivationBound; ieee: x).
bool value_in_domain(float x, ValueDomain d);
float to_domain(float x, ValueDomain d);

struct ValueSpec {
  ValueDist dist;
  std::vector<SpecialValue> specials;  // applied in order, after the base values
  ValueDomain domain = ValueDomain::kIeee;
};

// Values given verbatim (e.g. after minimization or from an external reproducer): each vector holds
// exactly q_elements / k_elements / v_elements(problem) floats laid out with the problem's strides.
struct ExplicitValues {
  std::vector<float> q, k, v;
  std::vector<float> dout;  // backward cases: dO (o_elements floats, o strides); empty = generated from the seed
};

// Varlen batches, KV cache and paged KV (docs/semantics.md "Sequence layouts"): the per-sequence lengths
// and the page arrangement behind the problem's q_layout / kv_layout. Empty vectors where a layout is dense.
// The problem's derived fields (seq_q, seq_k, total_q, total_k, kv_capacity, num_pages, max_pages_per_seq,
// strides) follow from these through set_sequence_fields(); validate() checks that they agree.
// Malformed sequence metadata (issue 30 item 6a; docs/semantics.md "Malformed metadata"): one deliberate defect in
// the int32 arrays the kernel receives, as FlashInfer's fuzzing contract tests them. The oracle, the dense view and
// reports keep the well-formed arrays; only the runner's upload applies the defect (apply_malformation). A kernel
// must refuse it (a non-zero launch return) or, where a right answer exists (malformation_has_answer), return it;
// accepting it otherwise is the class accepted-malformed.
enum class Malformation : uint8_t {
  kNone = 0,
  kCuQDecreasing,          // cu_seqlens_q[seq + 1] = cu_seqlens_q[seq] - 1 (not monotone)
  kCuKDecreasing,          // cu_seqlens_k[seq + 1] = cu_seqlens_k[seq] - 1 (not monotone)
  kCuKPastTotal,           // cu_seqlens_k[seq + 1 .. B] + 1: the last entry passes total_k
  kSequsedOverCapacity,    // seqused_k[seq] = its capacity + 1 (kv_capacity; packed K/V: the sequence's slots)
  kSequsedNegative,        // seqused_k[seq] = -1
  kPageOutOfPool,          // the last page sequence seq uses names page num_pages (outside the pool)
  kPageNegative,           // the last page sequence seq uses names page -1
  kPageUnusedOutOfPool,    // the block-table entry after sequence seq's used pages names page num_pages + 3: never
                           // needed, so the well-formed result is the right answer
};
const char* malformation_name(Malformation m);  // "none", "cu-q-decreasing", ..., "page-unused-out-of-pool"
struct Malformed {
  Malformation kind = Malformation::kNone;
  int64_t seq = 0;  // the sequence the defect is in, 0 .. B - 1
  bool operator==(const Malformed&) const = default;
};

struct SeqLayout {
  std::vector<int64_t> q;     // packed q: query tokens of each sequence (B entries, >= 0); empty: dense q
  std::vector<int64_t> k;     // packed / paged K/V: key slots of each sequence (packed: the cu_seqlens_k
                              // differences; paged: the sequence has ceil(k / page_size) pages); empty: dense
  std::vector<int64_t> used;  // seqused_k: keys in use of each sequence (<= its slots; dense K/V: <= Sk);
                              // empty: no seqused_k buffer (every slot is a key). Required when paged.
  uint64_t page_order = 0;    // paged: 0 = pool pages in sequence order, else the seed of the pool's shuffle
  int64_t spare_pages = 0;    // paged: pool pages no sequence references (poisoned, like every gap)
  Malformed malformed;        // a defect the kernel receives in its arrays (kNone: well-formed)
  bool operator==(const SeqLayout&) const = default;
};
// Which pass a case checks (issue 14). kFwd: O and LSE. kBwd: the backward launch alone, given the oracle's
// exact O and LSE rounded to the dtype, judged on dQ, dK, dV. kFwdBwd: the kernel's own forward O and LSE
// feed its backward launch (as training does); O / LSE and dQ / dK / dV are all judged.
enum class Pass : uint8_t { kFwd = 0, kBwd, kFwdBwd };
const char* pass_name(Pass p);  // "fwd", "bwd", "fwdbwd"
// "fwd" | "bwd" | "fwdbwd" (also "fwd+bwd"). Returns an error sentence or empty.
std::string parse_pass(const std::string& text, Pass& out);
inline bool has_backward(Pass p) { return p != Pass::kFwd; }

// The values of a case's score variants (docs/semantics.md "Variants"). Which variants a case uses, the softcap
// and the bias strides are fields of its problem (variants, softcap, bias_stride); this holds what the buffers
// carry. Each list is either given (explicit, e.g. from a reproducer) or, when empty, generated from the seed.
struct VariantSpec {
  std::vector<float> sinks;         // [Hq] sink logits, each finite or -inf (= no sink for that head); empty:
                                    // uniform in [-sink_range, sink_range] from stream (seed, 6)
  double sink_range = 2;            // > 0
  std::vector<float> alibi_slopes;  // [Hq] finite slopes; empty: alibi_default_slopes(Hq) (the paper's rule)
  std::vector<float> bias;          // bias_elements(problem) floats with bias_stride; empty: uniform in
                                    // [-bias_range, bias_range] from stream (seed, 7)
  double bias_range = 1;            // > 0
  // Custom masks (docs/semantics.md "Custom masks"): the bytes of buffers.custom_mask (custom_mask_bytes(problem),
  // with mask_stride; dense: non-zero = visible; bits: FlashInfer's packing) and of buffers.block_mask
  // (block_mask_bytes(problem), values 0 / 1 / 2). Empty: generated from mask_pattern from stream (seed, 10) and
  // from block_pattern from stream (seed, 11); both patterns are MaskPattern texts (parse_mask_pattern).
  std::vector<uint8_t> custom_mask;
  std::string mask_pattern = "random:0.5";
  std::vector<uint8_t> block_mask;
  std::string block_pattern = "mixed";
  // Per-head fp8 descales (AF_VARIANT_HEAD_DESCALE; problem.descale_stride): q per query head, k and v per KV head
  // (descale_h_elements floats each), each valid as validate_descales requires. Empty: drawn from
  // space::fp8_descales() from stream (seed, 12).
  std::vector<float> q_descale_h, k_descale_h, v_descale_h;
  bool operator==(const VariantSpec&) const = default;
};

// Merged attention states (issue 29; docs/semantics.md "Merged states"): a case whose problem has n_states > 0 is
// checked on merge kernels (AF_KIND_MERGE). Its key range [0, Sk) (per sequence [0, Sk_b)) is cut into n_states
// consecutive ranges [cuts[s], cuts[s + 1]) (possibly empty); state s is the exact (O_s, LSE_s) of the problem
// restricted to range s, O_s rounded to the dtype and LSE_s to fp32, then LSE_s + lse_shift[s] (states of
// different problems: one dominating by 1e4; -inf drops the state: O_s = 0, LSE_s = -inf). The state buffers'
// strides (problem.state_o_stride / state_lse_stride) follow from layout and pad through set_merge_fields().
struct MergeSpec {
  std::vector<int64_t> cuts;       // n_states + 1 entries: 0 = cuts[0] <= cuts[1] <= ... <= cuts[n] = Sk
  std::vector<double> lse_shift;   // n_states entries, finite or -inf; empty = every shift 0
  int32_t layout = 0;              // 0: state-major O [n, B, Sq, Hq, Dv], LSE [n, B, Hq, Sq];
                                   // 1: token-major O [B, Sq, n, Hq, Dv], LSE [B, Hq, Sq, n] (packed q: total_q for B, Sq)
  int64_t pad = 0;                 // elements of stride gap after each state head row of O (head stride Dv + pad)
  bool operator==(const MergeSpec&) const = default;
};

// A test case. When explicit_values is set it *is* the input, and values/seed are provenance only.
struct Case {
  Problem problem{};
  ValueSpec values;
  uint64_t seed = 0;
  std::optional<ExplicitValues> explicit_values;
  std::string label;  // optional human name ("tail-33x33-causal"), not part of the case's identity
  SeqLayout seqs;     // per-sequence lengths and pages when has_sequences(problem)
  Pass pass = Pass::kFwd;  // which pass is checked; backward cases also generate dO
  VariantSpec variants;    // values of problem.variants' buffers (sinks, ALiBi slopes, bias)
  MergeSpec merge;         // merge cases (problem.n_states > 0): the key ranges and shifts of the states
};

// A case with make_problem(...) shape, uniform:1 values and the given seed.
Case make_case(const Problem& p, uint64_t seed = 0);

// Moves c into its value domain: under activations an extreme distribution becomes uniform:1, the parameter is
// clamped to [kActivationParamMin, kActivationParamMax], a scale out of range becomes default_scale(D), special
// values other than -0 are dropped and explicit q / k / v values go through to_domain. Under ieee and finite, and
// for a case already in its domain, c is unchanged. The fuzz codec and the property generators end with it.
void fit_value_domain(Case& c);

// Empty when the case can be generated, else a sentence naming the first problem
// (includes validate(problem)). Under ValueDomain::kFinite a NaN / Inf special value, or a NaN / Inf
// explicit value at an addressed element, is a problem; under kActivations also what fit_value_domain changes.
std::string validate(const Case& c);

// One line, e.g. "B=1 Hq=2 Hkv=1 Sq=7 Sk=13 D=59 Dv=59 mask=causal-br scale=0.130188912 f32
// values=uniform:1 special=nan@k:masked seed=0x000000000000002a" (+ " explicit" when values are given,
// + " domain=finite" under the finite value domain, + " pass=bwd" / " pass=fwdbwd" for backward cases).
std::string describe(const Case& c);

// How unusual a case's inputs are (docs/semantics.md "Input tiers"), least unusual first: ordinary (finite
// values of the magnitudes a model produces, a positive scale near 1/sqrt(D), no special value); extreme
// (finite but huge / tiny / subnormal values, extreme:MAG logits, a scale <= 0 or 1000x off);
// non-finite-visible (a NaN / Inf that every row able to see it sees: q of a row with keys, a key every row
// sees); non-finite-masked (every NaN / Inf sits where some row must not see it: a fully masked row's q, a
// key masked for some row). "Sees" is key_visible (problem.h): the mask kind and the custom / block masks.
enum class InputTier : uint8_t { kOrdinary = 0, kExtreme, kNonFiniteVisible, kNonFiniteMasked };
const char* input_tier_name(InputTier t);  // "ordinary", "extreme", "non-finite-visible", "non-finite-masked"
constexpr InputTier kInputTiers[] = {InputTier::kOrdinary, InputTier::kExtreme, InputTier::kNonFiniteVisible,
                                     InputTier::kNonFiniteMasked};
// "ordinary N, extreme N, non-finite-visible N, non-finite-masked N": failures counted per tier (index = tier).
std::string input_tier_counts(const int64_t (&n)[4]);
InputTier input_tier(const Case& c);

// ---------------------------------------------------------------------------------------------------
// Generation.

// Where one special value landed. index is the element offset in its tensor.
struct PlacedSpecial {
  SpecialKind kind;
  Tensor tensor;
  int64_t b, h, s, d, index;
};

struct Tensors {
  std::vector<float> q, k, v;         // q_elements / k_elements / v_elements(problem) floats
  std::vector<PlacedSpecial> placed;  // every special value written, in order
  int64_t unplaced = 0;               // specials asked for but with no position of that placement
  // Sequence arrays as the kernel receives them (af_buffers), derived from Case::seqs; empty where unused:
  // cu_seqlens_q [B+1] (packed q), cu_seqlens_k [B+1] (packed K/V), seqused_k [B] (kv_capacity > 0),
  // block_table [B, max_pages_per_seq] (paged; entries past a sequence's pages name a spare page, or 0).
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k, seqused_k, block_table;
  Malformed malformed;  // Case::seqs.malformed: applied to the arrays above when they are uploaded, nowhere else
  std::vector<float> dout;            // backward cases: dO, o_elements(problem) floats with o strides; else empty
  // Score variants (problem.variants): sinks [Hq], alibi_slopes [Hq], bias (bias_elements, bias_stride); empty
  // where the problem does not use the variant.
  std::vector<float> sinks, alibi_slopes, bias;
  // Merge cases: the partial states the merge kernel takes (state_o with problem.state_o_stride in the case's
  // dtype values, state_lse with state_lse_stride, fp32, natural log). Filled by the check layer (check/merge.h:
  // they are exact results of sub-problems), empty otherwise and after generate().
  std::vector<float> state_o, state_lse;
  // Custom masks: custom_mask (custom_mask_bytes, mask_stride), block_mask (block_mask_bytes, block_mask_stride).
  std::vector<uint8_t> custom_mask, block_mask;
  // Per-head descales (AF_VARIANT_HEAD_DESCALE): descale_h_elements floats each, with problem.descale_stride.
  std::vector<float> q_descale_h, k_descale_h, v_descale_h;
  VariantInputs variant_inputs() const {
    return {.sinks = sinks.empty() ? nullptr : sinks.data(),
            .alibi_slopes = alibi_slopes.empty() ? nullptr : alibi_slopes.data(),
            .bias = bias.empty() ? nullptr : bias.data(),
            .custom_mask = custom_mask.empty() ? nullptr : custom_mask.data(),
            .block_mask = block_mask.empty() ? nullptr : block_mask.data(),
            .q_descale_h = q_descale_h.empty() ? nullptr : q_descale_h.data(),
            .k_descale_h = k_descale_h.empty() ? nullptr : k_descale_h.data(),
            .v_descale_h = v_descale_h.empty() ? nullptr : v_descale_h.data()};
  }
};
// The patterns a custom mask or a block mask is generated from (VariantSpec::mask_pattern / block_pattern):
//   custom mask: "random:D" (each key visible with probability D in [0, 1]), "rows:D" (random:D with every row
//   fully masked with probability 1/4), "ones" (all visible), "zeros" (none), "causal" (visible iff j <= i + Sk -
//   Sq: the bottom-right causal pattern, for metamorphic relations);
//   block mask: "mixed" (0 / 1 / 2 uniformly), "full" (every block 1), "partial" (every block 2), "empty-some"
//   (1 or 2, with every fourth block 0 on average), "zeros" (every block empty).
// Empty when text is one of them (for the mask kind: custom true, block false).
std::string validate_mask_pattern(const std::string& text, bool custom);
// Fills bytes (custom_mask_bytes / block_mask_bytes of p) from the pattern with rng; gaps between rows stay 0.
void generate_custom_mask(const Problem& p, const std::string& pattern, Rng& rng, std::vector<uint8_t>& out);
void generate_block_mask(const Problem& p, const std::string& pattern, Rng& rng, std::vector<uint8_t>& out);
// Makes c use the custom masks `bits` (AF_VARIANT_MASK_DENSE or _BITS, and / or _BLOCK_SPARSE) with generated
// values: contiguous strides with the dimensions in broadcast (a subset of "bhi") broadcast, block sizes bq x bk.
std::string set_mask_variants(Case& c, uint32_t bits, const std::string& mask_pattern = "random:0.5",
                              const std::string& block_pattern = "mixed", const std::string& broadcast = "",
                              int32_t block_q = 16, int32_t block_k = 16);
// " variants=sink+softcap sinks=uniform:2 softcap=30 alibi=default bias=uniform:1/bcast=bh" (empty without variants).
std::string describe_variants(const Case& c);
// Empty when c's variant fields agree with its problem (called by validate(Case)).
std::string validate_variants(const Case& c);
// Makes c use the score variants `bits` (AF_VARIANT_SINK | _SOFTCAP | _ALIBI | _BIAS) with generated values:
// the softcap, and contiguous bias strides with the dimensions in bias_broadcast (a subset of "bhij")
// broadcast; with AF_VARIANT_HEAD_DESCALE (fp8 only) per-head descales with descale_stride {0, 1}. The
// dropout bit is left as it is (set_dropout, attnfuzz/dropout.h sets it); so is kv-shared, which
// AF_VARIANT_KV_SHARED in bits sets (share_kv). Returns an error sentence or empty.
std::string set_variants(Case& c, uint32_t bits, float softcap = 30, const std::string& bias_broadcast = "");

// The variants a case can lose and stay the same problem otherwise (score variants, custom masks, per-head
// descales; dropout and kv-shared are not dropped: one is its own sweep, the other geometry).
constexpr uint32_t kDroppableVariants = kScoreVariants | kMaskVariants | AF_VARIANT_HEAD_DESCALE;
// c without the variants `bits` (a subset of kDroppableVariants): their bits, problem fields and values cleared,
// everything else (shape, seed, other variants' values) as it was. Returns validate(c), or why bits cannot go.
std::string drop_variants(Case& c, uint32_t bits);

// ---- Merged states (core/merge.cpp) ----
// Whether c is a merge case (problem.n_states > 0).
inline bool is_merge(const Problem& p) { return p.n_states > 0; }
// Makes c a merge case over the given cuts (n_states + 1 entries, see MergeSpec), shifts, layout and pad, and sets
// the state strides (set_merge_fields). Returns an error sentence or empty.
std::string set_merge(Case& c, std::vector<int64_t> cuts, std::vector<double> lse_shift = {}, int32_t layout = 0,
                      int64_t pad = 0);
// set_merge from text: cuts "0,32,40", shifts "0,-1e4" or "" (each a number or -inf), token-major or not, pad.
// Returns an error sentence or empty.
std::string parse_merge(const std::string& cuts, const std::string& shifts, bool token_major, int64_t pad, Case& c);
// Sets problem.state_o_stride / state_lse_stride from c.merge's layout and pad (after set_sequence_fields for a
// sequence layout). Returns an error sentence or empty.
std::string set_merge_fields(Case& c);
// Empty when c's merge fields agree with its problem (called by validate(Case)).
std::string validate_merge(const Case& c);
// " merge=3 cuts=0,5,9,13 shift=0,-10000,0 state-layout=token pad=3" (empty unless a merge case).
std::string describe_merge(const Case& c);
// Elements the state buffers span (0 unless a merge case).
int64_t state_o_elements(const Problem& p);
int64_t state_lse_elements(const Problem& p);
// Element offsets of state st's O (token s of sequence b; packed q: row cu_seqlens_q[b] + s) and LSE.
int64_t state_o_offset(const Problem& p, const std::vector<int32_t>& cu_seqlens_q, int64_t st, int64_t b, int64_t s,
                       int64_t h, int64_t d);
int64_t state_lse_offset(const Problem& p, int64_t st, int64_t b, int64_t h, int64_t s);
// The keys of state st for a sequence of sk keys: [cuts[st], cuts[st + 1]) clipped to [0, sk).
KeyRange merge_range(const MergeSpec& m, int64_t st, int64_t sk);
// The shift of state st (0 when lse_shift is empty).
double merge_shift(const MergeSpec& m, int64_t st);

// Bit pattern written into stride gaps (elements no index of the problem addresses): a quiet NaN
// with a recognisable payload, so a kernel that ignores the strides produces NaN instead of luck.
constexpr uint32_t kStrideGapBits = 0x7fe5a5a5u;

// Deterministic values for the case. Order: base values of q, k, v in logical (b, s, h, d) order, each
// tensor from its own stream (seed, 1 / 2 / 3); then specials from stream (seed, 4); for a backward case
// dO uniform in [-1, 1] from stream (seed, 5) (so q, k, v keep the bits of the forward case). Explicit
// values, when present, are returned as they are (placed is then empty; dO generated when not given). Under ValueDomain::kFinite a base value
// that rounds to +-Inf in fp32 (e.g. normal with a huge sigma) is clamped to +-FLT_MAX. Under kActivations the
// base values of 1 + D / 64 channels of each head of q, k and v (D >= 4; channels and factors from stream
// (seed, 12), per tensor and head) are scaled by a factor in [10, 50], and every base value is clamped to
// +-kActivationBound. Throws
// std::invalid_argument when validate(c) is not empty.
Tensors generate(const Case& c);

// ---------------------------------------------------------------------------------------------------
// Sequences (varlen / KV cache / paged KV). Implemented in core/sequences.cpp.

// Bit pattern generate() writes into every q / k / v element outside a sequence (capacity tails, slots of a
// last page past the used length, unreferenced pool pages): a NaN whose payload names it. The runner
// rewrites these elements with its guard poison before each upload, so the poison-swap detector swaps them
// together with the guard zones.
constexpr uint32_t kSeqGapBits = 0x7fe5a5aau;

// Whether p uses a sequence layout: q or K/V not dense, or a KV cache (kv_capacity > 0 <=> seqused_k is
// passed). A kernel needs the matching AF_FEATURE_* bits (feature_bits).
bool has_sequences(const Problem& p);
uint32_t feature_bits(const Problem& p);
// "dense", "varlen" (packed q and K/V), "varlen-q", "varlen-k", "kvcache" (dense K/V with seqused_k),
// "paged"; "+seqused" is appended to a packed K/V with seqused_k.
std::string layout_name(const Problem& p);

// Sets the problem's derived fields from c.seqs and its layouts (q_layout, kv_layout, page_size, and for
// dense K/V seq_k = capacity): seq_q / seq_k (max lengths; seq_q >= 1), total_q, total_k, kv_capacity,
// num_pages, max_pages_per_seq and contiguous strides in the layout (packed [total, H, D], stride[0] = 0;
// paged [num_pages, page_size, H, D]; LSE [B, Hq, seq_q]). kv_capacity > 0 exactly when seqused_k is
// passed (dense: Sk; packed: the largest slot count; paged: max_pages_per_seq * page_size). Returns an
// error sentence or empty.
std::string set_sequence_fields(Case& c);
// Empty when c.seqs agrees with the problem (called by validate(Case)).
std::string validate_sequences(const Case& c);
// " layout=paged seqlens-q=1,1 seqlens-k=.. seqused-k=.. page-size=16 pages=7+2 order=0x.." (empty if dense).
std::string describe_sequences(const Case& c);

// ---- Malformed metadata (core/malformed.cpp) ----
// "KIND[@SEQ]" (SEQ default 0; "none" clears). Returns an error sentence or empty.
std::string parse_malformed(const std::string& text, Malformed& out);
std::string to_string(const Malformed& m);  // "cu-k-decreasing@1"
// The malformations p's layout has arrays for (cu_seqlens_q / _k, seqused_k, block_table), in enum order.
std::vector<Malformation> malformations_for(const Problem& p);
// Whether the arrays with m still name one attention problem whose indices are all in bounds (only
// page-unused-out-of-pool: the right answer is the well-formed result).
bool malformation_has_answer(Malformation m);
// Empty when c.seqs.malformed fits c (kind of c's layout, seq in range, the sequence has the page or entry it names).
std::string validate_malformed(const Case& c);
// The arrays of t with t.malformed applied (t itself when it is kNone), and the defect in words with the values
// ("cu_seqlens_k[2] = 4 < cu_seqlens_k[1] = 5 (cu-k-decreasing)").
Tensors malformed_arrays(const Problem& p, const Tensors& t);
std::string describe_malformation(const Problem& p, const Tensors& t);

// Per-sequence lengths from the problem and the arrays: query tokens, keys (the used length), key slots.
int64_t seq_len_q(const Problem& p, const Tensors& t, int64_t b);
int64_t seq_len_k(const Problem& p, const Tensors& t, int64_t b);
int64_t seq_slots_k(const Problem& p, const Tensors& t, int64_t b);
// Element offsets of token s of sequence b in the layout (dense: q_index etc.; packed: row cu[b] + s;
// paged: page block_table[b, s / P], slot s % P). LSE stays [B, Hq, seq_q] in every layout (lse_index):
// rows s >= seq_len_q(b) are not part of the output and must keep the pre-launch poison (canaries).
int64_t q_offset(const Problem& p, const Tensors& t, int64_t b, int64_t s, int64_t h, int64_t d);
int64_t k_offset(const Problem& p, const Tensors& t, int64_t b, int64_t s, int64_t h, int64_t d);
int64_t v_offset(const Problem& p, const Tensors& t, int64_t b, int64_t s, int64_t h, int64_t d);
int64_t o_offset(const Problem& p, const Tensors& t, int64_t b, int64_t s, int64_t h, int64_t d);
int64_t lse_offset(const Problem& p, const Tensors& t, int64_t b, int64_t h, int64_t s);

// The dense view: B sequences as a dense [B, Sq, H, D] problem (Sq = seq_q, Sk = the largest used key
// length, contiguous strides, dense layouts, same heads / dims / mask / scale / dtype). Outputs, the oracle
// and reports index a sequence-layout case through it: O[b, s, h, d] is token s of sequence b, and rows
// s >= seq_len_q(b) do not exist. (The mask of the view is nominal: it aligns per sequence.)
Problem dense_view(const Problem& p, const Tensors& t);
// Sequence b alone as a dense problem (B = 1, Sq = seq_len_q(b), Sk = seq_len_k(b)) and its q, k, v.
Problem sequence_problem(const Problem& p, const Tensors& t, int64_t b);
Tensors sequence_tensors(const Problem& p, const Tensors& t, int64_t b);
// Writes `bits` into every q / k / v element that lies outside every sequence (see kSeqGapBits).
void fill_outside(const Problem& p, Tensors& t, uint32_t bits);

// Per key position, how many query rows see it (the mask does not depend on b or h). Size Sk.
std::vector<int64_t> key_visibility_counts(const Problem& p);

// ---------------------------------------------------------------------------------------------------
// The case space: edge values shared by the sweep, the fuzzer's mutator and the property generators.
namespace space {

// Tile sizes kernels commonly use for the sequence axes: 16, 32, 64, 128.
const std::vector<int64_t>& tile_sizes();
// Sequence lengths worth hitting: 1, 2, 3, small primes, every tile size t and t +- 1, a few awkward
// lengths from flash-attention's tests (113, 203, 239). Sorted, unique, all <= max_len.
std::vector<int64_t> edge_seq_lengths(int64_t max_len = 256);
// Head dims: 1, 2, 3, odd and prime dims, powers of two and +-1 around them, 59, 111. <= max_d.
std::vector<int64_t> edge_head_dims(int64_t max_d = 256);
// (Hq, Hkv) pairs: MHA, GQA, MQA.
const std::vector<std::pair<int64_t, int64_t>>& head_configs();
// Mask texts for parse_mask: none, causal both alignments, windows (finite, one-sided, diagonal).
const std::vector<std::string>& mask_forms();
// Score magnitudes for Distribution::kExtreme: 1 .. 1e4, including the exp overflow edge (~88).
const std::vector<double>& extreme_magnitudes();
// Every dtype of the ABI: f32, f16, bf16, fp8-e4m3, fp8-e5m2.
const std::vector<int32_t>& dtypes();
// Inputs that stress a low-precision dtype (issue 13), empty for f32. Extreme score magnitudes that
// overflow exp(s) in the format without max subtraction (f16 ~11, e4m3 ~6, e5m2 ~11, bf16 ~89), and for
// f16 scores whose unscaled q.k overflows 65504 while scale * q.k does not (extreme:3000 at D = 64), and
// logits of 10^2 .. 10^4 where a softmax statistic kept in the format loses its relative precision (f16 300,
// bf16 1e3 and 1e4: issue 25).
std::vector<double> lowp_extreme_magnitudes(int32_t dtype);
// widev:A widths whose un-normalised accumulator (near-uniform weights, one-signed v) passes the format's range
// before the division by the row sum at ~128 keys (f16 2048, e4m3 16, e5m2 1024); empty for f32 and bf16.
std::vector<double> lowp_wide_v(int32_t dtype);
// Uniform half-widths for the dtype: the format's subnormal range (8 quanta), just above its smallest normal,
// and near its largest finite value (a quarter of max: products and sums leave the range). Empty for f32.
std::vector<double> lowp_uniform_widths(int32_t dtype);
// fp8 descale factors worth trying (exact in the sense of validate_descales): 1, powers of two, and
// non-powers with a few significand bits (0.375, 3.25, ...).
const std::vector<float>& fp8_descales();
const std::vector<SpecialKind>& special_kinds();
// The kinds allowed under d (for kFinite: subnormal, huge, -0; for kActivations: -0), in special_kinds() order.
const std::vector<SpecialKind>& special_kinds(ValueDomain d);

// Page sizes of paged K/V: 16, 32, 64, 128, 256.
const std::vector<int64_t>& page_sizes();
// Per-sequence length lists worth hitting (each entry <= max_len): residues 0, 1 and -1 mod 16/32/64/128,
// zero-length and single-token sequences, one long sequence among short ones, equal lengths.
std::vector<std::vector<int64_t>> seq_length_lists(int64_t max_len = 300);

}  // namespace space

// The sequence-layout sweeps of attn-check --layout L --sweep (L in sequence_layouts()): "varlen" (packed q
// and K/V), "varlen-q" (packed q, dense K/V), "varlen-k" (dense q, packed K/V), "kvcache" (dense K/V with seqused_k), "paged" (paged K/V, page sizes 16..256, shuffled tables,
// spare pages), "decode" (1..8 query tokens per sequence over a paged or cached K/V). Each crosses the
// length lists with masks (per-sequence alignment, windows), GQA / MQA and head dims; labelled, seeds
// derived from base_seed and the label. Empty for an unknown layout.
// With `variants` (attn-check --seq-layout L --sweep --variant V; kLayoutVariants and / or kv-shared): every case
// with them (kv-shared: V a view of K, cases with Dv > D left out; score variants: softcap 30, sinks in [-2, 2], the
// default ALiBi slopes, labelled "<variants>-<label>") plus the layout's variant edges: sinks that dominate on a
// window that leaves a token's first KV splits empty, logits far past a small cap, ALiBi over 12 heads on unequal
// lengths. Throws std::invalid_argument for variants outside kLayoutVariants | kv-shared.
std::vector<Case> layout_sweep_grid(const std::string& layout, uint64_t base_seed = 0, uint32_t variants = 0);
const std::vector<std::string>& sequence_layouts();

// The built-in edge-shape grid of attn-check --sweep (issue 4): 1x1, 7x13, 13x7, tails around
// 16/32/64/128, Sq != Sk both ways, odd D, Dv != D, GQA/MQA, batch, masks (both alignments, windows,
// fully masked rows, Sk = 0), extreme magnitudes and special values. About 100 cases, each with a
// label; each seed is derived from base_seed and the label, so adding a case never changes another.
// Under ValueDomain::kFinite every case has that domain and each NaN / Inf special-value case is
// replaced by the same case with huge (+-FLT_MAX) values at the same tensor and placement. Under kActivations
// the cases outside that domain (those fit_value_domain would change: extreme magnitudes, special values, scales
// far from 1/sqrt(D)) are left out (variant_sweep_grid likewise).
// With dtype other than f32 every case has that dtype and its label starts with the dtype ("f16-tail-..."),
// and the grid adds the space::lowp_* inputs of the dtype (and, for fp8, cases with descale factors).
// With a backward pass every case gets that pass (same labels and seeds: q, k, v are the forward grid's).
std::vector<Case> sweep_grid(uint64_t base_seed = 0, ValueDomain domain = ValueDomain::kIeee,
                             int32_t dtype = AF_DTYPE_F32, Pass pass = Pass::kFwd);
// The variant sweep of attn-check --sweep --variant V (issue 28): every case of sweep_grid with the variants
// `bits` (softcap 30; the bias broadcast cycling through none, b, h, bh, i, j, bhi), labelled "<variants>-<label>",
// plus the variants' own edge cases: softcap over |s / cap| >> 88 (extreme logits, small caps), a dominant sink
// and sinks of -inf, sinks on fully masked rows, ALiBi over 12 and 6 heads (not powers of two) and long rows,
// bias broadcasts with batch and GQA, -inf and large bias values. Seeds from base_seed and the label.
std::vector<Case> variant_sweep_grid(uint32_t bits, uint64_t base_seed = 0, ValueDomain domain = ValueDomain::kIeee,
                                     int32_t dtype = AF_DTYPE_F32, Pass pass = Pass::kFwd);

// The merge sweep of attn-check --sweep on a merge kernel (issue 29): two states, many states (up to 9), empty
// states, all states empty (Sk = 0, fully masked rows, every state dropped), one state dominating by 1e4 and all
// states far below 0 (LSE ~ -200), token-major and padded state strides, GQA, Dv != D, varlen q (packed), and the
// cascade split (a shared prefix and a suffix). Labelled "merge-..."; seeds from base_seed and the label.
std::vector<Case> merge_sweep_grid(uint64_t base_seed = 0, int32_t dtype = AF_DTYPE_F32);

// 64-bit FNV-1a of text, finished with a splitmix64 round (stable across builds and platforms).
uint64_t hash64(const std::string& text);
// The seed of a grid case: from the grid's base seed and the case's label (each sweep grid's cases).
uint64_t grid_seed(uint64_t base_seed, const std::string& label);

}  // namespace attnfuzz
