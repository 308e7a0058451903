// runner.h - runs one kernel on one case on a device and judges it: guarded buffers, launch, canaries,
// oracle, compare.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "attnfuzz/verdict.h"
#include "check/compare.h"
#include "check/guarded.h"
#include "oracle/grad.h"
#include "oracle/oracle.h"

namespace attnfuzz {

// A second, finite output poison (-1677.18f): the unwritten detector relaunches with it (an element that
// keeps kOutputPoison and then this one was never written).
constexpr uint32_t kOutputPoisonAlt = 0xc4d1a5e7u;
class BufferPool;

struct RunOptions {
  size_t guard_bytes = 64 * 1024;  // each side of every buffer: a tail tile reading past the end lands here
  uint32_t guard_poison = kGuardPoison;
  // Non-empty: the guards of the input buffer of this name ("custom_mask", "bias", ...: the variant and
  // sequence arrays) hold the other guard poison (kGuardPoison <-> kGuardPoisonAlt): the poison swap's test
  // of one buffer.
  std::string swap_guard_of;
  uint32_t output_poison = kOutputPoison;  // written into O / LSE / workspace before the launch
  size_t worst = 8;                   // worst elements kept in the result
  OracleOptions oracle;
  // Reuse guarded buffers between launches on the pool's device (none: allocate and free per launch).
  std::shared_ptr<BufferPool> pool;
};

// Guarded buffers kept between launches on one device (issue 17). A campaign checks thousands of cases, and
// successive inputs (mutations of one corpus entry) often have similar buffer sizes: reuse saves the
// allocation (an mmap on the cpu backend, hipMalloc / hipFree on GPUs), its page faults and the guard fill. A
// buffer goes back to the pool only when its launch ended normally and every guard word still held the
// poison, and a reused buffer is indistinguishable from a fresh one but for a longer after-guard: it is taken
// for a payload whose allocation (payload and guards, in whole pages) fits it with at most min(that allocation,
// 1 MiB) to spare, its after-guard is moved to the new payload end and takes the spare bytes
// (GuardedBuffer::relayout), its guards hold the same poison (refilled if another poison is asked for), and every
// payload byte is uploaded or filled before each launch. Its guards are checked again when
// it is taken if any launch ran since it was kept (a stray write of that launch is never blamed on a later
// one), or if any launch ever ended abnormally. The pool must be destroyed before its device (it frees its
// buffers there).
class BufferPool {
 public:
  explicit BufferPool(Device& dev, size_t max_buffers = 32) : dev_(dev), max_(max_buffers) {}
  Device& device() const { return dev_; }
  // A buffer of this name, guard and allocation size, laid out for `bytes`: a kept one whose guards are still
  // intact (repoisoned when `poison` differs), or a new one.
  std::unique_ptr<GuardedBuffer> take(const std::string& name, size_t bytes, size_t guard, uint32_t poison);
  // Keeps b for a later take() (the oldest kept buffer is freed beyond max_buffers).
  void give(std::unique_ptr<GuardedBuffer> b, size_t guard, uint32_t poison);
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

 private:
  struct Kept {
    size_t guard;
    uint32_t poison;
    std::unique_ptr<GuardedBuffer> buf;
    uint64_t launches;  // guarded_launches() when it was kept (its guards were checked clean then)
  };
  Device& dev_;
  size_t max_;
  std::mutex mu_;           // take / give from several threads are safe (workers use one thread)
  std::vector<Kept> kept_;  // oldest first
  int64_t hits_ = 0, misses_ = 0;
};

// Launches through launch_guarded / launch_guarded_bwd in this process so far, and whether one of them ended
// other than normally (a crash, hang or launch error may leave a thread or child writing on): the pool's
// evidence that nothing wrote since a kept buffer's guards were last checked.
uint64_t guarded_launches();
bool guarded_launch_ended_abnormally();
// Wall seconds this thread spent in Device::launch through those (submission, the kernel and the wait for it):
// the campaign's "launch" phase.
double guarded_launch_seconds();

// A case with its values and (computed on first use) its exact result: shared by every kernel checked on it.
class PreparedCase {
 public:
  // oracle_threads: the threads of the oracles computed here, a merge case's states (make_states); 0 = hardware
  // concurrency. A campaign's worker passes its RunOptions' oracle threads (1).
  explicit PreparedCase(Case c, unsigned oracle_threads = 0);
  const Case& the_case() const { return case_; }
  const Problem& problem() const { return case_.problem; }
  // Where outputs, the oracle and reports index the case: problem() itself when dense, its dense_view() for a
  // sequence layout (varlen / KV cache / paged: LaunchOutcome o / lse are then in the view too).
  const Problem& view() const { return view_; }
  const Tensors& tensors() const { return tensors_; }
  // Dropout (issue 29): the case's reference keep mask (reference_keep_mask: the FlashAttention Philox draw) and
  // the variant values with it; empty / no mask without dropout.
  const std::vector<uint8_t>& keep_mask() const { return keep_; }
  VariantInputs variant_inputs() const {
    VariantInputs v = tensors_.variant_inputs();
    if (!keep_.empty()) v.dropout_keep = keep_.data();
    return v;
  }
  // The exact result (computed once), without the plain reference's rows (base_o / base_lse) whatever o.baseline
  // says: those feed only a failing check's "fp32 baseline ratio", and oracle_with_baseline() adds them then.
  const OracleResult& oracle(const OracleOptions& o);
  // oracle() with base_o / base_lse when o.baseline (computed on first use: an oracle of the case with them, whose
  // exact rows are the same).
  const OracleResult& oracle_with_baseline(const OracleOptions& o);
  // Backward cases. The o / lse a backward launch judged alone is given: the exact forward of every row
  // rounded to the dtype, with the problem's o / lse strides (a fully masked row: O = 0, LSE = -inf).
  const std::vector<float>& given_o(const OracleOptions& o);
  const std::vector<float>& given_lse(const OracleOptions& o);
  // The gradient oracle for the given o / lse (computed once).
  const GradResult& grad(const OracleOptions& o);
  // The exact forward of every row (oracle() when it is unsampled), which the gradient oracle reuses.
  const OracleResult& full_forward(const OracleOptions& o);
  // Merge cases (problem().n_states > 0): oracle() is the exact merge of the given states (check/merge.h); this is
  // the whole problem's exact result with the bound composed of the merge bound and the states' rounding
  // (docs/semantics.md "Merged states"), or nullptr where that comparison is not meaningful (a shifted or
  // dropped state).
  const OracleResult* merge_whole(const OracleOptions& o);

 private:
  void make_given(const OracleOptions& o);
  void use_model(const OracleOptions& o);  // drops the oracles cached for another compute model (or score terms)
  Case case_;
  Tensors tensors_;
  Problem view_;
  std::vector<uint8_t> keep_;
  std::optional<OracleResult> oracle_;
  std::optional<OracleResult> full_;  // the unsampled forward when oracle() is sampled
  std::optional<std::vector<float>> given_o_, given_lse_;
  std::optional<GradResult> grad_;
  std::optional<OracleResult> whole_;  // merge cases: merge_whole()
  int32_t model_ = -1;  // the compute model of the cached oracles, x 2 + score_add_in_dtype
};

// The gradient oracle's options for a run: the forward analysis of o, query / key budgets = its row budget.
GradOptions grad_options(const OracleOptions& o);
// The forward a backward launch is given from exact result ex of p: O rounded to p's dtype (f16 / bf16), LSE in fp32,
// in p's layouts (o_index, lse_index).
void given_forward(const Problem& p, const OracleResult& ex, std::vector<float>& o, std::vector<float>& lse);

// The raw outcome of one launch on guarded buffers.
struct LaunchOutcome {
  LaunchResult launch;
  std::vector<float> o, lse;          // downloaded outputs (lse empty if the kernel does not write it)
  std::vector<CanaryHit> canaries;    // changed guard words (first few per buffer)
  size_t canary_words = 0;            // total changed guard words
  int64_t unwritten = 0;              // output elements still holding the pre-launch poison (output_poison)
  // A crashing launch that faulted in the guard pages around a buffer (cpu backend): which buffer, the byte
  // offset from its payload's start (negative = before it), and in words.
  std::string fault_buffer;
  int64_t fault_offset = 0;
  std::string fault_where;  // "16777216 bytes past the end of buffer o"
  // Sequence layouts: o / lse above are in the dense view (rows past a sequence hold the output poison);
  // seq_gap_write names the first output element outside every sequence that the launch wrote (a canary).
  std::string seq_gap_write;
  // Backward launches (the case's pass has one): the gradients downloaded (q / k / v strides), and the o /
  // lse the backward launch was given (fwd+bwd: the kernel's own forward, also in o / lse above).
  std::vector<float> dq, dk, dv;
  std::vector<float> dsinks, dbias;  // score variants' gradients (empty where the problem has none)
  bool backward = false;  // launch / canaries / unwritten are the backward launch's
  // Dropout with an exported mask (AF_DROPOUT_RNG_EXPORTED): the keep mask each launch wrote, contiguous [B, Hq, Sq,
  // Sk] over the visible weights (gather_keep_mask); keep_bad counts visible bytes other than 0 / 1 (an unwritten
  // byte keeps the poison 0xa5). Empty for the declared generators (the case's reference mask applies).
  std::vector<uint8_t> keep, keep_bwd;
  int64_t keep_bad = 0;
  std::string keep_bad_first;
};

// Allocates guarded q/k/v/o/lse/workspace (and the sequence arrays), uploads the inputs (elements outside
// every sequence rewritten with the guard poison), poisons the outputs, launches, checks canaries.
LaunchOutcome launch_guarded(Device& dev, const KernelEntry& k, const Problem& p, const Tensors& t,
                             const RunOptions& opts);

// ABI v3 AF_KERNEL_LSE_PACKED: a packed-q kernel that declares it gets lse as [Hq, total_q] (FlashAttention's
// varlen convention: use_packed_lse sets p's lse_layout and strides); unpack_lse puts such an lse into p's
// [B, Hq, max Sq] layout, rows past a sequence holding `fill` (as an unwritten dense lse would).
bool packed_lse(const af_kernel& k, const Problem& p);
void use_packed_lse(Problem& p);
std::vector<float> unpack_lse(const Problem& p, const Tensors& t, const std::vector<float>& packed, uint32_t fill);

// The backward launch (k.kernel.launch_bwd) on guarded buffers: q, k, v, o, lse, dout (t.dout) uploaded as
// inputs, dq / dk / dv and the workspace (bwd_workspace_bytes) poisoned; the gradient strides are the
// tensors' own (dO like o, dQ like q, dK / dV like k / v). unwritten counts addressed gradient elements
// still holding the output poison. Crashes are attributed to the nearest buffer like launch_guarded.
LaunchOutcome launch_guarded_bwd(Device& dev, const KernelEntry& k, const Problem& p, const Tensors& t,
                                 const std::vector<float>& o, const std::vector<float>& lse,
                                 const RunOptions& opts);

// The launch a case's pass asks for, on pc's problem and inputs t: forward (launch_guarded); backward
// alone (launch_guarded_bwd given pc's given_o / given_lse); fwd+bwd (the forward, then the backward given
// its own o / lse: the result has both, launch / canaries / unwritten of the first launch that went wrong).
LaunchOutcome launch_for_pass(Device& dev, const KernelEntry& k, PreparedCase& pc, const Tensors& t,
                              const RunOptions& opts);

// What check_case produces: the verdict and, for the heatmap, |err|/bound over (query row x Dv).
struct Judged {
  CheckResult result;
  std::vector<double> ratio_map;  // Sq x Dv (s * Dv + d), max over batch and heads; NaN = not compared
  LaunchOutcome outcome;
  std::vector<GradMap> grad_maps;  // backward cases: dQ, dK, dV heatmaps (empty for forward)
};

// Why kernel k cannot run case c's pass ("" = it can): no launch_bwd for a backward case; fwd+bwd also needs
// the kernel's forward LSE.
// Backward in f16 / bf16 needs AF_SUPPORTS_BWD(dtype) in k.dtypes.
std::string pass_unsupported_reason(const af_kernel& k, Pass pass, int32_t dtype = AF_DTYPE_F32);
// Everything that makes kernel k refuse case (p, pass), "" = it claims it: unsupported_reason with p.pass set to
// the launch the case starts with (check_support sees it, ABI v3), pass_unsupported_reason, and for fwd+bwd the
// kernel's own check once more for the backward launch.
std::string case_unsupported_reason(const af_kernel& k, const Problem& p, Pass pass);

// Judges a backward outcome's gradients against the gradient oracle for the o / lse it was given (pc's
// cached oracle when pass is bwd; computed for the kernel's own forward in fwd+bwd). Fills r (verdict,
// reason, worst, tensor, evidence) and returns the heatmaps.
std::vector<GradMap> judge_gradients(PreparedCase& pc, const LaunchOutcome& out, const RunOptions& opts,
                                     CheckResult& r);
// The gradient oracle a backward outcome is judged against (what judge_gradients compares with): pc.grad()
// when the pass is bwd (the kernel was given pc's o / lse); fwd+bwd: the gradients and bounds for the o / lse
// the kernel's own forward wrote (out.o, out.lse).
GradResult grad_oracle_for(PreparedCase& pc, const LaunchOutcome& out, const RunOptions& opts);
// Folds a gradient comparison cmp into r, whose own findings (launch, canaries, O / LSE) come first: counts
// and evidence add up, and a gradient failure names the class only when r has not failed yet.
void merge_gradient_judgement(CheckResult& r, CheckResult& cmp);

// opts with the oracle's compute model set to the one kernel k declares (f16 / bf16 problems): every check and
// every experiment of a classification judges k under its own model.
RunOptions for_kernel(const RunOptions& opts, const af_kernel& k, const Problem& p);

// The whole check of one kernel on one case: support, launch, canaries, oracle, comparison, verdict (under
// for_kernel(opts, k, pc.problem())).
Judged check_case(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& opts);

}  // namespace attnfuzz
