// detectors.h - the detectors classify_failure() runs (internal to check/): shared context, helpers, one
// function per detector.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "check/classify.h"
#include "check/runner.h"

namespace attnfuzz::detect {

// What one classification run shares between detectors.
struct Context {
  Device& dev;
  const KernelEntry& k;
  PreparedCase& pc;
  const RunOptions& opts;
  Judged& j;
  const ClassifyOptions& co;
  ClassifyStats& stats;
  std::string case_file;  // written on first use by subprocess detectors
  bool deterministic = false;  // bitwise reruns already matched the checked launch (reruns detector)
  // Reruns of the same inputs differ only in the sign / payload of NaNs (the operand order of IEEE arithmetic, which
  // a correct multithreaded library such as BLAS varies): launch_diff then compares NaNs by value, not by bits.
  bool nan_payloads_vary = false;
  std::optional<Tensors> view_t;  // sequence layouts: q / k / v in the dense view (view_tensors())

  // The problem outputs are indexed by (the dense view for a sequence layout); launches use pc.problem().
  const Problem& problem() const { return pc.view(); }
  const Tensors& tensors() const { return pc.tensors(); }
  // The inputs indexed like problem(): tensors() when dense, the dense view's q / k / v for a sequence layout.
  const Tensors& view_tensors();
  const LaunchOutcome& original() const { return j.outcome; }
  // A guarded launch of the kernel on t (same problem), counted.
  LaunchOutcome launch(const Tensors& t, const RunOptions& o);
  LaunchOutcome launch(const Tensors& t) { return launch(t, opts); }
  // The pass of the case and whether the failure is in a gradient (dQ / dK / dV) rather than O / LSE.
  Pass pass() const { return pc.the_case().pass; }
  bool gradient_failure() const { return j.outcome.backward && !j.result.tensor.empty() && j.result.tensor[0] == 'd'; }
  // An oracle for another problem or inputs, counted; add_in_dtype: with bias + ALiBi rounded to the dtype before
  // they are added (OracleOptions::score_add_in_dtype) whatever the kernel declares.
  OracleResult oracle(const Problem& p, const Tensors& t, bool add_in_dtype = false);
  // The oracle options of those experiments: the kernel's, exact rows only (no baseline), add_in_dtype as above.
  OracleOptions experiment_options(bool add_in_dtype = false) const;

  // Sequence layouts (varlen, KV cache, paged), where problem() is the dense view and launches, tensors() and
  // the mask are per sequence. Each helper is the plain dense one for a dense case.
  bool seqs() const { return has_sequences(pc.problem()); }
  // The problem row s of sequence b belongs to: sequence b alone (sequence_problem, its mask aligned per
  // sequence) for a layout, problem() when dense. visible_keys(row_problem(b), s) are row (b, s)'s keys.
  Problem row_problem(int64_t b) const;
  // The exact result of the case's layout problem `lp` (pc.problem() with, e.g., another mask) on layout
  // inputs t, in the dense view: sequence_oracle for a layout, oracle() when dense. Counted.
  OracleResult layout_oracle(const Problem& lp, const Tensors& t, bool add_in_dtype = false);
  // The one visibility rule (core's key_visible: mask_kind and the custom / block masks, docs/semantics.md
  // "Custom masks") for row s of query head h of batch b, in the dense view (row_problem(b) for a layout):
  // every key the row sees, ascending. Without a custom mask these are visible_keys(row_problem(b), s).
  std::vector<int64_t> seen_keys(int64_t b, int64_t h, int64_t s) const;
  // "keys [3, 9) visible" or, with custom masks, "5 keys visible in [3, 9) (custom / block mask)"; "no
  // visible key".
  std::string seen_text(int64_t b, int64_t h, int64_t s) const;
  // Offsets of q row s of sequence b, and of key j of sequence b, in the layout tensors (q_offset, k_offset,
  // v_offset; q_index, k_index, v_index when dense).
  int64_t q_at(int64_t b, int64_t s, int64_t h, int64_t d) const;
  int64_t k_at(int64_t b, int64_t j, int64_t hk, int64_t d) const;
  int64_t v_at(int64_t b, int64_t j, int64_t hk, int64_t d) const;
};

// What a detector concluded.
struct Finding {
  bool fired = false;
  FailureClass cls = FailureClass::kNone;
  std::vector<Evidence> evidence;
  bool unreliable_baseline = false;  // reruns differ: bitwise experiments cannot be trusted
  bool overflow_shown = false;  // non-finite: every failing row shown has a visible score past exp's fp32 range
  std::string kind;  // which of the detector's tests fired, where it has several ("other-mask", "nan-leak", ...)
};

// ---- helpers (helpers.cpp) ----
// Whether exact value b (another problem's, bound bb) is visibly not a (the case's, bound ba): finite against
// NaN / Inf, or |a - b| beyond ba plus 1e-4 of the larger magnitude (launch_diff's gradient tolerance) plus
// margin (ba + bb).
bool apart(double a, double ba, double b, double bb = 0, double margin = 0);
// Where exact result y (another problem) is apart from x in that sense ("O[b=0,s=3,h=0,d=1]: 0.25 vs 0.5", or
// the row y takes out of the fp32 contract that x keeps), or "". margin 4: no output is within both results'
// bounds there.
std::string outputs_apart(const Problem& p, const OracleResult& x, const OracleResult& y, double margin = 0);
// p with the variants `bits` switched off, as the ignored-parameter probes use it (per-head descales: their
// strides 0, the per-tensor descales used).
Problem variant_off(const Problem& p, uint32_t bits);
std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string num(double v);  // %.6g, with nan / inf spelled out
std::string o_name(int64_t b, int64_t s, int64_t h, int64_t d);
// Bitwise difference of two launches' O and LSE over the problem's addressed elements.
struct BitDiff {
  int64_t count = 0;
  bool is_lse = false;
  std::string tensor;  // first differing gradient ("dQ", "dK", "dV"; s is then the key for dK / dV), or ""
  int64_t within_bound = 0;  // launch_diff, backward: gradient differences within the bound (not in count)
  int64_t b = 0, s = 0, h = 0, d = 0;  // first differing element
  float a = 0, x = 0;                  // its values in the first and second launch
  std::string first() const;           // "O[b=0,s=3,h=0,d=1]: 0.25 vs 0.31"
};
// Backward outcomes: also the addressed elements of dQ, dK and dV. nan_payloads false: two NaNs are the same
// whatever their sign and payload.
BitDiff bit_diff(const Problem& p, const LaunchOutcome& a, const LaunchOutcome& x, bool nan_payloads = true);
// What the schedule / rerun / poison-swap detectors compare. Forward: every bit (bit_diff; NaN payloads only
// while c.nan_payloads_vary is false). Backward: O / LSE
// bits, and gradient elements that differ by more than max(the gradient oracle's bound, 1e-4 of the larger
// magnitude) or as a NaN/Inf mismatch:
// a correct kernel accumulating dQ with atomics rounds differently from launch to launch, within the bound
// (within_bound counts those differences, which decide nothing).
BitDiff launch_diff(Context& c, const LaunchOutcome& a, const LaunchOutcome& x);
// The check verdict of another launch of the case's pass: forward (judge) or gradients (judge_gradients).
CheckResult judge_outcome(Context& c, const LaunchOutcome& out);
// Gradient failures: "dQ 12 of 64 (rows s = 0-3), dK ... (keys j = ...)" from the original launch.
std::string gradient_failure_text(Context& c);
// Max |err| / bound over one output row (O elements and LSE); NaN when the oracle did not compute it or
// it is outside the fp32 contract.
double row_ratio(const Problem& p, const OracleResult& ex, const LaunchOutcome& out, int64_t b, int64_t h,
                 int64_t s);
// Exact gradients laid out as the kernel writes dQ, dK, dV (q_index, k_index, v_index; 0 where not computed),
// to judge one exact result against another's bounds.
struct KernelGrads {
  std::vector<float> dq, dk, dv;
};
KernelGrads as_written(const Problem& p, const GradResult& g, const LaunchOutcome& like);
// A gradient model fit: the kernel's gradients within the model's bounds (got), and the case's exact gradients (as
// written) beyond them (sep), so that the inputs tell the model from the exact result. fits(): both.
struct GradFit {
  CheckResult got, sep;
  bool fits() const { return got.verdict == Verdict::kPass && sep.verdict == Verdict::kFail; }
};
GradFit fit_gradients(const Problem& p, const GradResult& model, const LaunchOutcome& out, const KernelGrads& exact);
// Adds query row (b, h, i)'s backward over keys [first, last) to g's dQ, dK, dV, in double: P = exp(scale q.k - lse),
// Delta = dO . o_row, dS = P (dP - Delta). For the detectors' gradient models (a forward or a row other than the
// asked one); no score variant.
void add_row_backward(const Problem& p, const Tensors& t, int64_t b, int64_t h, int64_t i, int64_t first,
                      int64_t last, double lse, const double* o_row, GradResult& g);
// Whole-output comparison verdict of out against ex (compare_output without keeping anything).
CheckResult judge(const Problem& p, const OracleResult& ex, const LaunchOutcome& out);
// "0-3, 7, 9-12" from ascending values.
std::string ranges(const std::vector<int64_t>& v, size_t max_items = 8);
// The (b, h, s) of the worst failing element, if any.
bool worst_row(const CheckResult& r, int64_t& b, int64_t& h, int64_t& s);
// Every (b, h, s) row with a failing element, from a fresh comparison of the original launch.
struct RowKey {
  int64_t b, h, s;
};
std::vector<RowKey> failing_rows(const Context& c, bool nonfinite_only = false);
// How the failing rows of the original launch match another exact result ex (the case's own is exact): rows within
// ex's bound (never by NaN = NaN), rows where ex is itself beyond the case's bound (its difference is visible there),
// the worst ratio against ex, and the rows' s (ascending, at most 64 gathered). all(): every row matches, visibly.
struct RowsMatch {
  int64_t match = 0, visible = 0;
  double worst = 0;
  std::vector<int64_t> where;
  bool all(size_t rows) const { return match == static_cast<int64_t>(rows) && visible == match; }
};
RowsMatch rows_match(const Problem& p, const OracleResult& exact, const OracleResult& ex, const LaunchOutcome& out,
                     const std::vector<RowKey>& rows);
// How one failing (b, h, s) row is wrong, from a fresh comparison of the original launch.
struct RowFailure {
  RowKey key;
  RowKind kind;              // the oracle's row kind (normal, fully masked / empty, NaN)
  bool o_bad = false;        // some O element beyond its bound
  bool o_nonfinite = false;  // some O element a NaN/Inf mismatch
  bool lse_bad = false;      // LSE beyond its bound
  bool lse_nonfinite = false;
  bool written_empty =
      false;  // the kernel wrote the empty-row result (O = 0 for every d, LSE = -inf or absent)
};
std::vector<RowFailure> row_failures(const Context& c);
// One line counting every kind of wrong row ("2 empty row(s) not O = 0 / LSE = -inf, 5 row(s) with keys
// and O beyond the bound, ...").
std::string row_kinds_text(const std::vector<RowFailure>& rows);
// Above this max err/bound a failure with no signature is `wrong`, at or below it `precision`
// (check/README.md: why 1000).
constexpr double kPrecisionLimit = 1000;
// Runs a shell command with a timeout; returns its exit status (124 on timeout) and stdout+stderr.
int run_command(const std::string& command, double timeout_s, std::string& output);
// The case written as a corpus file (once per context), for subprocess detectors.
std::string case_file(Context& c);

// ---- tail.cpp: the paddings the tail detector tries (exposed for tests) ----
// One padding of a case: D/Dv zero columns, query rows or invisible keys added so that every original row's
// exact O and LSE are unchanged (verified row by row). Original row s is padded row s + q_shift, key j is
// key j + k_shift; the scale is kept explicitly.
struct TailPadding {
  Problem p{};
  int64_t q_shift = 0, k_shift = 0;
  std::string axis;     // "D,Dv", "Sq" or "Sk"
  std::string what;     // "Sk 37 -> 48 (x16), mask window:inf,11-tl"
  std::string refused;  // non-empty: no usable padding to this size (why); p is then unset
};
// Every padding target of p (next multiple of 8/16/32/64/128, next power of two, per axis), each with the
// first exact padding that kernel k supports (k may be null: no support check). With a custom mask p must be
// in the dense mask form and t its inputs (visibility then checked key by key; t null: the mask_kind interval
// alone).
std::vector<TailPadding> tail_paddings(const Problem& p, const af_kernel* k, const Tensors* t = nullptr);
// The padded inputs: the original values at their new places, zeros elsewhere (a dense custom mask: 0,
// hidden).
Tensors tail_pad_tensors(const Problem& p, const Tensors& t, const TailPadding& x);
// A case's custom / block masks as one dense mask (mask-dense, contiguous strides, 1 where custom_visible) so
// that paddings can move its bytes; changed: the form differs from the case's own. Without custom masks: p
// and t as is.
struct DenseMaskForm {
  Problem p;
  Tensors t;
  bool changed = false;
};
DenseMaskForm dense_mask_form(const Problem& p, const Tensors& t);
// How an output that passes under another mask v matches it on the elements that fail under the asked mask:
// with values (real) or only as NaN = NaN (nan_pairs, never counted as a match).
struct VariantMatch {
  int64_t real = 0, nan_pairs = 0;
};
VariantMatch variant_match(const Problem& p, const OracleResult& ex, const Problem& v,
                           const OracleResult& exv, const LaunchOutcome& out);

// ---- detectors, in precedence order ----
Finding reruns(Context& c);             // reruns.cpp: bitwise reruns with the same settings
Finding poison_swap(Context& c);        // poison.cpp: oob-read
Finding sequence_isolation(Context& c); // sequences.cpp: oob-read across a varlen / paged sequence boundary
Finding schedule(Context& c);           // schedule.cpp: cpu thread orders -> barrier-race
Finding tsan(Context& c);               // sanitizers.cpp: ThreadSanitizer build of attn-check
Finding compute_sanitizer(Context& c);  // sanitizers.cpp: racecheck / synccheck / memcheck (nvidia only)
// The three compute-sanitizer tools on the case, on whatever backend c.dev is (tests run it on the cpu with
// a stand-in binary that prints canned reports).
Finding compute_sanitizer_tools(Context& c);
Finding unwritten(Context& c);          // unwritten.cpp: output elements that keep two different poisons
Finding dropout(Context& c);            // dropout.cpp: the scale 1 / p; the case relaunched without dropout
Finding ignored_parameter(Context& c);  // ignored_param.cpp: the exact result with a variant switched off / replaced
Finding mask(Context& c);               // mask.cpp: rows written empty, masked NaN, other masks, perturbation
Finding empty_row(Context& c);          // empty_row.cpp: rows with no key of positive weight not O = 0
Finding lse(Context& c);                // lse.cpp: O within bound, LSE beyond: the relation found
Finding split_kv(Context& c);           // splitkv.cpp: the declared KV split count varied
Finding tail(Context& c);               // tail.cpp: padding that keeps the exact result
Finding keys_ignored(Context& c);       // keys.cpp: a row equals attention over its first keys only -> mask
Finding reorder(Context& c);            // reorder.cpp: rescale
Finding mask_model(Context& c);         // mask.cpp: rows equal to softmax with extra zero-score keys
Finding scale(Context& c);              // scale.cpp: the exact result under another score scale
Finding nonfinite(Context& c);          // nonfinite.cpp: positions and their inputs
Finding precision(Context& c);          // nonfinite.cpp: error / bound <= kPrecisionLimit, tile grid
Finding wrong(Context& c);              // nonfinite.cpp: error / bound > kPrecisionLimit, no signature
Finding merge(Context& c);              // merge.cpp: merge cases: all-empty rows, state layout, LSE level
Finding row_kinds(Context& c);          // empty_row.cpp: every kind of wrong row with counts (never fires)

}  // namespace attnfuzz::detect
