// files.cpp - writing report files, file names and text escaping shared by the writers.
#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "attnfuzz/report.h"

namespace attnfuzz {

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (c < 0x20 && c != '\n' && c != '\t' && c != '\r')
          out += '?';  // not allowed in XML 1.0
        else
          out += static_cast<char>(c);
    }
  }
  return out;
}

std::string markdown_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|' || c == '*' || c == '_' || c == '`' || c == '<' || c == '>' || c == '[' || c == ']' ||
        c == '\\')
      out += '\\';
    out += (c == '\n' || c == '\r') ? ' ' : c;
  }
  return out;
}

void write_text_file(const std::filesystem::path& path, const std::string& text) {
  std::error_code ec;
  if (path.has_parent_path()) {
    std::filesystem::create_directories(path.parent_path(), ec);
    if (ec) throw ReportError(path.parent_path().string() + ": cannot create directory: " + ec.message());
  }
  if (std::string why = write_file_atomically(path, text); !why.empty()) throw ReportError(why);  // whole or not at all
}

ReportPaths write_reports(const RunRecord& r, const std::filesystem::path& dir) {
  ReportPaths p{dir / "report.json", dir / "summary.md", dir / "junit.xml"};
  write_text_file(p.json, report_json_text(report_to_json(r)));
  write_text_file(p.markdown, markdown_summary(r));
  write_text_file(p.junit, junit_xml(r));
  return p;
}

std::string heatmap_file_name(const std::string& kernel, const Case& c) {
  std::string safe;
  for (char ch : kernel)
    safe += (std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '.') ? ch : '_';
  CorpusFile f;
  f.the_case = c;
  return "heatmap-" + safe + "-" + case_hash(f) + ".svg";
}

}  // namespace attnfuzz
