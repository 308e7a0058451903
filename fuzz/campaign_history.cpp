// campaign_history.cpp - a campaign's history across the runs of one OUT (history.json): its name, its runs,
// and when each distinct failure was found and its class known.
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <cstdio>

#include "attnfuzz/report.h"
#include "fuzz/campaign_phases.h"

namespace attnfuzz::fuzz::campaign {

namespace {

fs::path history_path(const Paths& p) { return p.out / "history.json"; }

// The first line of each failure file in work/found.txt (read_found).
std::map<std::string, std::pair<double, double>> found_lines(const Paths& p) {
  std::map<std::string, std::pair<double, double>> out;
  for (const FoundLine& f : read_found(p)) out.emplace(f.file, std::make_pair(f.found, f.classified));
  return out;
}

double file_time(const fs::path& f) {
  struct stat st {};
  if (::stat(f.c_str(), &st) != 0) return 0;
  return static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * static_cast<double>(st.st_mtim.tv_nsec);
}

Json times_json(const FailureTimes& t) {
  return {{"found_unix", t.found_unix},         {"classified_unix", t.classified_unix},
          {"found_after_s", t.found_after_s},   {"classified_after_s", t.classified_after_s},
          {"run", t.run},                       {"from_file_time", t.from_file_time}};
}

}  // namespace

double History::earlier_wall() const {
  double w = 0;
  for (size_t i = 0; i + 1 < runs.size(); ++i) w += runs[i].wall_s;
  return w;
}

std::time_t History::first_started() const { return runs.empty() ? 0 : runs.front().started_unix; }

History read_history(const Paths& p) {
  History h;
  try {
    const std::string text = read_all(history_path(p));
    if (text.empty()) {  // a campaign from before history.json: its report says its name
      const Json r = Json::parse(read_all(p.out / "report.json"));
      h.name = r.at("campaign").value("name", std::string());
      return h;
    }
    const Json j = Json::parse(text);
    h.name = j.value("name", std::string());
    for (const Json& r : j.at("runs"))
      h.runs.push_back({static_cast<std::time_t>(r.value("started_unix", int64_t{0})), r.value("wall_s", 0.0),
                        r.value("cases", int64_t{0}), r.value("failing", int64_t{0}), r.value("interrupted", false)});
    for (const auto& [file, t] : j.at("failures").items())
      h.failures[file] = {t.value("found_unix", 0.0),      t.value("classified_unix", 0.0),
                          t.value("found_after_s", 0.0),   t.value("classified_after_s", 0.0),
                          t.value("run", 0),               t.value("from_file_time", false)};
  } catch (const std::exception&) {
    // none yet (a new OUT), or unreadable: the campaign starts its history again
  }
  return h;
}

void record_run(const Paths& p, History& h, const History::Run& run, const std::vector<Failure>& found) {
  h.runs.push_back(run);
  const int this_run = static_cast<int>(h.runs.size());
  const double before = h.earlier_wall();  // campaign seconds when this run started
  const auto lines = found_lines(p);
  for (const Failure& f : found) {
    const std::string file = f.path.filename().string();
    if (h.failures.count(file)) continue;  // timed by an earlier run
    FailureTimes t;
    t.run = this_run;
    if (const auto it = lines.find(file); it != lines.end()) {
      t.found_unix = it->second.first, t.classified_unix = it->second.second;
    } else {  // saved by the parent (a worker process died) or before found.txt: the file's time
      t.found_unix = t.classified_unix = file_time(f.path);
      t.from_file_time = true;
    }
    auto campaign_s = [&](double unix_s) {
      return before + std::max(0.0, unix_s - static_cast<double>(run.started_unix));
    };
    t.found_after_s = campaign_s(t.found_unix);
    t.classified_after_s = campaign_s(t.classified_unix);
    h.failures[file] = t;
  }
  Json j;
  j["name"] = h.name;
  Json runs = Json::array();
  for (const History::Run& r : h.runs)
    runs.push_back({{"started_unix", static_cast<int64_t>(r.started_unix)},
                    {"wall_s", r.wall_s},
                    {"cases", r.cases},
                    {"failing", r.failing},
                    {"interrupted", r.interrupted}});
  j["runs"] = runs;
  Json fl = Json::object();
  for (const auto& [file, t] : h.failures) fl[file] = times_json(t);
  j["failures"] = fl;
  try {
    write_text_file(history_path(p), j.dump(2) + "\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn-fuzz: cannot write %s: %s\n", history_path(p).c_str(), e.what());
  }
}

}  // namespace attnfuzz::fuzz::campaign
