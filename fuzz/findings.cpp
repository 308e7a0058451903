// findings.cpp - see findings.h: a failure's input pattern, and distinct failures grouped by signature and pattern.
#include "fuzz/findings.h"

#include "attnfuzz/report.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

namespace attnfuzz::fuzz {

std::string input_pattern(const Case& c) {
  const Problem& p = c.problem;
  std::string out = input_tier_name(input_tier(c));
  out += p.mask_kind == AF_MASK_NONE ? "; no mask" : p.mask_kind == AF_MASK_CAUSAL ? "; causal" : "; window";
  if (p.variants) out += "; " + variant_names(p.variants);
  if (c.pass != Pass::kFwd) out += std::string("; ") + pass_name(c.pass);
  std::set<std::string> specials;  // by kind, tensor and placement (positions and counts are the minimizer's)
  for (const SpecialValue& sv : c.values.specials) {
    if (sv.count == 0) continue;
    SpecialValue k = sv;
    k.count = 1;
    if (k.placement == Placement::kAt) k.b = k.h = k.s = k.d = 0;
    std::string t = to_string(k);
    if (k.placement == Placement::kAt) t = t.substr(0, t.find(":at=")) + ":at";
    specials.insert(t);
  }
  for (const std::string& s : specials) out += "; " + s;
  return out;
}

std::string implementation_of(const RecordedVerdict& v) {
  if (v.backend != "adapter") return {};
  const size_t open = v.device.find(" ("), end = v.device.find(", protocol", open);
  if (open == std::string::npos || end == std::string::npos) return {};
  return v.device.substr(open + 2, end - open - 2);
}

std::vector<Finding> group_findings(const std::vector<const CorpusFile*>& failures) {
  std::vector<Finding> out;
  std::map<std::tuple<std::string, std::string, std::string>, size_t> at;
  for (size_t i = 0; i < failures.size(); ++i) {
    const CorpusFile& f = *failures[i];
    if (!f.verdict) continue;
    const std::string sig = f.verdict->signature.empty() ? failure_class_name(f.verdict->failure) : f.verdict->signature;
    const auto key = std::make_tuple(sig, input_pattern(f.the_case), implementation_of(*f.verdict));
    auto it = at.find(key);
    if (it == at.end()) {
      it = at.emplace(key, out.size()).first;
      out.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), {}, {}});
    }
    Finding& g = out[it->second];
    g.members.push_back(i);
    if (std::find(g.kernels.begin(), g.kernels.end(), f.verdict->kernel) == g.kernels.end())
      g.kernels.push_back(f.verdict->kernel);
  }
  std::stable_sort(out.begin(), out.end(), [](const Finding& a, const Finding& b) {
    return a.kernels.size() != b.kernels.size() ? a.kernels.size() > b.kernels.size() : a.members[0] < b.members[0];
  });
  return out;
}

Json findings_json(const std::vector<Finding>& findings, const std::vector<std::string>& file_names) {
  Json out = Json::array();
  for (const Finding& g : findings) {
    Json files = Json::array();
    for (size_t i : g.members) files.push_back(file_names[i]);
    Json x = {{"signature", g.signature}, {"pattern", g.pattern}, {"kernels", g.kernels}, {"failures", files}};
    if (!g.implementation.empty()) x["implementation"] = g.implementation;
    out.push_back(std::move(x));
  }
  return out;
}

std::string findings_markdown(const std::vector<Finding>& findings) {
  if (findings.empty()) return {};
  std::string md =
      "## Findings\n\nThe distinct failures of each implementation grouped by class, deciding evidence and minimal "
      "input pattern (one root cause as far as the evidence tells), those across the most kernels first.\n\n"
      "| signature | input pattern | kernels | failures |\n|---|---|---|---|\n";
  for (const Finding& g : findings) {
    std::string ks;
    for (const std::string& k : g.kernels) ks += (ks.empty() ? "" : ", ") + k;
    if (!g.implementation.empty()) ks = g.implementation + ": " + ks;
    md += "| " + markdown_escape(g.signature) + " | " + markdown_escape(g.pattern) + " | " + markdown_escape(ks) +
          " | " + std::to_string(g.members.size()) + " |\n";
  }
  return md + "\n";
}

std::string finding_line(const Finding& f, size_t max_kernels) {
  std::string ks;
  for (size_t i = 0; i < f.kernels.size() && i < max_kernels; ++i) ks += (i ? ", " : "") + f.kernels[i];
  if (f.kernels.size() > max_kernels) ks += ", ...";
  const size_t n = f.kernels.size(), m = f.members.size();
  const std::string impl = f.implementation.empty() ? "" : " [" + f.implementation + "]";
  return f.signature + " on " + f.pattern + impl + ": " + ks + " (" + std::to_string(n) +
         (n == 1 ? " kernel, " : " kernels, ") + std::to_string(m) + (m == 1 ? " failure)" : " failures)");
}

}  // namespace attnfuzz::fuzz
