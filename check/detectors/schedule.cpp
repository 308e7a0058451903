// schedule.cpp - the cpu barrier-race detector: the same launch in other thread orders; different bits = a
// race.
#include "check/detectors/detectors.h"

namespace attnfuzz::detect {

namespace {
std::string order_text(ThreadOrder o, uint64_t seed) {
  std::string s = thread_order_name(o);
  if (o == ThreadOrder::kShuffle) s += "/" + std::to_string(seed);
  return s;
}
}  // namespace

Finding schedule(Context& c) {
  Finding f;
  if (c.dev.backend() != Backend::kCpu || c.original().o.empty()) return f;
  const DeviceOptions base = c.dev.options();
  std::vector<std::pair<ThreadOrder, uint64_t>> orders = {{ThreadOrder::kForward, 1},
                                                          {ThreadOrder::kReverse, 1}};
  for (uint64_t s : c.co.shuffle_seeds) orders.push_back({ThreadOrder::kShuffle, s});
  const std::string checked = order_text(base.order, base.order_seed);
  const OracleResult& ex = c.pc.oracle(c.opts.oracle);
  std::string table = checked + " (checked) " + (c.j.result.verdict == Verdict::kFail ? "FAIL" : "pass");
  int differ = 0;
  BitDiff first;
  std::string first_order;
  for (const auto& [order, seed] : orders) {
    if (order == base.order && (order != ThreadOrder::kShuffle || seed == base.order_seed)) continue;
    DeviceOptions o = base;
    o.order = order;
    o.order_seed = seed;
    c.dev.set_options(o);
    LaunchOutcome out;
    try {
      out = c.launch(c.tensors());
    } catch (...) {
      c.dev.set_options(base);
      throw;
    }
    c.dev.set_options(base);
    const std::string name = order_text(order, seed);
    if (out.launch.status != LaunchStatus::kOk) {
      table += ", " + name + " " + launch_status_name(out.launch.status);
      ++differ;
      continue;
    }
    const BitDiff d = launch_diff(c, c.original(), out);
    const CheckResult r = out.backward ? judge_outcome(c, out) : judge(c.problem(), ex, out);
    table += ", " + name + " " + (r.verdict == Verdict::kFail ? "FAIL" : "pass") +
             (d.count ? fmt(" (%lld bits differ)", (long long)d.count)
              : d.within_bound
                  ? fmt(" (%lld gradient element(s) differ within the bound: accumulation order)", (long long)d.within_bound)
                  : " (identical)");
    if (d.count) {
      if (!differ) first = d, first_order = name;
      ++differ;
    }
  }
  if (differ) {
    f.fired = true;
    f.cls = FailureClass::kBarrierRace;
    f.evidence.push_back({"schedule", "the result depends on the thread order within a block: " + table +
                                          "; first difference (" + checked + " vs " + first_order + ") " +
                                          first.first()});
  } else {
    f.evidence.push_back({"schedule", "every thread order gives the same bits: " + table});
  }
  return f;
}

}  // namespace attnfuzz::detect
