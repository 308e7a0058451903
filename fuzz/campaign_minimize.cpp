// campaign_minimize.cpp - a campaign's distinct failures shrunk to their minimal cases before the summary.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "fuzz/campaign_phases.h"

namespace attnfuzz::fuzz::campaign {

namespace {
double budget_of(const CampaignOptions& o) {
  if (o.minimize_budget_s >= 0) return o.minimize_budget_s;
  return std::min(300.0, o.max_time_s > 0 ? o.max_time_s / 10 : 30.0);
}
constexpr double kMaxEach = 30;  // seconds for one failure at the most: the budget goes to many
}  // namespace

void minimize_failures(const CampaignOptions& o, const Paths& p, const std::vector<std::string>& isolated,
                       std::vector<Failure>& found) {
  const double budget = budget_of(o);
  std::vector<Failure*> todo;
  for (Failure& f : found)
    if (!f.minimal && f.file.verdict->failure != FailureClass::kHang) todo.push_back(&f);
  if (budget <= 0 || todo.empty()) return;
  // Ordinary inputs first; crashes last: on a GPU a crash can leave the process's device context unusable (an
  // illegal address is sticky), and every minimization after it then fails (minimize() reports it and goes on).
  std::stable_sort(todo.begin(), todo.end(), [](const Failure* a, const Failure* b) {
    const bool ca = a->file.verdict->failure == FailureClass::kCrash;
    const bool cb = b->file.verdict->failure == FailureClass::kCrash;
    if (ca != cb) return cb;
    return input_tier(a->file.the_case) < input_tier(b->file.the_case);
  });
  std::error_code ec;
  fs::create_directories(p.out / "minimized", ec);
  Minimizer mz(o.worker);  // one device (one adapter process) for every failure
  const auto t0 = std::chrono::steady_clock::now();
  size_t done = 0, tried = 0;
  for (size_t i = 0; i < todo.size(); ++i) {
    Failure& f = *todo[i];
    const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // An even share of what is left, at least a second (ordinary inputs come first, so they get theirs).
    const double each = std::min(kMaxEach, std::max(1.0, (budget - spent) / static_cast<double>(todo.size() - i)));
    if (budget - spent < 1) {
      if (!o.quiet)
        std::printf("minimize: budget of %.0f s spent; %zu distinct failure(s) not minimized (attn-fuzz --minimize "
                    "FILE, or --minimize-budget)\n", budget, todo.size() - i);
      break;
    }
    const RecordedVerdict& v = *f.file.verdict;
    if (!o.quiet) {
      std::printf("minimize %zu/%zu: %s %s (%.0f s) ... ", i + 1, todo.size(), v.kernel.c_str(),
                  failure_class_name(v.failure), each);
      std::fflush(stdout);
    }
    // A kernel that killed a worker in-process is launched forked here too (the summary must still be written).
    const bool forked = std::find(isolated.begin(), isolated.end(), v.kernel) != isolated.end();
    Minimized m;
    ++tried;
    const std::string e = mz.minimize(f.file, f.path.string(), each, 5000, m, forked);
    if (!e.empty()) {
      if (!o.quiet) std::printf("not minimized: %s\n", e.c_str());
      continue;
    }
    try {
      write_corpus_file(f.minimal_path, m.file);
    } catch (const CorpusError& err) {
      if (!o.quiet) std::printf("not written: %s\n", err.what());
      continue;
    }
    if (!o.quiet)
      std::printf("%s -> %s, %d check(s), %.1f s%s\n", shape(f.file.the_case.problem).c_str(),
                  shape(m.file.the_case.problem).c_str(), m.checks, m.secs,
                  m.left.empty() ? "" : ("; its budget ran out: " + m.left).c_str());
    f.minimal = std::move(m.file);
    ++done;
  }
  if (o.quiet) return;
  std::printf("minimize: %zu of %zu failure(s) minimized in %.1f s (budget %.0f s)", done, tried,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), budget);
  if (mz.adapter_starts()) std::printf(", %d adapter process(es) started", mz.adapter_starts());
  std::printf("\n");
}

}  // namespace attnfuzz::fuzz::campaign
