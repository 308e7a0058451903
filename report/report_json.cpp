// report_json.cpp - the versioned JSON report of a run (schema described in corpus/README.md).
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "attnfuzz/report.h"

namespace attnfuzz {

RunCounts count(const RunRecord& r) {
  RunCounts c;
  for (const RunEntry& e : r.entries) {
    switch (e.result.verdict) {
      case Verdict::kPass:
        ++c.pass;
        break;
      case Verdict::kFail:
        ++c.fail;
        break;
      case Verdict::kUnsupported:
        ++c.unsupported;
        break;
      case Verdict::kOutsideContract:
        ++c.outside_contract;
        break;
    }
  }
  return c;
}

Json element_to_json(const ElementReport& e) {
  Json j;
  j["tensor"] = !e.tensor.empty() ? e.tensor : e.is_lse ? "lse" : "o";  // backward: "dQ", "dK", "dV" (s = key j)
  j["b"] = e.b;
  j["h"] = e.h;
  j["s"] = e.s;
  if (!e.is_lse) j["d"] = e.d;
  j["expected"] = json_number(e.expected);
  j["got"] = json_number(e.got);
  j["abs_err"] = json_number(std::fabs(e.got - e.expected));
  j["bound"] = json_number(e.bound);
  j["ratio"] = json_number(e.ratio);
  return j;
}

Json entry_to_json(const RunEntry& e, const Json& case_index, const RunRecord* run) {
  const CheckResult& r = e.result;
  const bool fail = r.verdict == Verdict::kFail;
  Json j;
  j["kernel"] = r.kernel;
  // What every result of a run shares is said once, at the top: backend and device, unless this one differs.
  if (!run || r.backend != run->backend) j["backend"] = r.backend;
  if (!run || r.device != run->device) j["device"] = r.device;
  if (case_index.is_null()) {  // a result on its own: the case inline
    j["case_text"] = describe(e.the_case);
    j["case"] = case_to_json(e.the_case);
  } else {
    j["case"] = case_index;  // an index into the report's "cases"
  }
  j["verdict"] = verdict_name(r.verdict);
  if (fail) j["class"] = failure_class_name(r.failure);
  if (!r.reason.empty()) j["reason"] = r.reason;
  j["pass"] = pass_name(e.the_case.pass);
  if (!r.tensor.empty()) j["failed_tensor"] = r.tensor;
  Json ev = Json::array();
  for (const Evidence& x : r.evidence) ev.push_back({{"detector", x.detector}, {"detail", x.detail}});
  if (!ev.empty()) j["evidence"] = ev;
  Json worst = Json::array();  // a failure's worst elements; otherwise the worst one (how close to its bound)
  for (const ElementReport& w : r.worst)
    if (fail || worst.empty()) worst.push_back(element_to_json(w));
  if (!worst.empty()) j["worst"] = worst;
  j["max_ratio"] = json_number(r.max_ratio);
  j["max_abs_err"] = json_number(r.max_abs_err);
  if (!std::isnan(r.baseline_max_ratio)) j["baseline_max_ratio"] = json_number(r.baseline_max_ratio);  // failures
  j["compared"] = r.compared;
  j["failed"] = r.failed;
  j["launch_ms"] = json_number(r.launch_ms);
  j["oracle_ms"] = json_number(r.oracle_ms);
  if (!e.replay_command.empty()) j["replay"] = e.replay_command;
  if (!e.corpus_path.empty()) j["corpus"] = e.corpus_path;
  if (!e.heatmap_path.empty()) j["heatmap"] = e.heatmap_path;
  return j;
}

Json report_to_json(const RunRecord& r) {
  Json j;
  j["schema"] = kReportSchemaName;
  j["schema_version"] = kReportSchemaVersion;
  j["tool"] = {{"name", r.tool.name}, {"version", r.tool.version}, {"command", r.tool.command}};
  j["backend"] = r.backend;
  j["device"] = r.device;
  j["seed"] = seed_to_hex(r.seed);
  j["started_at"] = r.started_at;
  j["wall_s"] = json_number(r.wall_s);
  const RunCounts c = count(r);
  Json by_class = Json::object();
  for (const RunEntry& e : r.entries)
    if (e.result.verdict == Verdict::kFail) {
      const char* name = failure_class_name(e.result.failure);
      by_class[name] = by_class.value(name, 0) + 1;
    }
  j["summary"] = {{"checks", static_cast<int64_t>(r.entries.size())},
                  {"pass", c.pass},
                  {"fail", c.fail},
                  {"unsupported", c.unsupported},
                  {"outside_contract", c.outside_contract},
                  {"fail_by_class", by_class}};
  // Each case once (a sweep checks every case on every kernel), with its one-line text.
  Json cases = Json::array(), results = Json::array();
  std::map<std::string, size_t> seen;
  for (const RunEntry& e : r.entries) {
    Json cj = case_to_json(e.the_case);
    const auto [it, fresh] = seen.emplace(cj.dump(), cases.size());
    if (fresh) {
      cj["text"] = describe(e.the_case);
      cj["tier"] = input_tier_name(input_tier(e.the_case));  // how unusual its inputs are (docs/semantics.md)
      cases.push_back(std::move(cj));
    }
    results.push_back(entry_to_json(e, Json(it->second), &r));
  }
  j["cases"] = cases;
  j["results"] = results;
  return j;
}

std::string report_json_text(const Json& j) {
  // Pretty at the top, one line per case and per result: a sweep's report stays small and greppable.
  Json top = j;
  std::map<std::string, const Json*> lists;
  for (const char* k : {"cases", "results"})
    if (j.contains(k) && j.at(k).is_array() && !j.at(k).empty()) {
      top[k] = std::string("@@attnfuzz-list-") + k + "@@";
      lists[k] = &j.at(k);
    }
  std::string text = top.dump(2, ' ', false, Json::error_handler_t::replace);
  for (const auto& [k, list] : lists) {
    std::string body = "[";
    for (size_t i = 0; i < list->size(); ++i)
      body += (i ? ",\n    " : "\n    ") + (*list)[i].dump(-1, ' ', false, Json::error_handler_t::replace);
    body += "\n  ]";
    const std::string mark = "\"@@attnfuzz-list-" + k + "@@\"";
    text.replace(text.find(mark), mark.size(), body);
  }
  return text + "\n";
}

}  // namespace attnfuzz
