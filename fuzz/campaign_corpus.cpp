// campaign_corpus.cpp - a campaign's corpus in (corpus and seed .case files become libFuzzer inputs) and
// out (new libFuzzer inputs become .case files).
#include <algorithm>
#include <cstdio>
#include <fstream>

#include "fuzz/campaign_phases.h"

namespace attnfuzz::fuzz::campaign {

namespace {

std::string hex16(uint64_t h) {
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  write_file_atomically(p, {reinterpret_cast<const char*>(b.data()), b.size()});
}

// The kernel index (into the selection) an input should select for a corpus case: its fuzz label or its
// recorded kernel, else none (-1).
int kernel_index_of(const CorpusFile& cf, const Kernels& ks) {
  std::string name;
  if (cf.verdict) name = cf.verdict->kernel;
  if (cf.the_case.label.rfind("fuzz-", 0) == 0) name = cf.the_case.label.substr(5);
  for (size_t i = 0; i < ks.size(); ++i)
    if (name == ks[i]->kernel.name) return static_cast<int>(i);
  return -1;
}

class Loader {
 public:
  Loader(const Paths& p, const Kernels& kernels, const FuzzLimits& lim)
      : p_(p), kernels_(kernels), lim_(lim) {}
  void load_dir(const fs::path& dir, bool is_seed);
  CorpusIn in;

 private:
  void add_input(const FuzzInput& input);
  const Paths& p_;
  const Kernels& kernels_;
  const FuzzLimits& lim_;
};

void Loader::add_input(const FuzzInput& input) {
  const auto b = encode(input, lim_);
  const FuzzInput back = decode(b.data(), b.size(), lim_);
  const auto nb = encode(back, lim_);  // normalised into the fuzz limits
  const std::string name = hex16(hash64(std::string(nb.begin(), nb.end())));
  if (in.known.insert(name).second) write_bytes(p_.inputs / name, nb);
}

void Loader::load_dir(const fs::path& dir, bool is_seed) {
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == kCaseFileExtension) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    CorpusFile cf;
    try {
      cf = read_corpus_file(f);
    } catch (const CorpusError& e) {
      std::fprintf(stderr, "attn-fuzz: skipping corpus file: %s\n", e.what());
      ++in.skipped;
      continue;
    }
    FuzzInput input;
    input.the_case = cf.the_case;
    const int k = kernel_index_of(cf, kernels_);
    if (k >= 0 || kernels_.empty()) {
      input.kernel = static_cast<uint32_t>(std::max(k, 0));
      add_input(input);
    } else {
      // No kernel recorded: one input per selected kernel (seeds exercise every kernel from the start).
      for (size_t i = 0; i < kernels_.size() && i < 256; ++i) {
        input.kernel = static_cast<uint32_t>(i);
        add_input(input);
      }
    }
    ++(is_seed ? in.seeds : in.loaded);
  }
}

}  // namespace

CorpusIn load_corpus(const Paths& p, const std::vector<std::string>& seed_dirs, const Kernels& kernels,
                     const FuzzLimits& lim) {
  Loader l(p, kernels, lim);
  l.load_dir(p.corpus, false);
  std::error_code ec;
  for (const auto& s : seed_dirs)
    if (fs::is_directory(s, ec)) l.load_dir(s, true);
  return std::move(l.in);
}

void CorpusOut::save_new() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(p_.inputs, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || synced_.count(name)) continue;
    synced_.insert(name);
    const std::string bytes = read_all(e.path());
    FuzzInput in = decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), lim_);
    CorpusFile cf;
    cf.tool.name = "attn-fuzz";
    cf.tool.command = command_line_;
    cf.the_case = in.the_case;
    if (const KernelEntry* k = kernel_for(in, kernels_))
      cf.the_case.label = std::string("fuzz-") + k->kernel.name;
    try {
      save_to_corpus_dir(p_.corpus, cf);
    } catch (const CorpusError& err) {
      std::fprintf(stderr, "attn-fuzz: warning: %s\n", err.what());
    }
  }
}

}  // namespace attnfuzz::fuzz::campaign
