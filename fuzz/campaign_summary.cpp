// campaign_summary.cpp - a campaign's summary: the console lines, report.json's campaign facts, summary.md,
// and the exit status.
#include <cstdio>
#include <sstream>

#include "attnfuzz/report.h"
#include "fuzz/campaign_phases.h"

namespace attnfuzz::fuzz::campaign {

namespace {

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
  for (const Failure& f : r.found) {
    RunEntry e;
    e.the_case = f.file.the_case;
    e.result = recorded_result(*f.file.verdict);
    e.corpus_path = f.path.string();
    e.replay_command = replay_command(cfg, f.path.string());
    const fs::path svg = f.path.parent_path() / (f.path.stem().string() + ".svg");
    if (fs::exists(svg, ec)) e.heatmap_path = fs::relative(svg, p.out, ec).string();
    rec.entries.push_back(std::move(e));
  }
  return rec;
}

void print_summary(const CampaignOptions& o, const Outcome& r, const RunRecord& rec) {
  const Aggregate& a = r.stats;
  std::printf(
      "\nattn-fuzz: %.0f s, %lld case(s) (%.0f/s), %lld failing check(s), %zu distinct failure(s)%s%s\n",
      r.wall, (long long)a.cases, r.wall > 0 ? a.cases / r.wall : 0.0, (long long)a.failing, r.found.size(),
      r.synced ? (" found here, " + std::to_string(r.imported.size()) + " imported").c_str() : "",
      r.interrupted ? " (interrupted)" : "");
  if (!r.found.empty()) std::printf("%-13s %-30s %-34s %s\n", "class", "kernel", "shape", "replay");
  for (size_t i = 0; i < r.found.size(); ++i) {
    const RecordedVerdict& v = *r.found[i].file.verdict;
    const RunEntry& e = rec.entries[i];
    std::printf("%-13s %-30s %-34s %s\n", failure_class_name(v.failure), v.kernel.c_str(),
                shape(e.the_case.problem).c_str(), e.replay_command.c_str());
  }
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
  return camp;
}

// summary.md: the campaign's counts, the failures imported and found, then the shared Markdown summary.
std::string summary_markdown(const CampaignOptions& o, const Paths& p, const Outcome& r,
                             const RunRecord& rec) {
  const Aggregate& a = r.stats;
  const std::string ended = ended_text(r);
  std::ostringstream md;
  md << "# attn-fuzz campaign\n\n"
     << "- command: `" << o.command_line << "`\n"
     << "- " << static_cast<long long>(r.wall) << " s, " << a.cases << " cases ("
     << static_cast<long long>(r.wall > 0 ? a.cases / r.wall : 0) << "/s), " << a.failing
     << " failing checks, **" << r.found.size() << " distinct failure(s)**"
     << (r.synced ? " found here, " + std::to_string(r.imported.size()) + " imported" : std::string())
     << (r.interrupted ? " (interrupted)" : "") << "\n"
     << "- semantic features covered: " << a.features << "; corpus: `" << p.corpus.string() << "`\n"
     << "- worker processes that died: " << r.deaths.crashes << " crash(es), " << r.deaths.hangs << " hang(s)"
     << (ended.empty() ? "" : ": " + markdown_escape(ended)) << "\n";
  if (!r.quarantined.empty())
    md << "- quarantined (hung once" << (r.mps ? ", or crashed under MPS" : "")
       << ", not run again): " << joined(r.quarantined) << "\n";
  if (!r.isolated.empty()) md << "- isolated (launched in a forked child): " << joined(r.isolated) << "\n";
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
    md << "| class | kernel | shape | replay |\n|---|---|---|---|\n";
    for (const RunEntry& e : rec.entries)
      md << "| " << failure_class_name(e.result.failure) << " | " << markdown_escape(e.result.kernel) << " | "
         << markdown_escape(shape(e.the_case.problem)) << " | `" << e.replay_command << "` |\n";
    md << "\n";
  }
  if (!rec.entries.empty())
    md << markdown_summary(rec);  // the distinct failures replayed; none: no empty table
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
  // An unreadable failure file still records a failure in this OUT: not a clean result.
  return r.found.empty() && r.skipped.empty() && r.imported.empty() ? 0 : 1;
}

}  // namespace

int write_summary(const CampaignOptions& o, const Paths& p, const Outcome& r) {
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
