// verdict_table.cpp - guards that speed-ups change no verdict: replays a committed table of (case, kernel,
// verdict, class, output hash) over the corpus and a few thousand codec-generated cases, and reports every
// difference.
//
// Usage: check_verdict_table --check TABLE [--corpus DIR] [--plugin SO]     exit 0 = every row identical
//        check_verdict_table --record TABLE [--corpus DIR] [--plugin SO]    (re)writes the table
// Rows: corpus files x (every built-in kernel + the planted plug-in's), and kGenerated fuzz inputs (the
// campaign's CaseDomain init + mutate, two shape limits) on the kernel the input picks, as a campaign worker
// does. Each row checks the case (cpu backend, shuffled order seed 1, in process) and classifies failures;
// out_hash covers the output bits (O and LSE), canary and unwritten counts, compared / failed counts and the
// max ratio's bits. case_hash covers the case text and its generated values: when it differs, case
// generation itself changed (a deliberate change to the codec or the value generator: re-record the table
// with --record and say so in the commit).
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "attnfuzz/corpus.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "check/classify.h"
#include "check/runner.h"
#include "fuzz/codec.h"
#include "fuzz/worker.h"

using namespace attnfuzz;
namespace fs = std::filesystem;

namespace {

constexpr int kGenerated = 2000;        // small shapes (S, D <= 32)
constexpr int kGeneratedDefault = 300;  // the campaign's default limits

struct Fnv {
  uint64_t h = fuzz::kFnvOffset;
  void bytes(const void* p, size_t n) { h = fuzz::fnv1a(p, n, h); }
  template <class T>
  void pod(const T& x) {
    bytes(&x, sizeof x);
  }
  void str(const std::string& s) { bytes(s.data(), s.size()); }
};

std::string hex(uint64_t h) {
  char b[20];
  std::snprintf(b, sizeof b, "%016" PRIx64, h);
  return b;
}

std::string case_hash(const PreparedCase& pc) {
  Fnv f;
  f.str(describe(pc.the_case()));
  f.pod(pc.the_case().seed);
  const Tensors& t = pc.tensors();
  for (const auto* v : {&t.q, &t.k, &t.v}) f.bytes(v->data(), v->size() * sizeof(float));
  return hex(f.h);
}

struct Row {
  std::string id, kernel, case_hash, verdict, cls, out_hash;
  std::string line() const {
    return id + "\t" + kernel + "\t" + case_hash + "\t" + verdict + "\t" + cls + "\t" + out_hash;
  }
};

Row check_row(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& run,
              const std::string& id, const std::vector<std::string>& plugins) {
  Judged j = check_case(dev, k, pc, run);
  if (j.result.verdict == Verdict::kFail) {
    ClassifyOptions co;
    co.plugins = plugins;
    classify_failure(dev, k, pc, run, j, co);
  }
  const LaunchOutcome& lo = j.outcome;
  Fnv f;
  f.bytes(lo.o.data(), lo.o.size() * sizeof(float));
  f.bytes(lo.lse.data(), lo.lse.size() * sizeof(float));
  f.pod(lo.canary_words);
  f.pod(lo.unwritten);
  f.pod(j.result.compared);
  f.pod(j.result.failed);
  f.pod(j.result.max_ratio);
  return {id,
          k.kernel.name,
          case_hash(pc),
          verdict_name(j.result.verdict),
          failure_class_name(j.result.failure),
          hex(f.h)};
}

int usage(const std::string& why) {
  std::fprintf(stderr, "check_verdict_table: %s\n", why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode, table, corpus_dir;
  std::vector<std::string> plugins;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage(a + " needs a value");
    if (a == "--check" || a == "--record")
      mode = a, table = argv[++i];
    else if (a == "--corpus")
      corpus_dir = argv[++i];
    else if (a == "--plugin")
      plugins.push_back(argv[++i]);
    else
      return usage("unknown argument " + a);
  }
  if (mode.empty()) return usage("--check TABLE or --record TABLE");
  try {
    for (const auto& p : plugins) Registry::global().load_plugin(p);
    DeviceOptions d;
    d.order = ThreadOrder::kShuffle;
    d.order_seed = 1;
    d.workers = 1;
    d.isolate = false;
    auto dev = open_device("cpu", d);
    const auto kernels = Registry::global().select(Backend::kCpu, "all");
    RunOptions run;
    run.pool = std::make_shared<BufferPool>(*dev);  // as a campaign worker runs (fuzz/worker.cpp)
    run.oracle.threads = 1;
    std::vector<Row> rows;
    // 1. The corpus, every file on every kernel.
    std::vector<fs::path> files;
    if (!corpus_dir.empty())
      for (const auto& e : fs::recursive_directory_iterator(corpus_dir))
        if (e.path().extension() == ".case") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& p : files) {
      const CorpusFile cf = read_corpus_file(p);
      PreparedCase pc(cf.the_case);
      const std::string id = fs::relative(p, corpus_dir).string();
      for (const KernelEntry* k : kernels)
        if (unsupported_reason(k->kernel, pc.problem()).empty())
          rows.push_back(check_row(*dev, *k, pc, run, id, plugins));
    }
    // 2. Generated inputs: the custom mutator's init + mutate chains, on the kernel each input picks.
    for (int set = 0; set < 2; ++set) {
      fuzz::FuzzLimits lim;
      if (set == 0) lim.max_seq = lim.max_dim = 32;
      const fuzz::CaseDomain dom(lim);
      Rng rng(20261201 + set, 0x7674);
      fuzz::FuzzInput in;
      const int n = set == 0 ? kGenerated : kGeneratedDefault;
      for (int i = 0; i < n; ++i) {
        if (i % 8 == 0) in = dom.init(rng);
        dom.mutate(in, rng);
        const std::vector<uint8_t> bytes = fuzz::encode(in, lim);
        const fuzz::FuzzInput x = fuzz::decode(bytes.data(), bytes.size(), lim);
        PreparedCase pc(x.the_case);
        for (size_t j = 0; j < kernels.size(); ++j) {
          const KernelEntry* k = kernels[(x.kernel + j) % kernels.size()];
          if (!unsupported_reason(k->kernel, pc.problem()).empty()) continue;
          rows.push_back(check_row(*dev, *k, pc, run,
                                   (set ? "gen-default-" : "gen-small-") + std::to_string(i), plugins));
          break;
        }
      }
    }
    if (mode == "--record") {
      std::ofstream f(table);
      f << "# id\tkernel\tcase_hash\tverdict\tclass\tout_hash   (tests/check/verdict_table.cpp --record)\n";
      for (const Row& r : rows) f << r.line() << "\n";
      if (!f) return usage("cannot write " + table);
      std::map<std::string, int> v;
      for (const Row& r : rows) ++v[r.verdict + "/" + r.cls];
      std::printf("recorded %zu rows in %s:", rows.size(), table.c_str());
      for (const auto& [k, n] : v) std::printf(" %s %d", k.c_str(), n);
      std::printf("\n");
      return 0;
    }
    std::ifstream f(table);
    if (!f) return usage("cannot read " + table);
    std::vector<std::string> want;
    for (std::string line; std::getline(f, line);)
      if (!line.empty() && line[0] != '#') want.push_back(line);
    int diffs = 0;
    if (want.size() != rows.size())
      std::printf("row count differs: table %zu, now %zu\n", want.size(), rows.size()), ++diffs;
    for (size_t i = 0; i < std::min(want.size(), rows.size()); ++i) {
      if (want[i] == rows[i].line()) continue;
      if (++diffs <= 20)
        std::printf("differs:\n  table %s\n  now   %s\n", want[i].c_str(), rows[i].line().c_str());
    }
    std::printf("%zu rows, %d difference(s)\n", rows.size(), diffs);
    return diffs ? 1 : 0;
  } catch (const std::exception& e) {
    return usage(e.what());
  }
}
