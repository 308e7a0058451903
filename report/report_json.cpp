// report_json.cpp - the versioned JSON report of a run (schema described in corpus/README.md).
#include <cmath>

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

Json entry_to_json(const RunEntry& e) {
  const CheckResult& r = e.result;
  Json j;
  j["kernel"] = r.kernel;
  j["backend"] = r.backend;
  j["device"] = r.device;
  j["case_text"] = describe(e.the_case);
  j["case"] = case_to_json(e.the_case);
  j["seed"] = seed_to_hex(e.the_case.seed);
  j["verdict"] = verdict_name(r.verdict);
  j["class"] = r.verdict == Verdict::kFail ? Json(failure_class_name(r.failure)) : Json(nullptr);
  j["reason"] = r.reason;
  j["pass"] = pass_name(e.the_case.pass);
  if (!r.tensor.empty()) j["failed_tensor"] = r.tensor;
  Json ev = Json::array();
  for (const Evidence& x : r.evidence) ev.push_back({{"detector", x.detector}, {"detail", x.detail}});
  j["evidence"] = ev;
  Json worst = Json::array();
  for (const ElementReport& w : r.worst) worst.push_back(element_to_json(w));
  j["worst"] = worst;
  j["max_ratio"] = json_number(r.max_ratio);
  j["max_abs_err"] = json_number(r.max_abs_err);
  j["baseline_max_ratio"] = json_number(r.baseline_max_ratio);
  j["compared"] = r.compared;
  j["failed"] = r.failed;
  j["launch_ms"] = json_number(r.launch_ms);
  j["oracle_ms"] = json_number(r.oracle_ms);
  j["replay"] = e.replay_command;
  j["corpus"] = e.corpus_path.empty() ? Json(nullptr) : Json(e.corpus_path);
  j["heatmap"] = e.heatmap_path.empty() ? Json(nullptr) : Json(e.heatmap_path);
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
  Json results = Json::array();
  for (const RunEntry& e : r.entries) results.push_back(entry_to_json(e));
  j["results"] = results;
  return j;
}

}  // namespace attnfuzz
