// poison.cpp - the oob-read detector: a rerun shows the kernel deterministic under one poison, then a
// relaunch with the guard zones' poison swapped (NaN <-> finite); changed output = a read outside the
// buffers.
#include "check/detectors/detectors.h"
#include "check/sequences.h"

namespace attnfuzz::detect {

namespace {

// Which of the case's variant and sequence arrays the kernel reads past: each swapped alone
// (RunOptions::swap_guard_of) until the output changes. "" when none does (the read is outside q, k, v, o,
// lse or the workspace) or none exists.
std::string guarded_input_read(Context& c) {
  const Tensors& t = c.tensors();
  const std::pair<const char*, bool> inputs[] = {
      {"custom_mask", !t.custom_mask.empty()},
      {"block_mask", !t.block_mask.empty()},
      {"bias", !t.bias.empty()},
      {"sinks", !t.sinks.empty()},
      {"alibi_slopes", !t.alibi_slopes.empty()},
      {"q_descale_h", !t.q_descale_h.empty()},
      {"k_descale_h", !t.k_descale_h.empty()},
      {"v_descale_h", !t.v_descale_h.empty()},
      {"cu_seqlens_q", !t.cu_seqlens_q.empty()},
      {"cu_seqlens_k", !t.cu_seqlens_k.empty()},
      {"seqused_k", !t.seqused_k.empty()},
      {"block_table", !t.block_table.empty()},
  };
  for (const auto& [name, present] : inputs) {
    if (!present) continue;
    RunOptions o = c.opts;
    o.swap_guard_of = name;
    const LaunchOutcome one = c.launch(t, o);
    if (one.launch.status != LaunchStatus::kOk) continue;
    const BitDiff d = launch_diff(c, c.original(), one);
    if (d.count != 0)
      return fmt("the read is past %s: with only its guards' poison swapped, %lld output element(s) change; "
                 "first ",
                 name, (long long)d.count) +
             d.first();
  }
  return {};
}

}  // namespace

Finding poison_swap(Context& c) {
  Finding f;
  if (c.original().o.empty()) return f;
  // First: is the kernel deterministic under one poison? A rerun with unchanged settings must give the
  // same bits; otherwise a difference under the other poison proves nothing (a barrier race, or state left
  // over from an earlier launch) and the schedule detectors decide.
  // (Skipped when the reruns detector already showed it.)
  const LaunchOutcome again = c.deterministic ? c.original() : c.launch(c.tensors());
  if (again.launch.status != LaunchStatus::kOk) {
    f.evidence.push_back({"poison-swap", std::string("the rerun under the same poison ended with ") +
                                             launch_status_name(again.launch.status) + ": " +
                                             again.launch.message});
    return f;
  }
  const BitDiff same = launch_diff(c, c.original(), again);
  if (same.count != 0) {
    f.evidence.push_back(
        {"poison-swap",
         fmt("not run: a rerun under the same guard poison already differs from the checked launch "
             "(%lld element(s), first ",
             (long long)same.count) +
             same.first() +
             "): the kernel is not deterministic, so a change under the other poison would not "
             "show a read of the guard zones; the schedule detectors decide"});
    f.unreliable_baseline = true;
    return f;
  }
  RunOptions o = c.opts;
  o.guard_poison = c.opts.guard_poison == kGuardPoisonAlt ? kGuardPoison : kGuardPoisonAlt;
  const LaunchOutcome swapped = c.launch(c.tensors(), o);
  if (swapped.launch.status != LaunchStatus::kOk) {
    f.evidence.push_back({"poison-swap", std::string("the relaunch with the other guard poison ended with ") +
                                             launch_status_name(swapped.launch.status) + ": " +
                                             swapped.launch.message});
    return f;
  }
  const BitDiff d = launch_diff(c, c.original(), swapped);
  const std::string what = fmt("guard poison 0x%08x -> 0x%08x (%s -> %s)", c.opts.guard_poison,
                               o.guard_poison, c.opts.guard_poison == kGuardPoison ? "NaN" : "1.23",
                               o.guard_poison == kGuardPoison ? "NaN" : "1.23");
  if (d.count != 0) {
    f.fired = true;
    f.cls = FailureClass::kOobRead;
    f.evidence.push_back(
        {"poison-swap", fmt("deterministic under one poison (a rerun is bit-identical), but %lld output "
                            "element(s) change when only the ",
                            (long long)d.count) +
                            what +
                            " around q, k, v, o, lse, the workspace and the variant / sequence arrays "
                            "changes: the kernel "
                            "reads outside its buffers; first " +
                            d.first()});
    if (const std::string which = guarded_input_read(c); !which.empty())
      f.evidence.push_back({"poison-swap", which});
    if (has_sequences(c.pc.problem()))  // the poison also fills every gap between and after sequences
      f.evidence.push_back({"poison-swap", "the gaps outside every sequence hold the same poison; O[b=" +
                                               std::to_string(d.b) + "] is " +
                                               sequence_text(c.pc.problem(), c.tensors(), d.b)});
  } else {
    f.evidence.push_back(
        {"poison-swap", "output bit-identical under " + what + ": no read of the guard zones"});
  }
  return f;
}

}  // namespace attnfuzz::detect
