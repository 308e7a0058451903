// markdown.cpp - the Markdown summary of a run: failures first, then a case x kernel verdict table.
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "attnfuzz/report.h"

namespace attnfuzz {

namespace {

std::string num(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string case_name(const Case& c) { return c.label.empty() ? describe(c) : c.label; }

std::string cell(const CheckResult& r) {
  switch (r.verdict) {
    case Verdict::kPass:
      return "pass";
    case Verdict::kFail:
      return std::string("**FAIL** ") + failure_class_name(r.failure);
    case Verdict::kUnsupported:
      return "-";
    case Verdict::kOutsideContract:
      return "n/c";
  }
  return "?";
}

std::string code(const std::string& s) {
  // Inline code span that survives backticks inside s.
  const std::string fence = s.find('`') == std::string::npos ? "`" : "``";
  std::string t = s;
  for (char& c : t)
    if (c == '\n' || c == '\r') c = ' ';
  return fence + (fence.size() > 1 ? " " + t + " " : t) + fence;
}

}  // namespace

std::string markdown_summary(const RunRecord& r) {
  std::ostringstream md;
  const RunCounts c = count(r);
  md << "# " << markdown_escape(r.tool.name) << " run: " << r.entries.size() << (r.entries.size() == 1 ? " check, " : " checks, ") << c.fail
     << (c.fail == 1 ? " failure" : " failures") << "\n\n";
  md << "- tool: " << markdown_escape(r.tool.name) << ' ' << markdown_escape(r.tool.version) << "\n";
  md << "- backend: " << markdown_escape(r.backend) << ", device: " << markdown_escape(r.device) << "\n";
  md << "- seed: " << seed_to_hex(r.seed);
  if (!r.started_at.empty()) md << ", started " << markdown_escape(r.started_at);
  if (r.wall_s > 0) md << ", wall time " << num(r.wall_s) << " s";
  md << "\n";
  if (!r.tool.command.empty()) md << "- command: " << code(r.tool.command) << "\n";
  md << "- verdicts: " << c.pass << " pass, " << c.fail << " fail, " << c.unsupported << " unsupported, "
     << c.outside_contract << " outside the fp32 contract\n\n";

  // Failures first, worst ratio first within a class order of appearance.
  std::vector<const RunEntry*> failures;
  for (const RunEntry& e : r.entries)
    if (e.result.verdict == Verdict::kFail) failures.push_back(&e);
  if (!failures.empty()) {
    md << "## Failures (" << failures.size() << ")\n\n";
    md << "| kernel | case | class | max ratio | failed / compared | replay | heatmap |\n";
    md << "|---|---|---|---|---|---|---|\n";
    for (const RunEntry* e : failures) {
      const CheckResult& x = e->result;
      md << "| " << markdown_escape(x.kernel) << " | " << markdown_escape(case_name(e->the_case)) << " | "
         << failure_class_name(x.failure) << (x.tensor.empty() ? "" : " (" + x.tensor + ")") << " | "
         << num(x.max_ratio) << " | "
         << (x.compared < 0 ? std::string("not recorded")
                            : std::to_string(x.failed) + " / " + std::to_string(x.compared))
         << " | " << (e->replay_command.empty() ? "" : code(e->replay_command)) << " | "
         << (e->heatmap_path.empty() ? "" : "[svg](" + e->heatmap_path + ")") << " |\n";
    }
    md << "\n";
    const size_t kDetails = 50;
    for (size_t i = 0; i < failures.size() && i < kDetails; ++i) {
      const RunEntry& e = *failures[i];
      const CheckResult& x = e.result;
      md << "### " << markdown_escape(x.kernel) << " x " << markdown_escape(case_name(e.the_case)) << ": "
         << failure_class_name(x.failure) << (x.tensor.empty() ? "" : " in " + x.tensor) << "\n\n";
      md << "- case: " << code(describe(e.the_case)) << "\n";
      if (!x.reason.empty()) md << "- reason: " << markdown_escape(x.reason) << "\n";
      md << "- max ratio " << num(x.max_ratio) << ", max |err| " << num(x.max_abs_err)
         << ", fp32 baseline ratio " << num(x.baseline_max_ratio) << "\n";
      for (const Evidence& ev : x.evidence)
        md << "- evidence (" << markdown_escape(ev.detector) << "): " << markdown_escape(ev.detail) << "\n";
      if (!e.replay_command.empty()) md << "- replay: " << code(e.replay_command) << "\n";
      if (!e.corpus_path.empty()) md << "- corpus file: " << code(e.corpus_path) << "\n";
      if (!e.heatmap_path.empty())
        md << "- heatmap: [" << markdown_escape(e.heatmap_path) << "](" << e.heatmap_path << ")\n";
      if (!x.worst.empty()) {
        md << "\n| tensor | b | h | s | d | expected | got | bound | ratio "
              "|\n|---|---|---|---|---|---|---|---|---|\n";
        for (size_t w = 0; w < x.worst.size() && w < 8; ++w) {
          const ElementReport& el = x.worst[w];
          md << "| " << (!el.tensor.empty() ? el.tensor : el.is_lse ? "lse" : "o") << " | " << el.b << " | " << el.h << " | " << el.s << " | "
             << (el.is_lse ? std::string("") : std::to_string(el.d)) << " | " << num(el.expected) << " | "
             << num(el.got) << " | " << num(el.bound) << " | " << num(el.ratio) << " |\n";
        }
      }
      md << "\n";
    }
    if (failures.size() > kDetails)
      md << "(" << failures.size() - kDetails << " more failures: see report.json)\n\n";
  }

  // Case x kernel table, cases in order of first appearance, kernels as columns.
  std::vector<std::string> kernels, cases;
  std::map<std::string, size_t> kernel_col, case_row;
  std::map<std::pair<size_t, size_t>, const RunEntry*> at;
  for (const RunEntry& e : r.entries) {
    const std::string k = e.result.kernel, cn = case_name(e.the_case);
    if (!kernel_col.count(k)) {
      kernel_col[k] = kernels.size();
      kernels.push_back(k);
    }
    if (!case_row.count(cn)) {
      case_row[cn] = cases.size();
      cases.push_back(cn);
    }
    at[{case_row[cn], kernel_col[k]}] = &e;
  }
  md << "## All results\n\n";
  md << "pass; **FAIL** class; - unsupported by the kernel; n/c outside the fp32 contract\n\n";
  md << "| case |";
  for (const std::string& k : kernels) md << ' ' << markdown_escape(k) << " |";
  md << "\n|---|";
  for (size_t i = 0; i < kernels.size(); ++i) md << "---|";
  md << "\n";
  for (size_t row = 0; row < cases.size(); ++row) {
    md << "| " << markdown_escape(cases[row]) << " |";
    for (size_t col = 0; col < kernels.size(); ++col) {
      auto it = at.find({row, col});
      md << ' ' << (it == at.end() ? std::string(" ") : cell(it->second->result)) << " |";
    }
    md << "\n";
  }
  return md.str();
}

}  // namespace attnfuzz
