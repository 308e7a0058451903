// sanitizers.cpp - external race / memory checkers on the failing case: the TSan build of attn-check (cpu),
// compute-sanitizer (nvidia).
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "attnfuzz/corpus.h"
#include "check/detectors/detectors.h"

#ifndef ATTNFUZZ_TSAN_ATTN_CHECK
#define ATTNFUZZ_TSAN_ATTN_CHECK "build/tsan/bin/attn-check"
#endif

namespace fs = std::filesystem;

namespace attnfuzz {

std::string default_tsan_binary() { return ATTNFUZZ_TSAN_ATTN_CHECK; }

namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return {};
  return s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
}

// Line n (1-based) of a file, trimmed; empty when unreadable.
std::string source_line(const std::string& path, int n) {
  std::ifstream in(path);
  std::string line;
  for (int i = 1; in && std::getline(in, line); ++i)
    if (i == n) return trim(line);
  return {};
}

// Names declared __shared__ in a source file.
std::set<std::string> shared_names(const std::string& path) {
  static std::map<std::string, std::set<std::string>> cache;
  auto it = cache.find(path);
  if (it != cache.end()) return it->second;
  std::set<std::string> names;
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  static const std::regex decl(R"(__shared__\s+[A-Za-z_][\w:<>, ]*?\s+([A-Za-z_]\w*)\s*(\[|;|=))");
  for (auto m = std::sregex_iterator(text.begin(), text.end(), decl); m != std::sregex_iterator(); ++m) {
    names.insert((*m)[1]);
    // further declarators on the same line: "row_m[BM], row_l[BM]"
    const size_t end = text.find(';', static_cast<size_t>(m->position(0)));
    const std::string rest =
        text.substr(static_cast<size_t>(m->position(0)), end - static_cast<size_t>(m->position(0)));
    static const std::regex more(R"(,\s*([A-Za-z_]\w*)\s*(\[|$|=))");
    for (auto k = std::sregex_iterator(rest.begin(), rest.end(), more); k != std::sregex_iterator(); ++k)
      names.insert((*k)[1]);
  }
  cache[path] = names;
  return names;
}

std::set<std::string> identifiers(const std::string& code) {
  std::set<std::string> ids;
  static const std::regex id(R"([A-Za-z_]\w*)");
  for (auto m = std::sregex_iterator(code.begin(), code.end(), id); m != std::sregex_iterator(); ++m)
    ids.insert(m->str());
  return ids;
}

}  // namespace

std::vector<TsanRace> parse_tsan_report(const std::string& text) {
  std::vector<TsanRace> races;
  std::istringstream in(text);
  std::string line;
  static const std::regex access(R"(^\s*(Previous )?(atomic )?(read|write) of size (\d+))",
                                 std::regex::icase);
  static const std::regex frame(R"(^\s*#\d+ .*? ((/|\./)?[^ ()]+\.[A-Za-z]+):(\d+)(:\d+)?( |$))");
  static const std::regex global(R"(Location is global '([^']+)')");
  bool in_block = false;
  int which = -1;  // 0 current access, 1 previous access
  TsanRace r;
  std::string path[2];
  auto finish = [&]() {
    if (!in_block) return;
    std::set<std::string> ids[2];
    for (int i = 0; i < 2; ++i) ids[i] = identifiers(i ? r.previous_code : r.code);
    if (r.variable.empty() || r.variable.rfind("TLS", 0) == 0 || r.variable.rfind("heap", 0) == 0) {
      std::string pick;
      for (int i = 0; i < 2 && pick.empty(); ++i) {
        if (path[i].empty()) continue;
        for (const std::string& n : shared_names(path[i]))
          if (ids[0].count(n) && ids[1].count(n)) pick = n;
      }
      for (int i = 0; i < 2 && pick.empty(); ++i)
        for (const std::string& n : shared_names(path[i]))
          if (ids[i].count(n)) pick = n;
      if (!pick.empty()) r.variable = "__shared__ " + pick;
    }
    races.push_back(r);
    in_block = false;
  };
  while (std::getline(in, line)) {
    if (line.find("WARNING: ThreadSanitizer: data race") != std::string::npos) {
      finish();
      in_block = true;
      which = -1;
      r = TsanRace{};
      path[0].clear();
      path[1].clear();
      continue;
    }
    if (!in_block) continue;
    if (line.rfind("SUMMARY: ThreadSanitizer", 0) == 0 || line.rfind("==================", 0) == 0) {
      finish();
      continue;
    }
    std::smatch m;
    if (std::regex_search(line, m, access)) {
      which = m[1].matched ? 1 : 0;
      std::string a = std::string(m[2].matched ? "atomic " : "") + m[3].str() + " of size " + m[4].str();
      for (char& ch : a) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      (which ? r.previous_access : r.access) = a;
      continue;
    }
    if (std::regex_search(line, m, global)) {
      r.variable = m[1];
      continue;
    }
    if (line.find("Location is ") != std::string::npos) {
      const std::string loc = trim(line.substr(line.find("Location is ") + 12));
      if (r.variable.empty()) r.variable = loc;
      which = -1;
      continue;
    }
    if (which >= 0 && std::regex_search(line, m, frame)) {
      std::string& site = which ? r.previous_site : r.site;
      if (!site.empty()) continue;  // innermost frame with a source line only
      const std::string file = m[1], base = fs::path(file).filename().string();
      // Frames inside the emulator or the C++ library are not the kernel's lines.
      if (base == "emulator.cpp" || base == "hip_cpu.h" || file.find("/usr/") == 0) continue;
      site = base + ":" + m[3].str();
      path[which] = file;
      (which ? r.previous_code : r.code) = source_line(file, std::stoi(m[3]));
    }
  }
  finish();
  return races;
}

bool is_emulator_bookkeeping(const TsanRace& r) {
  return r.variable.rfind("TLS", 0) == 0 && (r.code.find("hipLaunchKernelGGL") != std::string::npos ||
                                             r.previous_code.find("hipLaunchKernelGGL") != std::string::npos);
}

std::string describe(const TsanRace& r) {
  auto side = [](const std::string& acc, const std::string& site, const std::string& code) {
    return (acc.empty() ? std::string("access") : acc) + " at " + (site.empty() ? "?" : site) +
           (code.empty() ? "" : " `" + code + "`");
  };
  return "data race on " + (r.variable.empty() ? std::string("?") : r.variable) + ": " +
         side(r.access, r.site, r.code) + " vs previous " +
         side(r.previous_access, r.previous_site, r.previous_code);
}

SanitizerReport parse_compute_sanitizer(const std::string& tool, const std::string& text) {
  SanitizerReport rep;
  rep.tool = tool;
  std::istringstream in(text);
  std::string line;
  static const std::regex summary(R"(ERROR SUMMARY: (\d+) error)");
  // racecheck (CUDA 13) ends with this line only; its warnings are hazards too (e.g. write-after-read).
  static const std::regex race_summary(
      R"(RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, (\d+) warnings?\))");
  int race_hazards = -1;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, summary)) {
      rep.errors = std::stoi(m[1]);
      continue;
    }
    if (std::regex_search(line, m, race_summary)) {
      race_hazards = std::stoi(m[1]) + std::stoi(m[2]);
      continue;
    }
    if (line.rfind("=========", 0) != 0) continue;
    const std::string body = trim(line.substr(9));
    if (body.rfind("Error", 0) == 0 || body.rfind("Invalid", 0) == 0 ||
        body.find("Race reported") != std::string::npos || body.find("hazard") != std::string::npos ||
        body.find("Barrier error") != std::string::npos) {
      if (rep.findings.size() < 4) rep.findings.push_back(body);
    } else if (!rep.findings.empty() && body.rfind("at ", 0) == 0 &&
               rep.findings.back().find(" in ") == std::string::npos) {
      rep.findings.back() += " " + body;  // the "at kernel+0x.. in file:line" line of the finding above
    }
  }
  if (race_hazards >= 0) rep.errors = std::max(rep.errors, race_hazards);
  return rep;
}

FailureClass sanitizer_class(const std::vector<SanitizerReport>& reports) {
  int rank = 99;  // best class found: 0 oob-write, 1 oob-read, 2 barrier-race
  for (const SanitizerReport& rep : reports) {
    if (rep.errors <= 0) continue;
    int r = 2;  // racecheck / synccheck: shared-memory hazards and barrier misuse
    if (rep.tool == "memcheck") {
      r = 99;
      for (const std::string& x : rep.findings) {
        if (x.find("write") != std::string::npos) r = std::min(r, 0);
        if (x.find("read") != std::string::npos) r = std::min(r, 1);
      }
    }
    rank = std::min(rank, r);
  }
  return rank == 0   ? FailureClass::kOobWrite
         : rank == 1 ? FailureClass::kOobRead
         : rank == 2 ? FailureClass::kBarrierRace
                     : FailureClass::kNone;
}

namespace detect {

namespace {
bool executable(const std::string& path) { return !path.empty() && access(path.c_str(), X_OK) == 0; }

std::string plugin_args(const std::vector<std::string>& plugins) {
  std::string s;
  for (const auto& p : plugins) s += " --plugin " + shell_quote(p);
  return s;
}
}  // namespace

Finding tsan(Context& c) {
  Finding f;
  if (c.dev.backend() != Backend::kCpu) return f;
  std::string bin = c.co.tsan_binary;
  if (bin.empty())
    if (const char* e = std::getenv("ATTNFUZZ_TSAN_ATTN_CHECK")) bin = e;
  if (bin.empty()) bin = default_tsan_binary();
  if (!executable(bin)) {
    f.evidence.push_back(
        {"tsan", "not run: no ThreadSanitizer build of attn-check at " + bin +
                     " (cmake --preset tsan && cmake --build --preset tsan --target attn-check; or "
                     "--tsan-binary / $ATTNFUZZ_TSAN_ATTN_CHECK)"});
    return f;
  }
  std::vector<std::string> plugins = c.co.tsan_plugins;
  std::string uninstrumented;
  if (plugins.empty())
    for (const std::string& p : c.co.plugins) {
      const fs::path twin = fs::path(bin).parent_path().parent_path() / "lib" / fs::path(p).filename();
      std::error_code ec;
      if (fs::exists(twin, ec) && fs::absolute(twin, ec) != fs::absolute(p, ec)) {
        plugins.push_back(twin.string());
      } else {
        plugins.push_back(p);
        uninstrumented += (uninstrumented.empty() ? "" : ", ") + p;
      }
    }
  const std::string file = case_file(c);
  if (file.empty()) {
    f.evidence.push_back({"tsan", "not run: cannot write the case file"});
    return f;
  }
  const DeviceOptions& d = c.dev.options();
  const std::string out_dir = (fs::path(file).parent_path() / "tsan-out").string();
  const std::string cmd = "TSAN_OPTIONS='halt_on_error=0 report_signal_unsafe=0 history_size=4' " +
                          shell_quote(bin) + " --replay " + shell_quote(file) + " --kernel " +
                          shell_quote(c.k.kernel.name) + " --backend cpu --no-isolate --workers 1 --order " +
                          thread_order_name(d.order) + " --order-seed " + std::to_string(d.order_seed) +
                          " --oracle-rows 1 --no-reports --quiet --out " + shell_quote(out_dir) +
                          plugin_args(plugins);
  const auto t0 = std::chrono::steady_clock::now();
  std::string output;
  const int rc = run_command(cmd, c.co.tool_timeout_s, output);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rc == 124 || rc == 2 || rc == 127 || rc < 0) {
    f.evidence.push_back({"tsan", fmt("the TSan run failed (exit %d after %.1f s): ", rc, s) +
                                      output.substr(0, std::min<size_t>(output.size(), 300))});
    return f;
  }
  std::vector<TsanRace> races;
  int bookkeeping = 0;
  for (TsanRace& r : parse_tsan_report(output)) {
    if (is_emulator_bookkeeping(r))
      ++bookkeeping;
    else
      races.push_back(std::move(r));
  }
  std::vector<std::string> seen;
  for (const TsanRace& r : races) {
    const std::string key =
        r.site < r.previous_site ? r.site + "|" + r.previous_site : r.previous_site + "|" + r.site;
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    if (seen.size() <= 4) f.evidence.push_back({"tsan", describe(r)});
  }
  if (!races.empty()) {
    f.fired = true;
    f.cls = FailureClass::kBarrierRace;
    f.evidence.push_back(
        {"tsan",
         fmt("ThreadSanitizer: %zu data race report(s), %zu distinct line pair(s), %.1f s (", races.size(),
             seen.size(), s) +
             bin + ")" +
             (bookkeeping ? fmt("; %d report(s) on the emulator's thread-local ids ignored", bookkeeping)
                          : std::string())});
  } else {
    f.evidence.push_back(
        {"tsan",
         fmt("ThreadSanitizer: no data race reported (%.1f s)", s) +
             (uninstrumented.empty() ? std::string()
                                     : "; note: plug-in(s) " + uninstrumented +
                                           " have no TSan-built twin in the TSan build's lib/: their code "
                                           "is not instrumented (--tsan-plugin)")});
  }
  return f;
}

Finding compute_sanitizer(Context& c) {
  if (c.dev.backend() != Backend::kNvidia) return {};
  return compute_sanitizer_tools(c);
}

Finding compute_sanitizer_tools(Context& c) {
  Finding f;
  std::string found;
  if (run_command("command -v " + shell_quote(c.co.compute_sanitizer_binary), 10, found) != 0) {
    f.evidence.push_back(
        {"compute-sanitizer", "not run: " + c.co.compute_sanitizer_binary + " is not on PATH"});
    return f;
  }
  std::string self = c.co.self_binary;
  if (self.empty()) {
    std::error_code ec;
    self = fs::read_symlink("/proc/self/exe", ec).string();
  }
  const std::string file = case_file(c);
  if (file.empty() || self.empty()) {
    f.evidence.push_back({"compute-sanitizer", "not run: cannot write the case file or find attn-check"});
    return f;
  }
  const std::string out_dir = (fs::path(file).parent_path() / "cs-out").string();
  std::vector<SanitizerReport> reports;
  for (const char* tool : {"racecheck", "synccheck", "memcheck"}) {
    const std::string cmd = shell_quote(c.co.compute_sanitizer_binary) + " --tool " + tool + " " +
                            shell_quote(self) + " --replay " + shell_quote(file) + " --kernel " +
                            shell_quote(c.k.kernel.name) + " --backend " + backend_name(c.dev.backend()) +
                            " --oracle-rows 1 --no-reports --quiet --no-classify --out " +
                            shell_quote(out_dir) + plugin_args(c.co.plugins);
    const auto t0 = std::chrono::steady_clock::now();
    std::string output;
    const int rc = run_command(cmd, c.co.tool_timeout_s, output);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    SanitizerReport rep = parse_compute_sanitizer(tool, output);
    std::string detail =
        fmt("%s: %s error(s) in %.1f s", tool, rep.errors < 0 ? "?" : std::to_string(rep.errors).c_str(), s);
    if (rc == 124) detail += " (timed out)";
    for (const std::string& x : rep.findings) detail += "; " + x;
    f.evidence.push_back({"compute-sanitizer", detail});
    reports.push_back(std::move(rep));
  }
  const FailureClass cls = sanitizer_class(reports);
  if (cls != FailureClass::kNone) {
    f.fired = true;
    f.cls = cls;
  }
  return f;
}

}  // namespace detect
}  // namespace attnfuzz
