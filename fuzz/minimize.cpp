// minimize.cpp - the minimizer: shrinks failing corpus cases while kernel, class and evidence kind reproduce, on one
// reused device, within a time budget it keeps (attn-fuzz --minimize, the campaign's minimize phase, attn-check).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "check/repeat.h"
#include "fuzz/campaign.h"
#include "runtime/adapter/adapter.h"

namespace attnfuzz::fuzz {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Whether the worker pools k's shapes (declared by its adapter, --compile-aware on, or measured in the campaign).
bool pooled(const Worker& w, const KernelEntry& k) {
  for (size_t i = 0; i < w.kernels().size(); ++i)
    if (w.kernels()[i] == &k) return w.pool(i).mode() == CompileMode::kPooled;
  return false;
}

// "3 shape-changing steps (~2.1 s each) and 1 other step not tried"
std::string not_tried(int shape_steps, double each_s, int other_steps) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%d shape-changing step(s) (~%.1f s each) and %d other step(s) not tried",
                shape_steps, each_s, other_steps);
  return buf;
}

}  // namespace

Minimizer::Minimizer(WorkerConfig cfg) : cfg_(std::move(cfg)) {}
Minimizer::~Minimizer() = default;

double Minimizer::KernelCost::predict(bool new_shape) const {
  return std::max(new_shape ? fresh : repeat, 0.0);  // none of its kind yet: it runs, and is measured
}

int Minimizer::adapter_starts() const {
  const auto* ad = w_ ? dynamic_cast<const AdapterDevice*>(&w_->device()) : nullptr;
  return retired_starts_ + (ad ? ad->starts() : 0);
}

int Minimizer::process() const { return builds_ + adapter_starts(); }

Worker* Minimizer::worker(bool forked, std::string& err) {
  if (w_) {
    const Device& d = w_->device();
    // Only the cpu emulator forks launches (an adapter restarts its own process; a GPU context that faulted is gone).
    if (d.usable() && (d.backend() != Backend::kCpu || forked == w_forked_)) return w_.get();
    retired_starts_ = adapter_starts();
    w_.reset();
  }
  WorkerConfig c = cfg_;
  c.kernels = "all";  // whichever kernel each failure names
  c.isolate = forked ? "always" : "never";
  try {
    w_ = std::make_unique<Worker>(c);
  } catch (const std::exception& e) {
    err = e.what();
    return nullptr;
  }
  w_forked_ = forked;
  ++builds_;
  return w_.get();
}

std::string Minimizer::minimize(const CorpusFile& cf, const std::string& source, double max_time_s,
                                int max_checks, Minimized& out, bool forked) {
  try {
    std::string e = shrink(cf, source, max_time_s, max_checks, out, forked);
    if (w_ && !w_->device().usable() && w_->device().backend() != Backend::kCpu &&
        w_->device().backend() != Backend::kAdapter)
      device_failed_ = true;
    return e;
  } catch (const std::exception& e) {
    // A device that failed under a check (on an H100, a kernel that trusts malformed metadata faulted the CUDA
    // context: "copy to host: cudaErrorIllegalAddress") is dropped; the next failure gets a fresh one.
    retired_starts_ = adapter_starts();
    w_.reset();
    device_failed_ = true;
    return std::string("the device failed while minimizing it: ") + e.what();
  }
}

std::string Minimizer::shrink(const CorpusFile& cf, const std::string& source, double max_time_s, int max_checks,
                              Minimized& out, bool forked) {
  const auto t0 = Clock::now();  // the budget counts everything: starting the device too
  if (!cf.verdict || cf.verdict->verdict != Verdict::kFail) return source + " records no failure: nothing to minimize";
  const RecordedVerdict rv = *cf.verdict;
  // Crashes and hangs need the forked launches; everything else runs faster in-process.
  const bool dies = rv.failure == FailureClass::kCrash || rv.failure == FailureClass::kHang;
  std::string err;
  Worker* w = worker(dies || forked || cfg_.isolate == "always", err);
  if (!w) return err;
  const KernelEntry* k = nullptr;
  try {
    k = Registry::global().select(w->device().backend(), rv.kernel).front();
  } catch (const std::exception& e) {
    return e.what();
  }
  const RunOptions run = w->run_options();
  CheckResult last;
  // The class AND the kind of its evidence must stay (a causal off-by-one must keep "O matches the exact result
  // under mask ..." and not shrink into a case where only a fit or the flash rule says mask): the first check,
  // on the file's own case, fixes decided_by ("mask/other-mask", "reorder", ...).
  std::optional<std::string> decided;
  auto still_fails = [&](const Case& c) {
    PreparedCase pc(c, run.oracle.threads);
    // as the campaign checked
    Judged j = check_in_modes(w->device(), *k, pc, run, {.repeat_calls = cfg_.repeat_calls, .amplify = cfg_.amplify});
    if (j.result.verdict != Verdict::kFail) return false;
    refine_class(w->device(), *k, pc, run, cfg_.plugins, j);
    if (j.result.failure != rv.failure) return false;
    if (!decided) decided = j.result.decided_by;
    if (j.result.decided_by != *decided) return false;
    last = j.result;
    return true;
  };
  // The budget's rule: a check starts only if the slowest check of its kind (a shape new to the process, or one it
  // has run) seen so far for this kernel fits in what is left; the steps that do not fit are skipped and counted.
  KernelCost& cost = costs_[rv.kernel];
  int ran = 0, skipped_new = 0, skipped_run = 0;
  double foreseen = 0;  // the last skipped check's
  auto same_process = [&] {  // the shapes run so far are the current process's (a restart compiles again)
    if (cost.process != process()) cost.shapes.clear(), cost.process = process();
  };
  auto timed = [&](const Case& c) {
    if (!validate(c).empty()) return false;
    same_process();
    const std::string key = shape_key(c);
    const bool fresh = !cost.shapes.count(key);
    if (since(t0) + cost.predict(fresh) > max_time_s) {
      ++(fresh ? skipped_new : skipped_run);
      foreseen = cost.predict(fresh);
      return false;
    }
    const auto t = Clock::now();
    const bool fails = still_fails(c);
    double& slowest = fresh ? cost.fresh : cost.repeat;
    slowest = std::max(slowest, since(t));
    ++ran;
    same_process();  // it may have restarted meanwhile
    cost.shapes.insert(key);
    if (fails) skipped_new = skipped_run = 0;  // what is left counts from the last step taken
    return fails;
  };
  if (!timed(cf.the_case)) {
    char why[200];
    std::snprintf(why, sizeof why, "its budget of %.1f s ran out before the first check (%.1f s spent, a check of %s "
                  "takes up to %.1f s): not minimized", max_time_s, since(t0), rv.kernel.c_str(), foreseen);
    if (skipped_new + skipped_run) return why;
    return source + " does not reproduce " + rv.kernel + "/" + failure_class_name(rv.failure) + " on " +
           w->device().name() + " with these options: not minimized";
  }
  // The domain is unbounded here: the case only ever gets smaller.
  FuzzLimits big;
  big.max_batch = big.max_heads = big.max_seq = big.max_dim = big.max_work = int64_t{1} << 40;
  big.max_specials = big.max_special_count = big.max_explicit = int64_t{1} << 30;
  big.domain = cf.the_case.values.domain;  // shrinking keeps the recorded value domain
  big.dtype = cf.the_case.problem.dtype;   // and the dtype
  big.passes = static_cast<uint8_t>(1u << static_cast<int>(cf.the_case.pass));  // and the recorded pass
  const CaseDomain dom(big);
  int steps = 1;
  // A kernel that compiles per shape tries the steps at its current shape first (shrink_impl.h).
  const Case best = shrink_case(cf.the_case, dom, timed, max_checks, steps, pooled(*w, *k));
  out.secs = since(t0);
  out.checks = ran;
  out.decided_by = *decided;
  out.left = skipped_new + skipped_run ? not_tried(skipped_new, cost.predict(true), skipped_run) : "";
  out.file = CorpusFile{};
  out.file.tool.name = "attn-fuzz";
  out.file.tool.command = "attn-fuzz --minimize " + source;
  out.file.the_case = best;
  if (!cf.the_case.label.empty()) out.file.the_case.label = cf.the_case.label + "-min";
  RecordedVerdict nv = rv;  // `last` is the check of `best`: the last step taken, or the first check
  nv.device = last.device;
  nv.reason = last.reason;
  nv.max_ratio = last.max_ratio;
  nv.signature = failure_signature(last);
  out.file.verdict = nv;
  return {};
}

std::string minimize_case(const CorpusFile& cf, const std::string& source, const WorkerConfig& cfg,
                          double max_time_s, int max_checks, Minimized& out) {
  Minimizer m(cfg);
  return m.minimize(cf, source, max_time_s, max_checks, out);
}

int minimize_file(const std::string& path, const WorkerConfig& cfg, const MinimizeOptions& o) {
  CorpusFile cf;
  try {
    cf = read_corpus_file(path);
  } catch (const CorpusError& e) {
    std::fprintf(stderr, "attn-fuzz: %s\n", e.what());
    return 2;
  }
  Minimized m;
  if (const std::string e = minimize_case(cf, path, cfg, o.max_time_s, o.max_checks, m); !e.empty()) {
    std::fprintf(stderr, "attn-fuzz: %s\n", e.c_str());
    return 2;
  }
  fs::path saved;
  try {
    saved = save_to_corpus_dir(o.out_dir, m.file);
  } catch (const CorpusError& e) {
    std::fprintf(stderr, "attn-fuzz: %s\n", e.what());
    return 2;
  }
  const RecordedVerdict& rv = *cf.verdict;
  std::printf(
      "minimized %s (%s, %s by %s) in %d check(s), %.1f s:\n  before: %s\n  after:  %s\n  wrote %s\n  replay: %s\n",
      path.c_str(), rv.kernel.c_str(), failure_class_name(rv.failure), m.decided_by.c_str(), m.checks, m.secs,
      describe(cf.the_case).c_str(), describe(m.file.the_case).c_str(), saved.c_str(),
      replay_command(cfg, saved.string()).c_str());
  if (!m.left.empty()) std::printf("  --minimize-time ran out: %s\n", m.left.c_str());
  return 0;
}

}  // namespace attnfuzz::fuzz
