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
};
const char* distribution_name(Distribution d);  // "uniform", "normal", "extreme"

struct ValueDist {
  Distribution kind = Distribution::kUniform;
  double param = 1.0;  // uniform: half-width a > 0; normal: sigma > 0; extreme: MAG > 0
};
// "uniform[:A]", "normal[:SIGMA]", "extreme:MAG" (A, SIGMA default 1). Returns an error sentence or empty.
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

// Which fp values a case may hold in q, k and v (DESIGN.md "Value domains"). ieee: every fp32 value incl.
// NaN and +-Inf. finite: no NaN / +-Inf (extreme magnitudes, FLT_MAX, subnormals and -0 stay), for kernels
// whose contract excludes non-finite inputs. Stride gaps (kStrideGapBits) are not values of q, k or v.
enum class ValueDomain : uint8_t { kIeee = 0, kFinite };
const char* value_domain_name(ValueDomain d);  // "ieee", "finite"
// "ieee" | "finite". Returns an error sentence or empty.
std::string parse_value_domain(const std::string& text, ValueDomain& out);
// Whether a special value of kind k may be placed under domain d (finite: not nan, inf, -inf).
bool special_in_domain(SpecialKind k, ValueDomain d);

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

// Which pass a case checks (issue 14). kFwd: O and LSE. kBwd: the backward launch alone, given the oracle's
// exact O and LSE rounded to the dtype, judged on dQ, dK, dV. kFwdBwd: the kernel's own forward O and LSE
// feed its backward launch (as training does); O / LSE and dQ / dK / dV are all judged.
enum class Pass : uint8_t { kFwd = 0, kBwd, kFwdBwd };
const char* pass_name(Pass p);  // "fwd", "bwd", "fwdbwd"
// "fwd" | "bwd" | "fwdbwd" (also "fwd+bwd"). Returns an error sentence or empty.
std::string parse_pass(const std::string& text, Pass& out);
inline bool has_backward(Pass p) { return p != Pass::kFwd; }

// A test case. When explicit_values is set it *is* the input, and values/seed are provenance only.
struct Case {
  Problem problem{};
  ValueSpec values;
  uint64_t seed = 0;
  std::optional<ExplicitValues> explicit_values;
  std::string label;  // optional human name ("tail-33x33-causal"), not part of the case's identity
  Pass pass = Pass::kFwd;  // which pass is checked; backward cases also generate dO
};

// A case with make_problem(...) shape, uniform:1 values and the given seed.
Case make_case(const Problem& p, uint64_t seed = 0);

// Empty when the case can be generated, else a sentence naming the first problem
// (includes validate(problem)). Under ValueDomain::kFinite a NaN / Inf special value, or a NaN / Inf
// explicit value at an addressed element, is a problem.
std::string validate(const Case& c);

// One line, e.g. "B=1 Hq=2 Hkv=1 Sq=7 Sk=13 D=59 Dv=59 mask=causal-br scale=0.130188912 f32
// values=uniform:1 special=nan@k:masked seed=0x000000000000002a" (+ " explicit" when values are given,
// + " domain=finite" under the finite value domain, + " pass=bwd" / " pass=fwdbwd" for backward cases).
std::string describe(const Case& c);

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
  std::vector<float> dout;            // backward cases: dO, o_elements(problem) floats with o strides; else empty
};

// Bit pattern written into stride gaps (elements no index of the problem addresses): a quiet NaN
// with a recognisable payload, so a kernel that ignores the strides produces NaN instead of luck.
constexpr uint32_t kStrideGapBits = 0x7fe5a5a5u;

// Deterministic values for the case. Order: base values of q, k, v in logical (b, s, h, d) order, each
// tensor from its own stream (seed, 1 / 2 / 3); then specials from stream (seed, 4); for a backward case
// dO uniform in [-1, 1] from stream (seed, 5) (so q, k, v keep the bits of the forward case). Explicit
// values, when present, are returned as they are (placed is then empty; dO generated when not given). Under ValueDomain::kFinite a base value
// that rounds to +-Inf in fp32 (e.g. normal with a huge sigma) is clamped to +-FLT_MAX. Throws
// std::invalid_argument when validate(c) is not empty.
Tensors generate(const Case& c);

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
const std::vector<SpecialKind>& special_kinds();
// The kinds allowed under d (for kFinite: subnormal, huge, -0), in special_kinds() order.
const std::vector<SpecialKind>& special_kinds(ValueDomain d);

}  // namespace space

// The built-in edge-shape grid of attn-check --sweep (issue 4): 1x1, 7x13, 13x7, tails around
// 16/32/64/128, Sq != Sk both ways, odd D, Dv != D, GQA/MQA, batch, masks (both alignments, windows,
// fully masked rows, Sk = 0), extreme magnitudes and special values. About 100 cases, each with a
// label; each seed is derived from base_seed and the label, so adding a case never changes another.
// Under ValueDomain::kFinite every case has that domain and each NaN / Inf special-value case is
// replaced by the same case with huge (+-FLT_MAX) values at the same tensor and placement.
// With a backward pass every case gets that pass (same labels and seeds: q, k, v are the forward grid's).
std::vector<Case> sweep_grid(uint64_t base_seed = 0, ValueDomain domain = ValueDomain::kIeee,
                             Pass pass = Pass::kFwd);

// 64-bit FNV-1a of text, finished with a splitmix64 round (stable across builds and platforms).
uint64_t hash64(const std::string& text);

}  // namespace attnfuzz
