// classify.cpp - runs the detectors in precedence order after a failed check and settles the failure class.
#include "check/classify.h"

#include <chrono>
#include <filesystem>

#include "check/detectors/detectors.h"

namespace attnfuzz {

const std::vector<FailureClass>& class_precedence() {
  // One line per class (check/README.md "Precedence" says why this order).
  static const std::vector<FailureClass> order = {
      FailureClass::kOobWrite,     //
      FailureClass::kUnwritten,    //
      FailureClass::kOobRead,      //
      FailureClass::kBarrierRace,  //
      FailureClass::kDropout,      // a direct experiment (dropout's scale, or dropout switched off) on the same inputs
      FailureClass::kIgnoredParameter,  // a direct experiment (the variant switched off) whose match is exact
      FailureClass::kMask,         //
      FailureClass::kEmptyRow,     //
      FailureClass::kMerge,        // merge cases (issue 29): a relaunch with the states' layout or LSE level changed
      FailureClass::kSplitKv,      // split / padding experiments (check/README.md): before lse, since a tail
      FailureClass::kTail,         // or combine bug can leave O right and LSE wrong; the experiment proves cause
      FailureClass::kLse,          //
      FailureClass::kRescale,      //
      FailureClass::kNonFinite,    //
      FailureClass::kPrecision,    //
      FailureClass::kWrong,        //
  };
  return order;
}

namespace {
int rank(FailureClass c) {
  const auto& o = class_precedence();
  for (size_t i = 0; i < o.size(); ++i)
    if (o[i] == c) return static_cast<int>(i);
  return static_cast<int>(o.size());
}
}  // namespace

ClassifyStats classify_failure(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& given,
                               Judged& j, const ClassifyOptions& co) {
  const RunOptions opts = for_kernel(given, k.kernel, pc.problem());  // experiments judge under k's compute model
  ClassifyStats stats;
  CheckResult& r = j.result;
  if (!co.enabled || r.verdict != Verdict::kFail) return stats;
  if (r.failure != FailureClass::kNonFinite && r.failure != FailureClass::kPrecision) return stats;
  if (!dev.usable() || j.outcome.o.empty()) return stats;
  stats.ran = true;
  const auto t0 = std::chrono::steady_clock::now();
  detect::Context c{dev, k, pc, opts, j, co, stats, {}};
  bool decided = false;
  FailureClass cls = r.failure;
  stats.decided_by = "check";
  r.decided_by = "check";
  // Runs one detector; a firing detector decides the class unless one of higher precedence already did.
  auto run = [&](const char* name, detect::Finding (*fn)(detect::Context&)) -> detect::Finding {
    detect::Finding f;
    try {
      f = fn(c);
    } catch (const std::exception& e) {
      r.evidence.push_back({name, std::string("could not run: ") + e.what()});
      return f;
    }
    r.evidence.insert(r.evidence.end(), f.evidence.begin(), f.evidence.end());
    if (f.fired && (!decided || rank(f.cls) < rank(cls))) {
      cls = f.cls;
      decided = true;
      stats.decided_by = name;
      r.decided_by = f.kind.empty() ? std::string(name) : std::string(name) + "/" + f.kind;
    }
    return f;
  };
  const bool cpu = dev.backend() == Backend::kCpu;
  const DeviceCapabilities caps = dev.capabilities();
  if (!caps.memory_guards || !caps.thread_schedule)  // an adapter: say which detectors cannot apply
    r.evidence.push_back({"scope", std::string("external implementation: the tool controls the inputs, not the "
                                               "device memory or the schedule; not applicable: ") +
                                       (caps.memory_guards ? "" : "guard canaries, unwritten-output poison, poison swap") +
                                       (!caps.memory_guards && !caps.thread_schedule ? ", " : "") +
                                       (caps.thread_schedule ? "" : "thread orders, TSan, compute-sanitizer")});
  bool unreliable = false;
  const bool dropout = (pc.problem().variants & AF_VARIANT_DROPOUT) != 0;   // issue 29
  const bool score_vars = (pc.problem().variants & ~AF_VARIANT_DROPOUT) != 0;  // issue 28
  if (is_merge(pc.problem())) {  // merged states (issue 29): the detectors that apply to a merge of given states
    r.evidence.push_back({"scope", "merge case: mask, empty-row, split-kv, tail, keys, reorder and mask-model build "
                                   "attention experiments and do not run; the merge detector replaces them"});
    run("rows", detect::row_kinds);
    if (co.unwritten) run("unwritten", detect::unwritten);
    if (co.schedule) unreliable = run("reruns", detect::reruns).unreliable_baseline;
    if (!decided && co.poison && caps.memory_guards && !unreliable)
      unreliable = run("poison-swap", detect::poison_swap).unreliable_baseline;
    if (!decided && co.schedule && cpu) run("schedule", detect::schedule);
    if (co.compute_sanitizer && dev.backend() == Backend::kNvidia) run("compute-sanitizer", detect::compute_sanitizer);
    if (!decided && !unreliable) run("merge", detect::merge);
    if (!decided && co.lse) run("lse", detect::lse);
  } else if (c.gradient_failure()) {  // a backward failure in dQ / dK / dV: the detectors that apply to gradients
    r.evidence.push_back({"scope", "backward failure in " + r.tensor +
                                       ": detectors for gradients (split-kv, tail, lse, keys, rescale, mask-model are "
                                       "forward signatures and do not run)"});
    if (co.unwritten) run("unwritten", detect::unwritten);
    if (co.schedule) unreliable = run("reruns", detect::reruns).unreliable_baseline;
    if (!decided && co.poison && caps.memory_guards && !unreliable)
      unreliable = run("poison-swap", detect::poison_swap).unreliable_baseline;
    if (!decided && co.schedule && cpu) run("schedule", detect::schedule);
    if (co.tsan && cpu && (!decided || cls == FailureClass::kBarrierRace)) run("tsan", detect::tsan);
    if (co.compute_sanitizer && dev.backend() == Backend::kNvidia) run("compute-sanitizer", detect::compute_sanitizer);
    if (!decided && dropout && !unreliable) run("dropout", detect::dropout);
    if (!decided && score_vars && !unreliable) run("ignored-parameter", detect::ignored_parameter);
    if (!decided && co.empty_row && !(pc.problem().variants & ~kMaskVariants))
      run("empty-row", detect::empty_row);
    if (!decided && co.mask && !unreliable) run("mask", detect::mask);
  } else {
  // Detectors in run order, one line each; the first that fires decides unless a later one ranks higher.
  run("rows", detect::row_kinds);  // evidence only: every kind of wrong row with counts
  if (co.unwritten) run("unwritten", detect::unwritten);
  if (co.schedule) unreliable = run("reruns", detect::reruns).unreliable_baseline;
  // Sequence layouts (varlen / paged): a read across a sequence boundary (before the poison swap, which would
  // only see the part past the last sequence). mask, empty-row, reorder and mask-model work per sequence
  // (detectors.h: row_problem, layout_oracle); split-kv only varies the split count; tail is not run (below).
  const bool seqs = has_sequences(pc.problem());
  if (!decided && seqs && co.poison && !unreliable)
    unreliable = run("sequences", detect::sequence_isolation).unreliable_baseline;
  if (!decided && co.poison && caps.memory_guards && !unreliable)
    unreliable = run("poison-swap", detect::poison_swap).unreliable_baseline;
  if (seqs)
    r.evidence.push_back({"scope", "sequence layout " + layout_name(pc.problem()) +
                                       ": mask, empty-row, reorder and mask-model run per sequence; tail is not "
                                       "run: its paddings (Sq, Sk, D to tile multiples) are built for a dense "
                                       "batch; padding one sequence of a layout (new cu_seqlens, block table "
                                       "and packed buffers) is not implemented"});
  if (!decided && co.schedule && cpu) run("schedule", detect::schedule);
  if (co.tsan && cpu && (!decided || cls == FailureClass::kBarrierRace)) run("tsan", detect::tsan);
  if (co.compute_sanitizer && dev.backend() == Backend::kNvidia)
    run("compute-sanitizer", detect::compute_sanitizer);
  // Score variants (issue 28): the ignored-parameter experiment; the experiments that rebuild the problem or
  // move keys (empty-row, tail, reorder, mask-model) do not keep a bias / ALiBi / sink case's exact result
  // and are left out (kv-shared too: a tail padding of Dv would pad V with K's rope columns, not zeros). The
  // custom masks alone keep them: empty-row, tail and reorder read visibility through the one rule
  // (Context::seen_keys; tail pads the masks in one dense form); mask-model's fit is of the mask_kind
  // interval and stays out.
  const bool vars = pc.problem().variants != 0;
  const bool masks_only = !(pc.problem().variants & ~kMaskVariants);  // no variant, or custom masks alone
  if (vars)
    r.evidence.push_back(
        {"scope",
         "variant(s) " + variant_names(pc.problem().variants) +
             (masks_only ? ": the mask-model experiment fits the mask_kind interval and is not run"
                         : ": the empty-row, tail, keys, reorder and mask-model experiments rebuild the problem "
                           "or move keys and are not run")});
  if (!decided && dropout && !unreliable) run("dropout", detect::dropout);
  if (!decided && score_vars && !unreliable) run("ignored-parameter", detect::ignored_parameter);
  if (!decided && co.mask && !unreliable) run("mask", detect::mask);
  if (masks_only && !decided && co.empty_row) run("empty-row", detect::empty_row);
  if (!decided && co.split_kv && !unreliable) run("split-kv", detect::split_kv);
  if (!seqs && masks_only && !decided && co.tail && !unreliable) run("tail", detect::tail);
  if (!decided && co.lse) run("lse", detect::lse);
  if (masks_only && !decided && co.mask && !unreliable) run("keys", detect::keys_ignored);
  if (masks_only && !decided && co.reorder && !unreliable) run("reorder", detect::reorder);
  if (!vars && !decided && co.mask && !unreliable) run("mask-model", detect::mask_model);
  if (!decided && !unreliable) run("scale", detect::scale);
  }
  if (r.failure == FailureClass::kNonFinite && !is_merge(pc.problem())) {  // evidence in every attention case
    const detect::Finding nf = run("non-finite", detect::nonfinite);
    if (nf.overflow_shown && cls == FailureClass::kMask) {  // a visible score overflows: not a mask finding
      cls = FailureClass::kNonFinite;
      stats.decided_by = "non-finite (a visible score is past exp's fp32 range; the mask finding stays as evidence)";
      r.decided_by = "non-finite/overflow";
    }
  }
  if (!decided) run("precision", detect::precision);
  if (!decided) run("wrong", detect::wrong);
  r.failure = cls;
  stats.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.evidence.push_back({"classify", std::string(failure_class_name(cls)) + " by " + stats.decided_by + " (" +
                                        std::to_string(stats.launches) + " extra launch(es), " +
                                        std::to_string(stats.oracles) + " extra oracle(s), " +
                                        detect::fmt("%.0f ms", stats.ms) + ")"});
  if (!c.case_file.empty() && co.work_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(std::filesystem::path(c.case_file).parent_path(), ec);
  }
  return stats;
}

}  // namespace attnfuzz
