// minimize.cpp - attn-fuzz --minimize: shrinks a failing corpus case while its kernel and class reproduce.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "check/repeat.h"
#include "fuzz/campaign.h"

namespace attnfuzz::fuzz {

namespace fs = std::filesystem;

std::string minimize_case(const CorpusFile& cf, const std::string& source, const WorkerConfig& cfg_in,
                          double max_time_s, int max_checks, Minimized& out) {
  if (!cf.verdict || cf.verdict->verdict != Verdict::kFail) return source + " records no failure: nothing to minimize";
  const RecordedVerdict rv = *cf.verdict;
  WorkerConfig cfg = cfg_in;
  cfg.kernels = rv.kernel;
  // Crashes and hangs need the forked launches; everything else runs faster in-process.
  const bool dies = rv.failure == FailureClass::kCrash || rv.failure == FailureClass::kHang;
  cfg.isolate = dies || cfg_in.isolate == "always" ? "always" : "never";
  std::unique_ptr<Worker> w;
  try {
    w = std::make_unique<Worker>(cfg);
  } catch (const std::exception& e) {
    return e.what();
  }
  const KernelEntry& k = *w->kernels().front();
  const RunOptions run = w->run_options();
  CheckResult last;
  // The class AND the kind of its evidence must stay (a causal off-by-one must keep "O matches the exact result
  // under mask ..." and not shrink into a case where only a fit or the flash rule says mask): the first check,
  // on the file's own case, fixes decided_by ("mask/other-mask", "reorder", ...).
  std::optional<std::string> decided;
  auto still_fails = [&](const Case& c) {
    if (!validate(c).empty()) return false;
    PreparedCase pc(c, run.oracle.threads);
    // as the campaign checked
    Judged j = check_in_modes(w->device(), k, pc, run, {.repeat_calls = cfg.repeat_calls, .amplify = cfg.amplify});
    if (j.result.verdict != Verdict::kFail) return false;
    refine_class(w->device(), k, pc, run, cfg.plugins, j);
    if (j.result.failure != rv.failure) return false;
    if (!decided) decided = j.result.decided_by;
    if (j.result.decided_by != *decided) return false;
    last = j.result;
    return true;
  };
  const auto t0 = std::chrono::steady_clock::now();
  if (!still_fails(cf.the_case))
    return source + " does not reproduce " + rv.kernel + "/" + failure_class_name(rv.failure) + " on " +
           w->device().name() + " with these options: not minimized";
  // The domain is unbounded here: the case only ever gets smaller.
  FuzzLimits big;
  big.max_batch = big.max_heads = big.max_seq = big.max_dim = big.max_work = int64_t{1} << 40;
  big.max_specials = big.max_special_count = big.max_explicit = int64_t{1} << 30;
  big.domain = cf.the_case.values.domain;  // shrinking keeps the recorded value domain
  big.dtype = cf.the_case.problem.dtype;   // and the dtype
  big.passes = static_cast<uint8_t>(1u << static_cast<int>(cf.the_case.pass));  // and the recorded pass
  const CaseDomain dom(big);
  int checks = 1;
  auto timed = [&](const Case& c) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > max_time_s) {
      checks = max_checks;  // stop the greedy loop
      return false;
    }
    return still_fails(c);
  };
  Case best = shrink_case(cf.the_case, dom, timed, max_checks, checks);
  still_fails(best);  // the recorded verdict is the final case's
  out.secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.checks = checks;
  out.decided_by = *decided;
  out.file = CorpusFile{};
  out.file.tool.name = "attn-fuzz";
  out.file.tool.command = "attn-fuzz --minimize " + source;
  out.file.the_case = best;
  if (!cf.the_case.label.empty()) out.file.the_case.label = cf.the_case.label + "-min";
  RecordedVerdict nv = rv;
  nv.device = last.device;
  nv.reason = last.reason;
  nv.max_ratio = last.max_ratio;
  nv.signature = failure_signature(last);
  out.file.verdict = nv;
  return {};
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
  return 0;
}

}  // namespace attnfuzz::fuzz
