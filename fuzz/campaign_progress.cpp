// campaign_progress.cpp - a campaign's statistics (the sum of the workers' stats files) and its progress
// line.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "fuzz/campaign_phases.h"

namespace attnfuzz::fuzz::campaign {

namespace {

// One worker process's shape pools (Worker::write_stats "compile_aware") added to the campaign's.
void add_compile_totals(const Json& pools, Aggregate& a) {
  for (const auto& [k, v] : pools.items()) {
    Aggregate::CompileTotals& t = a.compile[k];
    const std::string mode = v.value("mode", std::string());
    if (t.mode.empty() || mode == "pooled" || (mode == "off" && t.mode == "probe")) {
      t.mode = mode;
      t.why = v.value("why", std::string());
    }
    t.shapes += v.value("shapes", int64_t{0});
    t.checks += v.value("checks", int64_t{0});
    t.snapped += v.value("snapped", int64_t{0});
    t.refused += v.value("refused", int64_t{0});
    t.new_shape_s += v.value("new_shape_s", 0.0);
    t.check_s += v.value("check_s", 0.0);
    ++t.processes;
  }
}

}  // namespace

Aggregate read_stats(const fs::path& dir) {
  Aggregate a;
  std::vector<uint8_t> bits(kCounterBytes / 8, 0);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".json") continue;
    try {
      const Json j = Json::parse(read_all(e.path()));
      for (const auto& [k, v] : j.at("verdicts").items()) a.verdicts[k] += v.get<int64_t>();
      a.replayed += j.value("replayed", int64_t{0});
      a.check_s += j.value("check_s", 0.0);
      a.mutate_s += j.value("mutate_s", 0.0);
      if (j.contains("kernel_check_s"))
        for (const auto& [k, v] : j.at("kernel_check_s").items()) a.kernel_check_s[k] += v.get<double>();
      if (j.contains("phase_s"))
        for (const auto& [k, v] : j.at("phase_s").items()) a.phase_s[k] += v.get<double>();
      a.kernel_s += j.value("kernel_s", 0.0);
      a.buffer_calls += j.value("buffer_calls", int64_t{0});
      for (const auto& [k, v] : j.at("classes").items()) a.classes[k] += v.get<int64_t>();
      if (j.contains("refusals"))
        for (const auto& [k, v] : j.at("refusals").items()) a.refusals[k] += v.get<int64_t>();
      for (const auto& [k, m] : j.at("kernels").items())
        for (const auto& [v, n] : m.items()) a.kernels[k][v] += n.get<int64_t>();
      if (j.contains("by_kernel"))
        for (const auto& [k, rows] : j.at("by_kernel").items())
          for (const auto& [row, m] : rows.items())
            for (const auto& [v, n] : m.items()) a.by_kernel[k][row][v] += n.get<int64_t>();
      if (j.contains("compile_aware")) add_compile_totals(j.at("compile_aware"), a);
      const std::string hex = j.value("features", std::string());
      for (size_t i = 0; i + 1 < hex.size() && i / 2 < bits.size(); i += 2)
        bits[i / 2] |= static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16));
    } catch (const std::exception&) {
      // a stats file being replaced right now: counted next time
    }
  }
  static const char* hex = "0123456789abcdef";
  for (uint8_t b : bits) {
    a.features += __builtin_popcount(b);
    a.features_hex += hex[b >> 4];
    a.features_hex += hex[b & 15];
  }
  a.failing = a.verdicts.count("fail") ? a.verdicts["fail"] : 0;
  // Cases are counted from the verdicts (a worker's input counter runs one ahead while an input is in
  // flight).
  a.cases = 0;
  for (const auto& [v, n] : a.verdicts)
    if (v != "mps-suspect")  // not judged: re-run alone (--mps), that run counts
      (v == "unsupported" || v == "quarantined" ? a.skipped : a.cases) += n;
  return a;
}

Aggregate Progress::print(bool final, FuzzerProcesses& fuzzers, const ArtifactScanner& artifacts) {
  const Aggregate a = read_stats(p_.work / "stats");
  FuzzerLine lf = fuzzers.poll();
  deaths_ = count_deaths(lf, artifacts, p_);
  lf.crashes = deaths_.crashes;
  lf.timeouts = deaths_.hangs;
  const double t = clock_.elapsed();
  std::string cls;
  for (const auto& [c, n] : a.classes) cls += (cls.empty() ? ": " : ", ") + c + " " + std::to_string(n);
  const size_t distinct = read_failures(p_.failures).size();
  std::printf(
      "attn-fuzz [%5.0fs] cases %lld (%.0f/s)  failing %lld%s  distinct %zu  features %lld  corpus %lld"
      "  worker crashes %lld hangs %lld%s%s\n",
      t, (long long)a.cases, t > 0 ? a.cases / t : 0.0, (long long)a.failing, cls.c_str(), distinct,
      (long long)a.features, (long long)lf.corp, (long long)lf.crashes, (long long)lf.timeouts,
      a.skipped ? ("  skipped " + std::to_string(a.skipped)).c_str() : "", final ? "  (final)" : "");
  std::fflush(stdout);
  return a;
}

}  // namespace attnfuzz::fuzz::campaign
