// junit.cpp - JUnit XML for CI systems: one testsuite per kernel, one testcase per case.
//
// Written with an ostream and xml_escape (report/files.cpp), not an XML library (tinyxml2, pugixml): the
// document is three fixed levels of elements written once, in order, which a library's printer would spell
// element by element in as many lines; xml_escape stays anyway for the SVG heatmaps (report/heatmap.cpp), and
// the one thing beyond entity escaping that XML 1.0 needs here, replacing control characters below 0x20
// but tab, newline and return (forbidden even as character references; a kernel's reason may carry them), is
// xml_escape's too. A library
// would add a dependency (install-deps.sh, offline-build.sh, CMake) without removing a line of that.
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "attnfuzz/report.h"

namespace attnfuzz {

std::string junit_xml(const RunRecord& r) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<const RunEntry*>> by_kernel;
  for (const RunEntry& e : r.entries) {
    auto& v = by_kernel[e.result.kernel];
    if (v.empty()) order.push_back(e.result.kernel);
    v.push_back(&e);
  }
  auto secs = [](double ms) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", std::isfinite(ms) && ms > 0 ? ms / 1000.0 : 0.0);
    return std::string(buf);
  };
  const RunCounts total = count(r);
  std::ostringstream x;
  x << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  x << "<testsuites name=\"" << xml_escape(r.tool.name) << "\" tests=\"" << r.entries.size()
    << "\" failures=\"" << total.fail << "\" errors=\"0\" skipped=\""
    << total.unsupported + total.outside_contract << "\" time=\"" << secs(r.wall_s * 1000) << "\">\n";
  for (const std::string& kernel : order) {
    const auto& entries = by_kernel[kernel];
    int64_t fail = 0, skipped = 0;
    double ms = 0;
    for (const RunEntry* e : entries) {
      fail += e->result.verdict == Verdict::kFail;
      skipped += e->result.verdict == Verdict::kUnsupported || e->result.verdict == Verdict::kOutsideContract;
      ms += e->result.launch_ms + e->result.oracle_ms;
    }
    x << "  <testsuite name=\"" << xml_escape(kernel) << "\" tests=\"" << entries.size() << "\" failures=\""
      << fail << "\" errors=\"0\" skipped=\"" << skipped << "\" time=\"" << secs(ms) << "\">\n";
    x << "    <properties>\n";
    x << "      <property name=\"backend\" value=\"" << xml_escape(r.backend) << "\"/>\n";
    x << "      <property name=\"device\" value=\"" << xml_escape(r.device) << "\"/>\n";
    x << "      <property name=\"tool\" value=\"" << xml_escape(r.tool.name + " " + r.tool.version)
      << "\"/>\n";
    x << "      <property name=\"seed\" value=\"" << seed_to_hex(r.seed) << "\"/>\n";
    // Issue 30: the failures by input tier (docs/semantics.md), ordinary first: what a maintainer reads
    // first.
    int64_t tiers[4] = {0, 0, 0, 0};
    for (const RunEntry* e : entries)
      if (e->result.verdict == Verdict::kFail) ++tiers[static_cast<int>(input_tier(e->the_case))];
    x << "      <property name=\"failures-by-tier\" value=\"" << input_tier_counts(tiers) << "\"/>\n";
    x << "    </properties>\n";
    for (const RunEntry* e : entries) {
      const CheckResult& c = e->result;
      const std::string name = e->the_case.label.empty() ? describe(e->the_case) : e->the_case.label;
      x << "    <testcase classname=\"attnfuzz." << xml_escape(kernel) << "\" name=\"" << xml_escape(name)
        << "\" time=\"" << secs(c.launch_ms + c.oracle_ms) << "\">\n";
      if (c.verdict == Verdict::kFail) {
        char ratio[32];
        std::snprintf(ratio, sizeof ratio, "%.3g", c.max_ratio);
        const std::string msg = std::string(failure_class_name(c.failure)) + ": " +
                                (c.reason.empty() ? "max error/bound ratio " + std::string(ratio) : c.reason);
        x << "      <failure type=\"" << failure_class_name(c.failure) << "\" message=\"" << xml_escape(msg)
          << "\">";
        std::ostringstream body;
        body << "tier: " << input_tier_name(input_tier(e->the_case)) << "\n";
        body << "case: " << describe(e->the_case) << "\n";
        body << "max ratio " << ratio << ", " << c.failed << " of " << c.compared
             << " elements over the bound\n";
        for (const Evidence& ev : c.evidence) body << ev.detector << ": " << ev.detail << "\n";
        for (size_t i = 0; i < c.worst.size() && i < 5; ++i) {
          const ElementReport& w = c.worst[i];
          char line[256];  // the element named as the reasons name it (one index order everywhere)
          std::snprintf(line, sizeof line, "%s expected %.9g got %.9g bound %.3g ratio %.3g\n",
                        element_name(w).c_str(), w.expected, w.got, w.bound, w.ratio);
          body << line;
        }
        if (!e->replay_command.empty()) body << "replay: " << e->replay_command << "\n";
        x << xml_escape(body.str()) << "</failure>\n";
      } else if (c.verdict != Verdict::kPass) {
        x << "      <skipped message=\""
          << xml_escape(std::string(verdict_name(c.verdict)) + (c.reason.empty() ? "" : ": " + c.reason))
          << "\"/>\n";
      }
      x << "    </testcase>\n";
    }
    x << "  </testsuite>\n";
  }
  x << "</testsuites>\n";
  return x.str();
}

}  // namespace attnfuzz
