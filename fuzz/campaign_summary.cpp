// campaign_summary.cpp - a campaign's summary: the console lines, report.json's campaign facts, summary.md,
// and the exit status.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "attnfuzz/report.h"
#include "fuzz/campaign_phases.h"

namespace attnfuzz::fuzz::campaign {

std::string shape(const Problem& p) {
  char b[160];
  std::snprintf(b, sizeof b, "B=%lld H=%lld/%lld %lldx%lld D=%lld%s %s", (long long)p.batch,
                (long long)p.heads_q, (long long)p.heads_kv, (long long)p.seq_q, (long long)p.seq_k,
                (long long)p.head_dim,
                p.head_dim_v != p.head_dim ? ("/" + std::to_string(p.head_dim_v)).c_str() : "",
                mask_to_string(p).c_str());
  if (has_sequences(p)) return std::string(b) + " " + layout_name(p);  // Sq x Sk: the largest lengths
  return b;
}

namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string t;
  for (const auto& x : v) t += (t.empty() ? "" : ", ") + x;
  return t;
}

std::string ended_text(const Outcome& r) {
  std::string t;
  for (const auto& [why, n] : r.ended) t += (t.empty() ? "" : "; ") + std::to_string(n) + " x " + why;
  return t;
}

// One kernel's row of the per-kernel table, summed over passes and dtypes (or one "PASS DTYPE" of it).
struct KernelCounts {
  int64_t checked = 0, failed = 0, refused = 0;
};
KernelCounts counts_of(const std::map<std::string, int64_t>& m) {
  KernelCounts c;
  for (const auto& [v, n] : m) {
    if (v == "refused" || v == "unsupported") c.refused += n;
    else if (v == "pass" || v == "fail" || v == "outside-contract") c.checked += n;
    if (v == "fail") c.failed += n;
  }
  return c;
}
KernelCounts kernel_total(const Aggregate& a, const std::string& k) {
  KernelCounts t;
  if (const auto it = a.by_kernel.find(k); it != a.by_kernel.end())
    for (const auto& [row, m] : it->second) {
      const KernelCounts c = counts_of(m);
      t.checked += c.checked, t.failed += c.failed, t.refused += c.refused;
    }
  return t;
}
// The most frequent reason kernel k gave for refusing an input ("" = none recorded).
std::string refusal_of(const Aggregate& a, const std::string& k) {
  std::string why;
  int64_t most = 0;
  for (const auto& [key, n] : a.refusals)
    if (key.rfind(k + ": ", 0) == 0 && n > most) why = key.substr(k.size() + 2), most = n;
  return why;
}
// The selected kernels that got no check in this run (every input refused, or none drawn for them).
std::vector<std::string> unchecked(const Outcome& r) {
  std::vector<std::string> out;
  for (const std::string& k : r.kernels)
    if (kernel_total(r.stats, k).checked == 0) out.push_back(k);
  return out;
}
std::string unchecked_line(const Outcome& r, const std::vector<std::string>& ks) {
  std::string t = "NOT CHECKED: " + std::to_string(ks.size()) + " of " + std::to_string(r.kernels.size()) +
                  " selected kernel(s) got no check in this run: ";
  for (size_t i = 0; i < ks.size(); ++i) {
    const std::string why = refusal_of(r.stats, ks[i]);
    t += (i ? "; " : "") + ks[i] + (why.empty() ? " (no input drawn for it)" : " (refused: " + why.substr(0, 120) + ")");
  }
  return t;
}
const FailureTimes* times_of(const Outcome& r, const Failure& f) {
  const auto it = r.history.failures.find(f.path.filename().string());
  return it == r.history.failures.end() ? nullptr : &it->second;
}
bool is_new(const Outcome& r, const Failure& f) {
  const FailureTimes* t = times_of(r, f);
  return t && t->run == static_cast<int>(r.history.runs.size());
}
std::string after_text(const FailureTimes* t) {
  if (!t) return "-";
  char b[64];
  std::snprintf(b, sizeof b, "%.0f s%s", t->found_after_s, t->from_file_time ? " (file time)" : "");
  return b;
}
// The campaign over every run of this OUT: "run 2 of this OUT: 120 s, 4000 cases in all".
std::string runs_text(const Outcome& r) {
  const History& h = r.history;
  if (h.runs.size() < 2) return "";
  int64_t cases = 0;
  double wall = 0;
  for (const History::Run& x : h.runs) cases += x.cases, wall += x.wall_s;
  char b[160];
  std::snprintf(b, sizeof b, "run %zu of this OUT (resumed): %.0f s, %lld case(s) in all runs", h.runs.size(), wall,
                (long long)cases);
  return b;
}

// The distinct failures found here as report entries, each with its replay command and heatmap.
RunRecord make_record(const CampaignOptions& o, const Paths& p, const Outcome& r) {
  const WorkerConfig& cfg = o.worker;
  RunRecord rec;
  rec.tool.name = "attn-fuzz";
  rec.tool.command = o.command_line;
  rec.backend = cfg.backend;
  rec.device = r.found.empty() ? cfg.backend : r.found.front().file.verdict->device;
  rec.wall_s = r.wall;
  std::error_code ec;
  for (const Failure& f : r.found) {  // the minimal case where there is one (the original: report.json's campaign)
    RunEntry e;
    e.the_case = f.shown().the_case;
    e.result = recorded_result(*f.shown().verdict);
    e.corpus_path = f.shown_path().string();
    e.replay_command = replay_command(cfg, f.shown_path().string());
    const fs::path svg = f.path.parent_path() / (f.path.stem().string() + ".svg");
    if (fs::exists(svg, ec)) e.heatmap_path = fs::relative(svg, p.out, ec).string();
    rec.entries.push_back(std::move(e));
  }
  return rec;
}

// The findings, those across the most kernels first; the first ten on the console.
void print_findings(const Outcome& r) {
  const std::vector<Finding>& fs = r.findings;
  if (fs.size() >= r.found.size()) return;  // nothing grouped: the failure table says it all
  std::printf("%zu finding(s): the %zu distinct failures grouped by class, deciding evidence and minimal input "
              "pattern\n", fs.size(), r.found.size());
  for (size_t i = 0; i < fs.size() && i < 10; ++i) std::printf("  %s\n", finding_line(fs[i]).c_str());
  if (fs.size() > 10) std::printf("  (%zu more: summary.md, report.json)\n", fs.size() - 10);
}

// " (--fail-tiers F: N of them counted for the exit status)" when --fail-tiers is not all, else "".
std::string counted_note(const CampaignOptions& o, const Outcome& r) {
  if (o.fail_tiers == "all") return "";
  return " (--fail-tiers " + o.fail_tiers + ": " + std::to_string(r.tally.counted) +
         " of them counted for the exit status)";
}

// The distinct failures: the first --max-failures of each kernel x class (found first), the rest counted.
void print_failures(const CampaignOptions& o, const Outcome& r, const RunRecord& rec) {
  if (r.found.empty()) return;
  std::vector<size_t> order(r.found.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto found_s = [&](size_t i) {
    const FailureTimes* t = times_of(r, r.found[i]);
    return t ? t->found_after_s : 1e300;
  };
  // Ordinary inputs first (issue 30: a maintainer reads those first), then by when found.
  const std::vector<InputTier>& tier = r.tiers;
  size_t ordinary = 0;
  size_t minimized = 0;
  for (size_t i = 0; i < tier.size(); ++i) {
    ordinary += tier[i] == InputTier::kOrdinary;
    minimized += r.found[i].minimal.has_value();
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return tier[x] != tier[y] ? tier[x] < tier[y] : found_s(x) < found_s(y);
  });
  FailureTally tally;
  std::vector<size_t> shown;
  for (size_t i : order) {
    const RecordedVerdict& v = *r.found[i].file.verdict;
    if (tally.add(v.kernel, failure_class_name(v.failure)) < r.max_failures || r.all_failures) shown.push_back(i);
  }
  std::printf("%zu of %zu distinct failure(s) on ordinary inputs (finite, model-sized values, no special value)\n",
              ordinary, r.found.size());
  if (minimized)
    std::printf("%zu minimized: their inputs, shape and replay are the minimal case's (OUT/minimized; the case as "
                "found: OUT/failures)\n", minimized);
  std::printf("%-18s %-13s %-30s %-34s %-10s %s\n", "inputs", "class", "kernel", "shape", "found", "replay");
  for (size_t i : shown) {
    const RecordedVerdict& v = *r.found[i].file.verdict;
    const int64_t n = tally.count(v.kernel, failure_class_name(v.failure));
    std::printf(
        "%-18s %-13s %-30s %-34s %-10s %s%s%s%s\n", input_tier_name(tier[i]), failure_class_name(v.failure),
        v.kernel.c_str(), shape(rec.entries[i].the_case.problem).c_str(),
        after_text(times_of(r, r.found[i])).c_str(), rec.entries[i].replay_command.c_str(),
        is_new(r, r.found[i]) && r.history.runs.size() > 1 ? "  NEW" : "",
        n > 1 && !r.all_failures ? ("  (" + std::to_string(n) + " distinct of this kernel x class)").c_str()
                                 : "",
        tier_counted(o.fail_tiers, tier[i]) ? "" : "  (not counted: --fail-tiers)");
  }
  if (shown.size() < r.found.size())
    std::printf("(%zu more distinct failure(s) of the same kernels x classes: summary.md, report.json; --all-failures "
                "lists them)\n", r.found.size() - shown.size());
}

// One line per selected kernel: checks, failures, refusals and the most frequent reason, per pass and dtype.
void print_kernels(const Outcome& r) {
  std::printf("%-30s %8s %7s %8s  %s\n", "kernel", "checked", "failed", "refused", "per pass and dtype; why refused");
  for (const std::string& k : r.kernels) {
    const KernelCounts t = kernel_total(r.stats, k);
    std::string rows;
    if (const auto it = r.stats.by_kernel.find(k); it != r.stats.by_kernel.end())
      for (const auto& [row, m] : it->second) {
        const KernelCounts c = counts_of(m);
        if (c.checked) rows += (rows.empty() ? "" : ", ") + row + " " + std::to_string(c.checked);
      }
    const std::string why = refusal_of(r.stats, k);
    std::printf("%-30s %8lld %7lld %8lld  %s%s%s\n", k.c_str(), (long long)t.checked, (long long)t.failed,
                (long long)t.refused, rows.empty() ? "NONE" : rows.c_str(), why.empty() ? "" : "; ",
                why.substr(0, 100).c_str());
  }
}

// "checks' time (all workers, 2,036 s): prepare 3%, launch 21%, buffers 4%, oracle 58%, judge 11%, classify 3%;
// 13.9 ms per check; kernels 2% (device time), 17 buffer calls per check" (fuzz/README.md "Where a GPU campaign's
// time goes"); empty before any check.
std::string phase_line(const Aggregate& a) {
  double total = 0;
  for (const auto& [k, v] : a.phase_s) total += v;
  if (!(total > 0) || a.cases <= 0) return {};
  char buf[128];
  std::snprintf(buf, sizeof buf, "checks' time (all workers, %.0f s): ", total);
  std::string line = buf;
  const char* sep = "";
  for (const char* k : {"prepare", "launch", "buffers", "oracle", "judge", "classify"})
    if (const auto it = a.phase_s.find(k); it != a.phase_s.end()) {
      std::snprintf(buf, sizeof buf, "%s%s %.0f%%", sep, k, 100 * it->second / total);
      line += buf;
      sep = ", ";
    }
  std::snprintf(buf, sizeof buf, "; %.2f ms per check; kernels %.0f%% (device time), %.1f buffer calls per check",
                1000 * total / static_cast<double>(a.cases), 100 * a.kernel_s / total,
                static_cast<double>(a.buffer_calls) / static_cast<double>(a.cases));
  return line + buf;
}

// One line per kernel whose shape pool was on (fuzz/shape_pool.h): "compile-aware numpy-ref (declared by its adapter
// (recompiles_per_shape)): 14 new shapes in 2 worker process(es), 1234 checks (88 per shape), 40 inputs snapped
// onto compiled shapes, 3 new shape(s) refused, 21% of its check time in first calls and refusals at new shapes"; the
// measured kernels that do not compile say so too. Empty without.
std::vector<std::string> compile_lines(const Aggregate& a) {
  std::vector<std::string> out;
  for (const auto& [k, t] : a.compile) {
    char buf[512];
    if (t.mode == "pooled")
      std::snprintf(buf, sizeof buf,
                    "compile-aware %s (%s): %lld new shape(s) in %lld worker process(es), %lld check(s) (%.1f per "
                    "shape), %lld input(s) snapped onto compiled shapes, %lld new shape(s) refused, %.0f%% of its "
                    "check time in first calls and refusals at new shapes",
                    k.c_str(), t.why.c_str(), (long long)t.shapes, (long long)t.processes, (long long)t.checks,
                    t.shapes ? static_cast<double>(t.checks) / static_cast<double>(t.shapes) : 0.0,
                    (long long)t.snapped, (long long)t.refused, t.check_s > 0 ? 100 * t.new_shape_s / t.check_s : 0.0);
    else
      std::snprintf(buf, sizeof buf, "not compile-aware %s (%s): every input's shape as drawn", k.c_str(),
                    t.mode == "probe" ? "still measuring first calls" : t.why.c_str());
    out.push_back(buf);
  }
  return out;
}

Json compile_json(const Aggregate& a) {
  Json j = Json::object();
  for (const auto& [k, t] : a.compile)
    j[k] = {{"mode", t.mode},         {"why", t.why},         {"new_shapes", t.shapes},
            {"checks", t.checks},     {"snapped", t.snapped}, {"refused", t.refused}, {"worker_processes", t.processes},
            {"new_shape_s", t.new_shape_s}, {"check_s", t.check_s}};
  return j;
}

void print_summary(const CampaignOptions& o, const Outcome& r, const RunRecord& rec) {
  const Aggregate& a = r.stats;
  int64_t fresh = 0;
  for (const Failure& f : r.found) fresh += is_new(r, f);
  const std::vector<std::string> none = unchecked(r);
  if (!none.empty()) std::printf("\n%s\n", unchecked_line(r, none).c_str());
  std::printf(
      "\nattn-fuzz: %.0f s, %lld case(s) (%.0f/s), %lld failing check(s), %zu distinct failure(s)%s%s%s\n",
      r.wall, (long long)a.cases, r.wall > 0 ? a.cases / r.wall : 0.0, (long long)a.failing, r.found.size(),
      r.synced ? (" found here, " + std::to_string(r.imported.size()) + " imported").c_str() : "",
      r.history.runs.size() > 1 ? (", " + std::to_string(fresh) + " new in this run").c_str() : "",
      r.interrupted ? " (interrupted)" : "");
  if (!r.found.empty())  // issue 30: the tiers lead, ordinary first
    std::printf("failures by input tier: %s%s\n", input_tier_counts(r.tally.n).c_str(),
                counted_note(o, r).c_str());
  if (const std::string runs = runs_text(r); !runs.empty()) std::printf("%s\n", runs.c_str());
  print_findings(r);
  print_failures(o, r, rec);
  print_kernels(r);
  for (const std::string& line : compile_lines(a)) std::printf("%s\n", line.c_str());
  if (const std::string t = phase_line(a); !t.empty()) std::printf("%s\n", t.c_str());
  if (!r.imported.empty()) {
    std::printf("imported from other campaigns (--sync %s; first found there, not saved again here):\n",
                o.sync_dir.c_str());
    std::printf("%-13s %-30s %-34s %s\n", "class", "kernel", "shape", "found by");
    for (const ImportedFailure& f : r.imported)
      std::printf("%-13s %-30s %-34s %s\n", failure_class_name(f.verdict.failure), f.verdict.kernel.c_str(),
                  shape(f.the_case.problem).c_str(), f.from.c_str());
  }
  if (r.synced) {
    const SyncTotals& st = r.sync;
    std::string per;
    int64_t in_corpus = 0;
    for (const auto& [from, n] : st.imported_corpus) {
      per += (per.empty() ? "" : ", ") + from + " " + std::to_string(n);
      in_corpus += n;
    }
    std::printf(
        "sync %s as %s: published %lld corpus entr(ies), %lld failure(s); imported %lld corpus "
        "entr(ies)%s%s%s "
        "(%lld run by the workers), %zu failure(s); %lld round(s), %.2f s (%.2f s CPU)\n",
        o.sync_dir.c_str(), r.name.c_str(), (long long)st.published_corpus, (long long)st.published_failures,
        (long long)in_corpus, per.empty() ? "" : " (", per.c_str(), per.empty() ? "" : ")",
        (long long)st.imported_inputs_run, r.imported.size(), (long long)st.rounds, st.seconds,
        st.cpu_seconds);
  }
  const std::string ended = ended_text(r);
  std::printf("worker processes that died: %lld crash(es), %lld hang(s)%s%s\n", (long long)r.deaths.crashes,
              (long long)r.deaths.hangs, ended.empty() ? "" : ": ", ended.c_str());
  if (r.mps)
    std::printf(
        "MPS: %lld crash / hang / launch-error check(s) re-run alone, outside MPS (a failure they reproduced "
        "is listed above)%s\n",
        (long long)r.mps_rechecked,
        r.mps_pending ? (", " + std::to_string(r.mps_pending) + " not re-run (time)").c_str() : "");
  if (!r.quarantined.empty())
    std::printf("quarantined (hung once%s, not run again): %s\n", r.mps ? ", or crashed under MPS" : "",
                joined(r.quarantined).c_str());
  if (!r.isolated.empty())
    std::printf("isolated (launched in a forked child): %s\n", joined(r.isolated).c_str());
  for (const Skipped& k : r.skipped)
    std::printf("skipped unreadable failure file (kept as it is): %s\n", k.why.c_str());
}

Json sync_json(const CampaignOptions& o, const Outcome& r) {
  const SyncTotals& st = r.sync;
  Json sj;
  sj["dir"] = o.sync_dir;
  sj["interval_s"] = o.sync_interval_s;
  sj["published_corpus"] = st.published_corpus;
  sj["published_failures"] = st.published_failures;
  sj["imported_corpus"] = st.imported_corpus;
  sj["imported_inputs_run"] = st.imported_inputs_run;
  sj["rounds"] = st.rounds;
  sj["seconds"] = st.seconds;
  sj["cpu_seconds"] = st.cpu_seconds;
  Json fl = Json::array();
  for (const ImportedFailure& f : r.imported)
    fl.push_back({{"kernel", f.verdict.kernel},
                  {"class", failure_class_name(f.verdict.failure)},
                  {"signature", f.verdict.signature},
                  {"from", f.from},
                  {"file", f.path.string()}});
  sj["imported_failures"] = fl;
  return sj;
}

// The campaign over its runs (report.json's campaign): the runs, when each distinct failure was found and its
// class known, the per-kernel table, the kernels that got no check.
void history_json(const Outcome& r, const std::string& fail_tiers, Json& camp) {
  camp["first_started_unix"] = static_cast<int64_t>(r.history.first_started());
  Json runs = Json::array();
  for (const History::Run& x : r.history.runs)
    runs.push_back({{"started_unix", static_cast<int64_t>(x.started_unix)}, {"wall_s", x.wall_s},
                    {"cases", x.cases}, {"failing", x.failing}, {"interrupted", x.interrupted}});
  camp["runs"] = runs;
  Json fl = Json::array();
  for (size_t i = 0; i < r.found.size(); ++i) {
    const Failure& f = r.found[i];
    const RecordedVerdict& v = *f.file.verdict;
    Json x = {{"file", f.path.filename().string()},
              {"kernel", v.kernel},
              {"class", failure_class_name(v.failure)},
              {"signature", v.signature},
              {"new", is_new(r, f)},
              {"tier", input_tier_name(r.tiers[i])},
              {"counted", tier_counted(fail_tiers, r.tiers[i])},
              {"tier_as_found", input_tier_name(input_tier(f.file.the_case))},
              {"shape_as_found", shape(f.file.the_case.problem)}};
    if (f.minimal)
      x["minimized"] = {{"file", "minimized/" + f.minimal_path.filename().string()}, {"shape", shape(f.minimal->the_case.problem)},
                        {"description", describe(f.minimal->the_case)}, {"signature", f.minimal->verdict->signature}};
    if (const FailureTimes* t = times_of(r, f)) {
      x["found_unix"] = t->found_unix;
      x["classified_unix"] = t->classified_unix;
      x["found_after_s"] = t->found_after_s;  // campaign time: the earlier runs' wall time included
      x["classified_after_s"] = t->classified_after_s;
      x["run"] = t->run;
      x["from_file_time"] = t->from_file_time;
    }
    fl.push_back(std::move(x));
  }
  camp["failures"] = fl;
  std::vector<std::string> names;
  for (const Failure& f : r.found) names.push_back(f.path.filename().string());
  camp["findings"] = findings_json(r.findings, names);
  camp["by_kernel"] = r.stats.by_kernel;  // kernel -> "PASS DTYPE" -> verdict or "refused" -> count
  camp["kernels"] = r.kernels;
  camp["unchecked_kernels"] = unchecked(r);
}

// Campaign facts on top of the shared report formats (report.json's "campaign").
Json campaign_json(const CampaignOptions& o, const Paths& p, const Outcome& r) {
  const Aggregate& a = r.stats;
  Json camp;
  camp["cases"] = a.cases;
  camp["cases_per_s"] = r.wall > 0 ? a.cases / r.wall : 0.0;
  camp["replayed_inputs"] = a.replayed;  // libFuzzer re-runs of kept inputs answered from work/featcache
  if (r.mps) camp["mps"] = {{"rechecked_alone", r.mps_rechecked}, {"not_rechecked", r.mps_pending}};
  // Where the workers' time went (issue 17): seconds in checks and in the custom mutator, over all worker
  // processes; the rest of workers x wall is libFuzzer, process start-up, merges and idle time.
  camp["worker_check_s"] = a.check_s;
  camp["worker_mutate_s"] = a.mutate_s;
  Json per_kernel_ms = Json::object();  // milliseconds per check, per kernel (compare: bench/fuzz_speed)
  for (const auto& [k, t] : a.kernel_check_s) {
    int64_t n = 0;
    if (const auto it = a.kernels.find(k); it != a.kernels.end())
      for (const auto& [v, c] : it->second) n += v == "unsupported" || v == "quarantined" ? 0 : c;
    if (n > 0) per_kernel_ms[k] = 1000 * t / static_cast<double>(n);
  }
  camp["per_kernel_check_ms"] = per_kernel_ms;
  camp["worker_phase_s"] = a.phase_s;  // the checks' time by phase (prepare, launch, buffers, oracle, judge, classify)
  camp["worker_kernel_s"] = a.kernel_s;      // the device's own time of those launches (part of launch)
  camp["worker_buffer_calls"] = a.buffer_calls;
  camp["compile_aware"] = compile_json(a);  // per kernel whose shape pool was on, or measured (fuzz/shape_pool.h)
  camp["skipped_inputs"] =
      a.skipped;                  // inputs no selected kernel ran (in verdicts: unsupported, quarantined)
  camp["refusals"] = a.refusals;  // why kernels refused inputs (the first few distinct reasons per worker)
  camp["failing_checks"] = a.failing;
  camp["failing_by_class"] = a.classes;
  camp["verdicts"] = a.verdicts;
  camp["per_kernel"] = a.kernels;
  camp["semantic_features"] = a.features;
  camp["distinct_failures"] = r.found.size();
  camp["interrupted"] = r.interrupted;
  camp["worker_crashes"] = r.deaths.crashes;
  camp["worker_hangs"] = r.deaths.hangs;
  camp["worker_deaths"] = r.ended;  // what ended them: reason -> processes
  camp["quarantined"] = r.quarantined;
  camp["isolated"] = r.isolated;
  Json sk = Json::array();
  for (const Skipped& k : r.skipped) sk.push_back({{"path", k.path.string()}, {"error", k.why}});
  camp["skipped_failure_files"] = sk;
  camp["corpus"] = p.corpus.string();
  camp["name"] = r.name;
  camp["started_at"] = [&] {
    std::tm tm{};
    gmtime_r(&r.started_unix, &tm);
    char b[32];
    std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return std::string(b);
  }();
  camp["started_unix"] = static_cast<int64_t>(r.started_unix);
  camp["wall_s"] = r.wall;
  camp["backend"] = o.worker.backend;
  camp["replay_flags"] = o.worker.replay_flags;
  camp["features_hex"] = a.features_hex;
  if (r.synced) camp["sync"] = sync_json(o, r);
  history_json(r, o.fail_tiers, camp);
  Json by_tier = Json::object();  // issue 30: ordinary first (the keys in kInputTiers order)
  for (InputTier t : kInputTiers) by_tier[input_tier_name(t)] = r.tally.n[static_cast<int>(t)];
  camp["failures_by_tier"] = by_tier;
  camp["fail_tiers"] = o.fail_tiers;
  camp["failures_counted"] = r.tally.counted;
  return camp;
}

// The per-kernel table: checked, failed, refused and the most frequent reason, per pass and dtype.
void kernels_markdown(const Outcome& r, std::ostringstream& md) {
  md << "## Per kernel\n\n| kernel | pass, dtype | checked | failed | refused | why refused (most often) |\n"
        "|---|---|---|---|---|---|\n";
  for (const std::string& k : r.kernels) {
    const std::string why = markdown_escape(refusal_of(r.stats, k));
    const auto it = r.stats.by_kernel.find(k);
    if (it == r.stats.by_kernel.end() || it->second.empty()) {
      md << "| " << markdown_escape(k) << " | - | **0** | 0 | 0 | " << (why.empty() ? "no input drawn for it" : why)
         << " |\n";
      continue;
    }
    for (const auto& [row, m] : it->second) {
      const KernelCounts c = counts_of(m);
      md << "| " << markdown_escape(k) << " | " << row << " | " << (c.checked ? std::to_string(c.checked) : "**0**")
         << " | " << c.failed << " | " << c.refused << " | " << (c.refused ? why : "") << " |\n";
    }
  }
  md << "\n";
}

// The shared Markdown summary under a campaign's own title: its headings one level down (one H1 per page).
std::string demote_headings(const std::string& md) {
  std::istringstream in(md);
  std::string out;
  for (std::string line; std::getline(in, line);) out += (line.rfind('#', 0) == 0 ? "#" : "") + line + "\n";
  return out;
}

// summary.md: the campaign's counts, the failures imported and found, then the shared Markdown summary.
std::string summary_markdown(const CampaignOptions& o, const Paths& p, const Outcome& r,
                             const RunRecord& rec) {
  const Aggregate& a = r.stats;
  const std::string ended = ended_text(r);
  std::ostringstream md;
  md << "# attn-fuzz campaign " << markdown_escape(r.name) << "\n\n";
  if (const std::vector<std::string> none = unchecked(r); !none.empty())
    md << "**" << markdown_escape(unchecked_line(r, none)) << "**\n\n";
  if (const std::string runs = runs_text(r); !runs.empty()) md << "- " << runs << "\n";
  md << "- command: `" << o.command_line << "`\n"
     << "- " << static_cast<long long>(r.wall) << " s, " << a.cases << " cases ("
     << static_cast<long long>(r.wall > 0 ? a.cases / r.wall : 0) << "/s), " << a.failing
     << " failing checks, **" << r.found.size() << " distinct failure(s)**"
     << (r.synced ? " found here, " + std::to_string(r.imported.size()) + " imported" : std::string())
     << (r.interrupted ? " (interrupted)" : "") << "\n";
  if (!r.found.empty())
    md << "- failures by input tier: " << input_tier_counts(r.tally.n) << markdown_escape(counted_note(o, r))
       << "\n";
  md << "- semantic features covered: " << a.features << "; corpus: `" << p.corpus.string() << "`\n"
     << "- worker processes that died: " << r.deaths.crashes << " crash(es), " << r.deaths.hangs << " hang(s)"
     << (ended.empty() ? "" : ": " + markdown_escape(ended)) << "\n";
  if (!r.quarantined.empty())
    md << "- quarantined (hung once" << (r.mps ? ", or crashed under MPS" : "")
       << ", not run again): " << joined(r.quarantined) << "\n";
  if (!r.isolated.empty()) md << "- isolated (launched in a forked child): " << joined(r.isolated) << "\n";
  for (const std::string& line : compile_lines(a)) md << "- " << markdown_escape(line) << "\n";
  for (const Skipped& k : r.skipped)
    md << "- **skipped unreadable failure file** (kept as it is): `" << k.path.string()
       << "`: " << markdown_escape(k.why) << "\n";
  if (r.synced) {
    const SyncTotals& st = r.sync;
    int64_t in_corpus = 0;
    std::string per;
    for (const auto& [from, n] : st.imported_corpus) {
      per += (per.empty() ? "" : ", ") + markdown_escape(from) + " " + std::to_string(n);
      in_corpus += n;
    }
    md << "- sync `" << o.sync_dir << "` as **" << markdown_escape(r.name) << "**: published "
       << st.published_corpus << " corpus entries and " << st.published_failures << " failures; imported "
       << in_corpus << " corpus entries" << (per.empty() ? "" : " (" + per + ")") << ", "
       << st.imported_inputs_run << " of them run by the workers, and " << r.imported.size() << " failures\n";
  }
  md << "\n";
  if (!r.imported.empty()) {
    md << "Imported from other campaigns (first found there):\n\n| class | kernel | shape | found by |\n"
          "|---|---|---|---|\n";
    for (const ImportedFailure& f : r.imported)
      md << "| " << failure_class_name(f.verdict.failure) << " | " << markdown_escape(f.verdict.kernel)
         << " | " << markdown_escape(shape(f.the_case.problem)) << " | " << markdown_escape(f.from) << " |\n";
    md << "\n";
  }
  if (!r.found.empty()) {
    md << "## Distinct failures\n\nOrdinary inputs first. Where a failure was minimized, its inputs, shape and replay "
          "are the minimal case's (minimized/; as found: failures/).\n\n| inputs | class | kernel | shape | found after | class known "
          "after | run | replay |\n|---|---|---|---|---|---|---|---|\n";
    std::vector<size_t> order(r.found.size());
    const std::vector<InputTier>& tier = r.tiers;
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return tier[x] < tier[y]; });
    for (size_t i : order) {
      const RunEntry& e = rec.entries[i];
      const FailureTimes* t = times_of(r, r.found[i]);
      char known[32] = "-";
      if (t) std::snprintf(known, sizeof known, "%.0f s", t->classified_after_s);
      md << "| " << input_tier_name(tier[i]) << (tier_counted(o.fail_tiers, tier[i]) ? "" : " (not counted)")
         << " | " << failure_class_name(e.result.failure) << " | " << markdown_escape(e.result.kernel)
         << " | " << markdown_escape(shape(e.the_case.problem)) << " | " << after_text(t) << " | " << known
         << " | " << (t ? std::to_string(t->run) : "-")
         << (is_new(r, r.found[i]) && r.history.runs.size() > 1 ? " **new**" : "") << " | `"
         << e.replay_command << "` |\n";
    }
    md << "\n";
  }
  md << findings_markdown(r.findings);
  kernels_markdown(r, md);
  if (!rec.entries.empty())  // the distinct failures replayed, under this page's title; none: no empty table
    md << demote_headings(markdown_summary(rec));
  return md.str();
}

// 0 no failure, 1 distinct failures (or an unreadable failure file), 2 nothing was checked.
int exit_status(const CampaignOptions& o, const Outcome& r) {
  const Aggregate& a = r.stats;
  if (a.cases == 0 && r.found.empty()) {  // checking nothing is an input error, never a pass
    if (a.skipped > 0) {
      std::string most;  // the most frequent reason, as a kernel or its adapter gave it
      int64_t n = 0;
      for (const auto& [why, c] : a.refusals)
        if (c > n) most = why, n = c;
      std::fprintf(
          stderr,
          "attn-fuzz: no case was checked: the selected kernels refused all %lld input(s) the campaign "
          "drew (see --max-seq / --max-d and what the kernels support: --list)%s%s\n",
          (long long)a.skipped, most.empty() ? "" : "; most often ", most.c_str());
    } else  // e.g. --worker /bin/true
      std::fprintf(stderr, "attn-fuzz: no case was checked: the workers (%s) reported no check\n",
                   o.worker_binary.c_str());
    return 2;
  }
  // An unreadable failure file still records a failure in this OUT: not a clean result (it has no tier).
  if (!r.skipped.empty()) return 1;
  if (r.found.empty() && r.imported.empty()) return 0;
  std::vector<InputTier> tiers = r.tiers;  // --fail-tiers: the failures found here and those imported
  for (const ImportedFailure& f : r.imported) tiers.push_back(input_tier(f.the_case));
  return tier_exit_status(tally_tiers(tiers, o.fail_tiers), o.fail_tiers);
}

}  // namespace

int write_summary(const CampaignOptions& o, const Paths& p, Outcome& r) {
  // Ordinary inputs first everywhere (report.json, summary.md, junit.xml), found order within a tier.
  std::vector<std::pair<InputTier, size_t>> order;
  for (size_t i = 0; i < r.found.size(); ++i) order.emplace_back(input_tier(r.found[i].shown().the_case), i);
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<Failure> sorted;
  r.tiers.clear();
  for (const auto& [tier, i] : order) {
    sorted.push_back(std::move(r.found[i]));
    r.tiers.push_back(tier);
  }
  r.found = std::move(sorted);
  r.tally = tally_tiers(r.tiers, o.fail_tiers);
  std::vector<const CorpusFile*> shown;
  for (const Failure& f : r.found) shown.push_back(&f.shown());
  r.findings = group_findings(shown);
  const RunRecord rec = make_record(o, p, r);
  print_summary(o, r, rec);
  try {
    const ReportPaths paths = write_reports(rec, p.out);
    Json j = report_to_json(rec);
    j["campaign"] = campaign_json(o, p, r);
    write_text_file(paths.json, report_json_text(j));
    write_text_file(paths.markdown, summary_markdown(o, p, r, rec));
    std::printf("reports: %s  %s  %s\n", paths.markdown.c_str(), paths.json.c_str(), paths.junit.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn-fuzz: cannot write reports: %s\n", e.what());
    return 2;
  }
  return exit_status(o, r);
}

}  // namespace attnfuzz::fuzz::campaign
