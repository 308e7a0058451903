// attn_check.cpp - attn-check: validate kernels on one shape, a sweep of edge shapes, or replayed corpus
// files.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "attnfuzz/case.h"
#include "attnfuzz/corpus.h"
#include "attnfuzz/device.h"
#include "attnfuzz/dropout.h"
#include "attnfuzz/presets.h"
#include "attnfuzz/registry.h"
#include "attnfuzz/report.h"
#include "check/fit.h"
#include "check/runner.h"
#include "fuzz/campaign.h"
#include "npy/npy_cli.h"
#include "tools/bug_report.h"
#include "tools/cli_common.h"
#include "tools/worker_config.h"

namespace fs = std::filesystem;
using namespace attnfuzz;

namespace {

// ---- the one options table of attn-check ----
struct Options {
  CommonOptions common;
  // the case
  int64_t batch = 1, heads = 1, kv_heads = 0, sq = 7, sk = -1, d = 64, dv = 0;
  std::string mask = "none", scale, dist = "uniform", descale;
  std::vector<std::string> specials;
  std::vector<std::string> tunables;  // NAME=VALUE of the one --kernel's declared tunables
  uint64_t seed = 0;
  int repeat = 1;
  // modes
  bool sweep = false;
  std::vector<std::string> replay;
  bool minimize = false;      // with --replay: shrink each file's recorded failure (fuzz/minimize.cpp)
  double minimize_time = 60;  // seconds per file
  std::string bug_report;     // with one --replay file: the bundle's directory (tools/bug_report.h)
  bool list = false, json = false;
  npy::NpyOptions npy;   // --npy / --npy-emit (npy/)
  SequenceOptions seqs;  // --seq-layout, --seqlens-q, ... (tools/cli_common.h)
  // merge cases (issue 29): --merge-cuts, --merge-shift, --merge-layout, --merge-pad
  std::string merge_cuts, merge_shift, merge_layout = "state";
  int64_t merge_pad = 0;
};

std::string check_mask(const std::string& t) {
  Problem p = make_problem(1, 1, 1, 1, 1, 1, 1);
  return parse_mask(t, p);
}
std::string check_dist(const std::string& t) {
  ValueDist d;
  return parse_distribution(t, d);
}
std::string check_special(const std::string& t) {
  SpecialValue v;
  return parse_special(t, v);
}
// "Q,K,V[,O]": fp8 descale factors of q, k, v and the output scale (default 1). Three or four numbers, no
// empty item (a whole-string parse with std::from_chars: CLI11's ->delimiter(',') drops empty items).
std::string parse_descale(const std::string& t, Problem& p) {
  const std::string form = "'" + t + "' is not Q,K,V[,O] (3 or 4 fp8 descale factors and output scale)";
  float f[4] = {1, 1, 1, 1};
  const char* at = t.data();
  const char* const end = t.data() + t.size();
  int n = 0;
  for (;; ++n) {
    if (n == 4) return form + ": more than 4 values";
    const auto [next, ec] = std::from_chars(at, end, f[n]);
    if (ec != std::errc() || next == at) return form;
    if (next == end) break;
    if (*next != ',') return form;
    at = next + 1;
  }
  if (n + 1 < 3) return form;
  p.q_descale = f[0], p.k_descale = f[1], p.v_descale = f[2], p.o_scale = f[3];
  return {};
}
std::string check_descale(const std::string& t) {
  Problem p = make_problem(1, 1, 1, 1, 1, 1, 1);
  p.dtype = AF_DTYPE_FP8_E4M3;
  if (std::string e = parse_descale(t, p); !e.empty()) return e;
  return validate_descales(p);
}
std::string check_scale(const std::string& t) {
  try {
    size_t used = 0;
    const float f = std::stof(t, &used);
    if (used == t.size() && std::isfinite(f)) return {};
  } catch (const std::exception&) {
  }
  return "'" + t + "' is not a finite fp32 number";
}

void define_options(CLI::App& app, Options& o) {
  using namespace cli;
  add_common_options(app, o.common);
  const int64_t lim = kMaxElements;
  auto* g = "Case (not with --sweep / --replay; with --npy only --mask, --scale, --kv-heads)";
  std::vector<CLI::Option*> shape, npy_shared;
  shape.push_back(app.add_option("--batch", o.batch, "batch size B")
                      ->group(g)
                      ->check(int_range(1, lim))
                      ->capture_default_str());
  shape.push_back(app.add_option("--heads", o.heads, "query heads Hq")
                      ->group(g)
                      ->check(int_range(1, lim))
                      ->capture_default_str());
  npy_shared.push_back(
      app.add_option("--kv-heads", o.kv_heads, "key/value heads Hkv (default Hq; Hq % Hkv == 0)")
          ->group(g)
          ->check(int_range(1, lim)));
  shape.push_back(app.add_option("--sq", o.sq, "query length Sq >= 1")
                      ->group(g)
                      ->check(int_range(1, lim))
                      ->capture_default_str());
  shape.push_back(
      app.add_option("--sk", o.sk, "key length Sk >= 0 (default Sq)")->group(g)->check(int_range(0, lim)));
  shape.push_back(app.add_option("--d", o.d, "head dim D of q and k")
                      ->group(g)
                      ->check(int_range(1, lim))
                      ->capture_default_str());
  shape.push_back(
      app.add_option("--dv", o.dv, "head dim Dv of v and o (default D)")->group(g)->check(int_range(1, lim)));
  npy_shared.push_back(
      app.add_option("--mask", o.mask,
                     "none | causal (= causal-br) | causal-tl | causal-br | window:L,R[-tl|-br]")
          ->group(g)
          ->check(checked_by(check_mask))
          ->capture_default_str());
  npy_shared.push_back(app.add_option("--scale", o.scale, "score scale (default fp32(1/sqrt(D)))")
                           ->group(g)
                           ->check(checked_by(check_scale)));
  shape.push_back(
      app.add_option("--descale", o.descale,
                     "fp8 only: Q,K,V[,O] = q/k/v_descale (real value = stored * descale) and o_scale "
                     "(stored o = fp8(O * o_scale)), default 1,1,1,1")
          ->group(g)
          ->check(checked_by(check_descale)));
  shape.push_back(app.add_option("--dist", o.dist,
                                 "uniform[:A] | normal[:SIGMA] | extreme:MAG (scores of magnitude ~MAG)")
                      ->group(g)
                      ->check(checked_by(check_dist))
                      ->capture_default_str());
  shape.push_back(
      app.add_option("--special", o.specials,
                     "special values KIND[@q|k|v][:random|visible|masked|hidden|at=S,D][*COUNT], e.g. "
                     "nan@k:masked (repeatable)")
          ->group(g)
          ->check(checked_by(check_special)));
  shape.push_back(app.add_option("--tunable", o.tunables,
                                 "NAME=VALUE: a declared tunable of the one --kernel, e.g. num_splits=3 "
                                 "(repeatable; recorded in saved cases)")
                      ->group(g)
                      ->check(non_empty()));
  for (CLI::Option* x : add_sequence_options(app, o.seqs, "Sequences (varlen, KV cache, paged KV)"))
    shape.push_back(x);
  const char* mg = "Merged states (merge kernels: docs/semantics.md)";
  shape.push_back(
      app.add_option("--merge-cuts", o.merge_cuts,
                     "0,C1,...,Sk: the key ranges of the states (n_states + 1 cuts; equal cuts = an "
                     "empty state), e.g. 0,32,40")
          ->group(mg));
  shape.push_back(app.add_option("--merge-shift", o.merge_shift,
                                 "one shift per state added to LSE_s (-inf drops the state), e.g. 0,-1e4")
                      ->group(mg));
  shape.push_back(
      app.add_option("--merge-layout", o.merge_layout, "state buffers: state (state-major) | token")
          ->group(mg)
          ->check(CLI::IsMember({"state", "token"})));
  shape.push_back(
      app.add_option("--merge-pad", o.merge_pad, "stride gap after each state head row (elements)")
          ->group(mg)
          ->check(int_range(0, 64)));
  auto* seed = app.add_option("--seed", o.seed, "value seed (decimal or 0x hex, as reports print it)")
                   ->group(g)
                   ->transform(u64())
                   ->capture_default_str();
  shape.push_back(app.add_option("--repeat", o.repeat, "check N seeds: seed, seed+1, ...")
                      ->group(g)
                      ->check(int_range(1, 1000000)));
  auto* m = "Mode (one at a time, without the case flags)";
  auto* sweep = app.add_flag("--sweep", o.sweep,
                             "run the built-in grid of edge shapes over every kernel that supports each case")
                    ->group(m);
  auto* replay = app.add_option("--replay", o.replay, "replay corpus files (or directories of .case files)")
                     ->group(m)
                     ->check(non_empty());
  app.add_flag(
         "--minimize", o.minimize,
         "with --replay: shrink each file's recorded failure, keeping its class and kind of evidence; the "
         "minimal case is written beside the file (or under --out when given)")
      ->group(m)
      ->needs(replay);
  app.add_option(
         "--bug-report", o.bug_report,
         "one --replay FILE's bundle for a maintainer: README, case, replay, evidence; adapter kernels: "
         "a script of <= 40 lines")
      ->group(m)
      ->needs(replay)
      ->check(writable_dir());
  app.add_option("--minimize-time", o.minimize_time, "with --minimize: seconds per file")
      ->group(m)
      ->needs("--minimize")
      ->check(real_range(0, 86400, true));
  auto* list = app.add_flag("--list", o.list, "list the registered kernels with what each declares, and exit")
                   ->group(m);
  app.add_flag("--json", o.json, "with --list: the same facts as one JSON document")->group(m)->needs(list);
  npy::add_npy_options(app, o.npy);
  // Contradictions: one mode at a time; the case flags describe the single case only.
  sweep->excludes(replay);
  replay->excludes(seed);
  for (CLI::Option* opt : {sweep, replay}) {
    for (CLI::Option* c : shape) opt->excludes(c);
    for (CLI::Option* c : npy_shared) opt->excludes(c);
  }
  for (const char* mode : {"--npy", "--o"})
    for (CLI::Option* x : {sweep, replay, seed}) app.get_option(mode)->excludes(x);
  for (const char* mode : {"--npy", "--o"})
    for (CLI::Option* c : shape) app.get_option(mode)->excludes(c);
  for (CLI::Option* x : {sweep, replay}) app.get_option("--npy-emit")->excludes(x);
  for (CLI::Option* x : {sweep, replay, seed}) list->excludes(x);
  for (CLI::Option* c : shape) list->excludes(c);
  auto* a = "Classification (check/README.md)";
  app.add_flag("--audit", o.common.audit,
               "audit passing checks for races / OOB: nvidia compute-sanitizer racecheck, synccheck, "
               "memcheck; cpu other thread orders (and --tsan)")
      ->group(a);
  app.add_option("--audit-every", o.common.audit_every, "audit every N-th passing check of each kernel")
      ->group(a)
      ->check(int_range(1, int64_t{1} << 40))
      ->capture_default_str();
}

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "attn-check: %s\n", msg.c_str());
  std::exit(2);
}

// The single case described by the flags.
Case case_from_flags(const Options& o) {
  Problem p = make_problem(o.batch, o.heads, o.kv_heads ? o.kv_heads : o.heads, o.sq, o.sk < 0 ? o.sq : o.sk,
                           o.d, o.dv ? o.dv : o.d);
  if (std::string e = parse_mask(o.mask, p); !e.empty()) usage_error(e);
  p.dtype = case_dtype(o.common);
  if (!o.descale.empty()) {
    if (p.dtype != AF_DTYPE_FP8_E4M3 && p.dtype != AF_DTYPE_FP8_E5M2)
      usage_error("--descale applies to --dtype fp8-e4m3 or fp8-e5m2 only");
    if (std::string e = parse_descale(o.descale, p); !e.empty()) usage_error("--descale " + e);
  }
  if (!o.scale.empty()) {
    try {
      size_t used = 0;
      p.scale = std::stof(o.scale, &used);
      if (used != o.scale.size()) throw std::invalid_argument("trailing text");
    } catch (const std::exception&) {
      usage_error("--scale '" + o.scale + "' is not a number");
    }
  }
  Case c = make_case(p, o.seed);
  if (std::string e = apply_sequence_options(o.seqs, c); !e.empty()) usage_error(e);
  c.values.domain = value_domain(o.common);
  c.pass = case_pass(o.common);
  if (std::string e = apply_variant_options(o.common, c); !e.empty()) usage_error(e);
  if (!o.merge_cuts.empty() || !o.merge_shift.empty())
    if (std::string e = parse_merge(o.merge_cuts, o.merge_shift, o.merge_layout == "token", o.merge_pad, c);
        !e.empty())
      usage_error(e);
  if (std::string e = parse_distribution(o.dist, c.values.dist); !e.empty()) usage_error(e);
  for (const auto& s : o.specials) {
    SpecialValue sv;
    if (std::string e = parse_special(s, sv); !e.empty()) usage_error(e);
    c.values.specials.push_back(sv);
  }
  if (std::string e = validate(c); !e.empty()) usage_error("invalid case: " + e);
  if (std::string e = memory_refusal(c); !e.empty()) usage_error(e);
  return c;
}

// Applies --tunable NAME=VALUE to p for the one kernel selected (tunables are indexed per kernel).
void set_tunables(const std::vector<std::string>& items, const std::string& pattern,
                  const std::vector<const KernelEntry*>& kernels, Problem& p) {
  if (kernels.size() != 1 || pattern.find_first_of("*?[,") != std::string::npos || pattern == "all")
    usage_error("--tunable needs exactly one --kernel NAME (tunables are declared per kernel)");
  const af_kernel& k = kernels[0]->kernel;
  std::string declared;  // "num_splits (default 8; accepts 8, 1, 2)"
  for (int32_t t = 0; t < k.n_tunables; ++t) {
    const af_tunable& tu = k.tunables[t];
    declared +=
        std::string(t ? ", " : "") + tu.name + " (default " + std::to_string(tu.values[0]) + "; accepts ";
    for (int32_t v = 0; v < tu.n_values; ++v) declared += (v ? ", " : "") + std::to_string(tu.values[v]);
    declared += ")";
  }
  std::vector<bool> set(AF_MAX_TUNABLES, false);
  for (const std::string& item : items) {
    const size_t eq = item.find('=');
    const std::string name = item.substr(0, eq);
    int32_t idx = -1;
    for (int32_t t = 0; t < k.n_tunables; ++t)
      if (name == k.tunables[t].name) idx = t;
    if (eq == std::string::npos || idx < 0)
      usage_error(
          "--tunable '" + item + "': " + k.name + " declares " +
          (k.n_tunables ? "the tunables " + declared + "; give NAME=VALUE" : std::string("no tunable")));
    if (set[idx]) usage_error("--tunable " + name + " is given twice: give each tunable once");
    set[idx] = true;
    const af_tunable& tu = k.tunables[idx];
    std::string accepted;
    int32_t value = 0;
    const std::string text = item.substr(eq + 1);
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    bool ok = ec == std::errc() && end == text.data() + text.size() && !text.empty();
    bool member = false;
    for (int32_t v = 0; v < tu.n_values; ++v) {
      accepted += (v ? ", " : "") + std::to_string(tu.values[v]);
      member |= value == tu.values[v];
    }
    if (!ok || !member) usage_error("--tunable '" + item + "': " + name + " accepts " + accepted);
    p.tunables[idx] = value;
  }
}

// A case to check, the kernels to check it with, and the verdict a replayed file recorded.
struct Job {
  Case c;
  std::string origin;  // "flags", "sweep", or the corpus file path
  std::optional<RecordedVerdict> recorded;
  std::string kernel_pattern;
};

// The replayable files named by --replay (directories: their .case files, sorted). Files that do not read
// are listed in `bad` ("path: why") and skipped: the good ones are still replayed.
std::vector<Job> replay_jobs(const Options& o, std::vector<std::string>& bad) {
  std::vector<fs::path> files;
  for (const auto& r : o.replay) {
    std::error_code ec;
    if (fs::is_directory(r, ec)) {
      std::vector<fs::path> here;
      for (fs::directory_iterator it(r, ec), end; !ec && it != end; it.increment(ec))
        if (it->path().extension() == kCaseFileExtension) here.push_back(it->path());
      if (ec) {
        bad.push_back(r + ": cannot list the directory: " + ec.message());
        continue;
      }
      if (here.empty())
        bad.push_back(r + ": no " + std::string(kCaseFileExtension) + " files in the directory");
      std::sort(here.begin(), here.end());
      files.insert(files.end(), here.begin(), here.end());
    } else {
      files.push_back(r);
    }
  }
  std::vector<Job> jobs;
  for (const auto& f : files) {
    try {
      CorpusFile cf = read_corpus_file(f);
      Job j{cf.the_case, f.string(), cf.verdict, o.common.kernel};
      if (cf.verdict && o.common.kernel == "all") j.kernel_pattern = cf.verdict->kernel;
      jobs.push_back(std::move(j));
    } catch (const CorpusError& e) {
      bad.push_back(e.what());
    }
  }
  return jobs;
}

// --replay FILE... --minimize: each file's recorded failure shrunk by the campaign's minimizer
// (minimize_case, the one minimizer), its class and kind of evidence kept; the minimal case goes beside the
// file, or into `out` when given. Returns 0 when every file was minimized, 2 otherwise (each problem has its
// line).
int minimize_replays(const Options& o, const std::vector<Job>& jobs, Backend backend,
                     const std::string& out) {
  fuzz::WorkerConfig cfg = cli::common_worker_config(o.common, backend);
  fuzz::Minimizer minimizer(cfg);  // one device (one adapter process) for every file
  int rc = 0;
  for (const Job& j : jobs) {
    fuzz::Minimized m;
    CorpusFile cf{};
    cf.the_case = j.c;
    cf.verdict = j.recorded;
    std::string e = minimizer.minimize(cf, j.origin, o.minimize_time, 5000, m);
    fs::path saved;
    if (e.empty()) {
      m.file.tool.name = "attn-check";
      m.file.tool.command = "attn-check --replay " + shell_quote(j.origin) + " --minimize";
      try {
        saved = save_to_corpus_dir(out.empty() ? fs::path(j.origin).parent_path() : fs::path(out), m.file);
      } catch (const CorpusError& x) {
        e = x.what();
      }
    }
    if (!e.empty()) {
      std::fprintf(stderr, "attn-check: %s\n", e.c_str());
      rc = 2;
      continue;
    }
    const RecordedVerdict& rv = *j.recorded;
    std::printf(
        "minimized %s (%s, %s by %s) in %d check(s), %.1f s:\n  original: %s\n  minimal:  %s\n"
        "  class:    %s (kept), evidence %s (kept)\n  wrote %s\n  replay: %s\n",
        j.origin.c_str(), rv.kernel.c_str(), failure_class_name(rv.failure), m.decided_by.c_str(), m.checks,
        m.secs, describe(j.c).c_str(), describe(m.file.the_case).c_str(), failure_class_name(rv.failure),
        m.decided_by.c_str(), saved.c_str(), fuzz::replay_command(cfg, saved.string()).c_str());
    if (!m.left.empty()) std::printf("  --minimize-time ran out: %s\n", m.left.c_str());
  }
  return rc;
}

// --replay FILE --bug-report DIR [--minimize]: the one file's bundle (tools/bug_report.h), of its minimal
// case with --minimize (the minimizer runs on its own device: the session's is closed meanwhile and opened
// again).
int bug_report_mode(const Options& o, Session& s, const std::vector<Job>& jobs,
                    const std::vector<std::string>& bad) {
  for (const auto& b : bad) std::fprintf(stderr, "attn-check: %s\n", b.c_str());
  if (!bad.empty()) return 2;
  if (jobs.size() != 1)
    usage_error("--bug-report takes one --replay file, not " + std::to_string(jobs.size()) + " cases");
  const Job& j = jobs.front();
  BugReport br{j.origin, CorpusFile{}, "", o.bug_report};
  br.recorded.the_case = j.c;
  br.recorded.verdict = j.recorded;
  if (o.minimize && j.recorded && j.recorded->verdict == Verdict::kFail) {
    const fuzz::WorkerConfig cfg = cli::common_worker_config(o.common, s.device->backend());
    s.set_device(nullptr);
    fuzz::Minimized m;
    const std::string e = fuzz::minimize_case(br.recorded, j.origin, cfg, o.minimize_time, 5000, m);
    if (!e.empty()) usage_error(e);
    std::printf("minimized %s in %d check(s), %.1f s: %s\n", j.origin.c_str(), m.checks, m.secs,
                describe(m.file.the_case).c_str());
    br.original = describe(j.c);
    br.recorded.the_case = m.file.the_case;
    s.set_device(open_tool_device(o.common, "attn-check"));
  }
  return write_bug_report(s, br);
}

}  // namespace

// The option groups --help shows (--help-all: every group); the names are the groups' titles above.
static const std::set<std::string> kBriefHelp = {
    "Options", "Kernels and device", "Mode (one at a time, without the case flags)",
    "Case (not with --sweep / --replay; with --npy only --mask, --scale, --kv-heads)"};

namespace {

// The usage errors that combine several options.
void check_modes(const Options& o, const CLI::App& app) {
  if (case_dtype(o.common) < 0) usage_error("--dtype any is for attn-fuzz: name one dtype");
  if (has_backward(case_pass(o.common)) && case_dtype(o.common) > AF_DTYPE_BF16)
    usage_error("--pass " + o.common.pass + " is checked in f32, f16 and bf16 only: drop --dtype " +
                o.common.dtype);
  if (has_backward(case_pass(o.common)) && !o.seqs.layout.empty() && o.seqs.layout != "dense")
    usage_error("--pass " + o.common.pass + " is checked on dense batches only: drop --seq-layout " +
                o.seqs.layout);
  if (!o.replay.empty() && app.count("--dtype"))
    usage_error("--dtype does not apply to --replay (files record it)");
}

// The cases of the mode asked for: replayed files, a preset, the layout / dropout / variant / plain sweep, or
// the case the flags describe.
std::vector<Job> make_jobs(const Options& o, const Session& s, std::vector<std::string>& bad) {
  std::vector<Job> jobs;
  if (!o.replay.empty()) {
    jobs = replay_jobs(o, bad);
  } else if (!o.common.preset.empty()) {
    for (Case& c : preset_sweep_grid(*find_preset(o.common.preset), o.seed, value_domain(o.common),
                                     case_dtype(o.common), case_pass(o.common)))
      jobs.push_back({std::move(c), "sweep", std::nullopt, o.common.kernel});
  } else if (o.sweep && !o.seqs.layout.empty() && o.seqs.layout != "dense") {
    // --variant: sink, softcap, alibi and kv-shared are checked on sequence layouts (the layout's variant axis)
    const uint32_t bits = case_variants(o.common);
    if (bits & ~(kLayoutVariants | AF_VARIANT_KV_SHARED))
      usage_error("--variant " + variant_names(bits & ~(kLayoutVariants | AF_VARIANT_KV_SHARED)) +
                  " is checked on dense batches only: with --seq-layout, --variant takes sink, softcap, alibi and "
                  "kv-shared");
    for (Case& c : layout_sweep_grid(o.seqs.layout, o.seed, bits)) {
      c.values.domain = value_domain(o.common);
      jobs.push_back({std::move(c), "sweep", std::nullopt, o.common.kernel});
    }
  } else if (o.sweep && case_variants(o.common) == AF_VARIANT_DROPOUT && o.common.dropout < 0) {
    for (Case& c : dropout_sweep_grid(o.seed, case_pass(o.common), case_dtype(o.common)))  // issue 29: the dropout sweep
      jobs.push_back({std::move(c), "sweep", std::nullopt, o.common.kernel});
  } else if (o.sweep && case_variants(o.common)) {
    const uint32_t bits = case_variants(o.common);
    std::vector<Case> grid =
        bits & ~AF_VARIANT_DROPOUT
            ? variant_sweep_grid(bits & ~AF_VARIANT_DROPOUT, o.seed, value_domain(o.common),
                                 case_dtype(o.common), case_pass(o.common))
            : sweep_grid(o.seed, value_domain(o.common), case_dtype(o.common), case_pass(o.common));
    for (Case& c : grid) {
      // --dropout P (or --variant dropout with other variants): every case of the grid under dropout, where
      // it can be
      if ((bits & AF_VARIANT_DROPOUT) &&
          (has_sequences(c.problem) || !apply_dropout_options(o.common, c).empty()))
        continue;
      jobs.push_back({std::move(c), "sweep", std::nullopt, o.common.kernel});
    }
  } else if (o.sweep) {
    // The attention grid for attention kernels, the merge grid (issue 29) for merge kernels: each only where
    // the selection holds a kernel of that kind.
    bool attention = false, merge = false;
    for (const KernelEntry* k : s.registry->select(s.device->backend(), o.common.kernel))
      (k->kernel.kind == AF_KIND_MERGE ? merge : attention) = true;
    if (attention)
      for (Case& c : sweep_grid(o.seed, value_domain(o.common), case_dtype(o.common), case_pass(o.common)))
        jobs.push_back({std::move(c), "sweep", std::nullopt, o.common.kernel});
    if (merge && case_pass(o.common) == Pass::kFwd && !case_variants(o.common))
      for (Case& c : merge_sweep_grid(o.seed, case_dtype(o.common)))
        jobs.push_back({std::move(c), "sweep", std::nullopt, o.common.kernel});
  } else {
    Case base = case_from_flags(o);
    for (int r = 0; r < o.repeat; ++r) {
      Case c = base;
      c.seed = o.seed + static_cast<uint64_t>(r);
      jobs.push_back({std::move(c), "flags", std::nullopt, o.common.kernel});
    }
  }
  return jobs;
}

// Kernel selection errors are usage errors; so is an explicitly named kernel that cannot run a
// hand-written case (the user asked for something impossible). A replayed file whose recorded kernel is
// not loaded is a bad input of its own (the other files still replay).
std::vector<std::vector<const KernelEntry*>> select_kernels(const Options& o, const Session& s,
                                                            std::vector<Job>& jobs,
                                                            std::vector<std::string>& bad) {
  std::vector<std::vector<const KernelEntry*>> kernels(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    try {
      kernels[i] = s.registry->select(s.device->backend(), jobs[i].kernel_pattern);
    } catch (const std::invalid_argument& e) {
      if (o.replay.empty()) usage_error(e.what());
      bad.push_back(jobs[i].origin + ": " + e.what());
      continue;
    }
    if (jobs[i].origin == "sweep")  // a sweep case goes to the kernels of its kind (attention or merge) only
      std::erase_if(kernels[i], [&](const KernelEntry* k) {
        return (k->kernel.kind == AF_KIND_MERGE) != is_merge(jobs[i].c.problem);
      });
    if (!o.tunables.empty() && jobs[i].origin == "flags")
      set_tunables(o.tunables, o.common.kernel, kernels[i], jobs[i].c.problem);
    if (!o.replay
             .empty()) {  // a file's tunables are refused as the flag's would be, never run as the default
      std::string why = memory_refusal(jobs[i].c);
      for (const KernelEntry* k : kernels[i])
        if (why.empty()) why = tunables_refusal(k->kernel, jobs[i].c.problem);
      if (!why.empty()) {
        bad.push_back(jobs[i].origin + ": " + why);
        kernels[i].clear();
        continue;
      }
    }
    if (jobs[i].origin == "flags" && o.common.kernel != "all" &&
        o.common.kernel.find_first_of("*?[,") == std::string::npos)
      if (const std::string why =
              case_unsupported_reason(kernels[i][0]->kernel, jobs[i].c.problem, jobs[i].c.pass);
          !why.empty())
        usage_error("kernel " + o.common.kernel + " does not support this case: " + why);
  }
  return kernels;
}

// Every (job, kernel) check; true when a replayed verdict differs from the one its file records.
bool run_jobs(Runner& runner, const std::vector<Job>& jobs,
              const std::vector<std::vector<const KernelEntry*>>& kernels) {
  bool mismatch = false;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (kernels[i].empty()) continue;  // a bad input (listed above): no values to generate
    PreparedCase pc(jobs[i].c);
    for (const KernelEntry* k : kernels[i]) {
      // A sweep gives each kernel the case with the variants it declares, and a layout sweep in a shape it
      // declares (check/fit.h), e.g. a sink-only kernel the sink of a `--variant all` case, one head for a
      // one-head kernel, where the grid's own case is refused.
      if (jobs[i].origin == "sweep" && !case_unsupported_reason(k->kernel, jobs[i].c.problem, jobs[i].c.pass).empty()) {
        const std::optional<Case> f = has_sequences(jobs[i].c.problem) ? fit_to_kernel(jobs[i].c, k->kernel)
                                                                        : fit_variants(jobs[i].c, k->kernel);
        if (f) {
          PreparedCase fitted(*f);
          runner.check(*k, fitted, jobs[i].origin);
          continue;
        }
      }
      const Judged& j = runner.check(*k, pc, jobs[i].origin);
      if (jobs[i].recorded && jobs[i].recorded->kernel == k->kernel.name) {
        const RecordedVerdict& rv = *jobs[i].recorded;
        const bool same = rv.verdict == j.result.verdict && rv.failure == j.result.failure;
        auto cls = [](FailureClass f) {
          return f != FailureClass::kNone ? "/" + std::string(failure_class_name(f)) : "";
        };
        runner.replay_verdict("replay " + jobs[i].origin + ": recorded " + verdict_name(rv.verdict) +
                                  cls(rv.failure) + ", now " + verdict_name(j.result.verdict) +
                                  cls(j.result.failure) + " -> " + (same ? "reproduced" : "DIFFERENT"),
                              same);
        mismatch |= !same;
      }
    }
  }
  return mismatch;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"attn-check: does my attention kernel compute exactly the right thing for this shape?",
               "attn-check"};
  app.footer(R"(Examples:
  attn-check --kernel flash-bm16-bn32 --sq 7 --sk 13 --d 59 --mask causal-br
  attn-check --sweep                            # edge shapes x every kernel, cpu emulator when no GPU
  attn-check --kernel 'flash-*' --sq 4096 --d 128 --dist extreme:1e4 --oracle-rows 512
  attn-check --special nan@k:masked --mask causal-tl --sq 33 --sk 33
  attn-check --dtype f16 --sweep                # every f16 kernel over the f16 edge grid
  attn-check --dtype fp8-e4m3 --descale 0.5,0.25,2 --kernel flash-bm16-bn32 --sq 40
  attn-check --pass bwd --sweep                 # dQ, dK, dV of every kernel with a backward launch
  attn-check --replay reports/corpus/mask-0123456789abcdef.case
  attn-check --plugin ./libmykernels_cpu.so --kernel example-naive --sweep   # examples/plugin/README.md
  attn-check --seq-layout varlen --seqlens-q 3,0,17 --seqlens-k 5,1,40 --mask causal-br --heads 4 --kv-heads 2
  attn-check --seq-layout paged --sq 1 --seqused-k 33,1,200 --page-size 16 --page-order 7 --spare-pages 2
  attn-check --seq-layout varlen --sweep        # also varlen-q, varlen-k, kvcache, paged, decode
  attn-check --list --json                      # what every kernel declares, as JSON
Exit status: 0 every check passed (unsupported / outside-contract are not failures), 1 a failure was found,
2 usage or input error (also after replaying the good files when any --replay input was bad).)");
  define_options(app, o);
  app.set_version_flag("--version", "attn-check " ATTNFUZZ_VERSION);
  if (const int rc = cli::parse_or_exit_code(app, argc, argv, "attn-check", kBriefHelp); rc >= 0) return rc;
  o.seqs.given = {app.count("--batch") > 0,      app.count("--sq") > 0,
                  app.count("--sk") > 0,         app.count("--page-size") > 0,
                  app.count("--page-order") > 0, app.count("--spare-pages") > 0};
  if (std::string e = npy::check_npy_combination(o.npy); !e.empty()) usage_error(e);
  if (!o.npy.emit.empty()) {
    std::string cmd;
    for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
    return npy::run_npy_emit(o.npy, case_from_flags(o), cmd);
  }
  if (o.common.preset == "list") {
    std::fputs(preset_table().c_str(), stdout);
    return 0;
  }
  if (!o.common.preset.empty() && !find_preset(o.common.preset))
    usage_error("--preset '" + o.common.preset + "' is not a preset: one of " + preset_names() +
                " (or list)");
  if (!o.common.preset.empty() && !o.sweep)
    usage_error("--preset NAME goes with --sweep (attn-check --sweep --preset NAME)");
  Session s = open_session(o.common, "attn-check", argc, argv);
  check_modes(o, app);
  if (npy::npy_mode(o.npy))
    return npy::run_npy(o.npy, {o.mask, o.scale, o.kv_heads, app.count("--mask") > 0, !o.scale.empty()}, s,
                        o.common);
  if (o.list) {
    list_kernels(s, o.json);
    return 0;
  }
  if (o.common.audit) {
    if (s.device->backend() == Backend::kAmd)
      usage_error("--audit: no race / memory checker for the amd backend yet");
    const std::string probe =
        "command -v " + shell_quote(s.classify.compute_sanitizer_binary) + " >/dev/null 2>&1";
    if (s.device->backend() == Backend::kNvidia && std::system(probe.c_str()) != 0)
      usage_error("--audit on nvidia needs " + s.classify.compute_sanitizer_binary + " on PATH");
  }

  std::vector<std::string> bad;  // replay inputs that did not read: listed, and the exit status is 2
  std::vector<Job> jobs = make_jobs(o, s, bad);
  if (!o.bug_report.empty()) return bug_report_mode(o, s, jobs, bad);
  if (!o.replay.empty() && o.minimize) {
    for (const auto& b : bad) std::fprintf(stderr, "attn-check: %s\n", b.c_str());
    const Backend backend = s.device->backend();
    s.set_device(nullptr);  // the minimizer opens its own device
    const int rc = minimize_replays(o, jobs, backend, app.count("--out") ? o.common.out : "");
    return bad.empty() ? rc : 2;
  }

  std::vector<std::vector<const KernelEntry*>> kernels = select_kernels(o, s, jobs, bad);
  for (const auto& b : bad) std::fprintf(stderr, "attn-check: %s\n", b.c_str());

  Runner runner(s, o.common);
  int64_t total = 0;
  for (auto& k : kernels) total += static_cast<int64_t>(k.size());
  if (total == 0) {
    if (!bad.empty()) return 2;  // each bad input has had its line above
    usage_error("nothing to check: no kernel selected");
  }
  runner.begin(total);
  const bool mismatch = run_jobs(runner, jobs, kernels);
  const int rc = runner.finish();
  if (mismatch) std::printf("note: a replayed verdict differs from the one recorded in its file\n");
  // Every check unsupported: nothing was checked, which must never read as a pass.
  const auto& done = runner.entries();
  const bool none_checked = !done.empty() && std::all_of(done.begin(), done.end(), [](const RunEntry& e) {
    return e.result.verdict == Verdict::kUnsupported;
  });
  if (none_checked) {
    std::fprintf(stderr, "attn-check: nothing checked: no selected kernel supports any of the %s (%s: %s)\n",
                 count_of(total, "check").c_str(), done.front().result.kernel.c_str(),
                 done.front().result.reason.c_str());
    if (bad.empty()) return 2;
  }
  if (!bad.empty()) {
    // Input errors beat failures: a script must not read "failure found" while inputs went unchecked.
    std::fprintf(stderr, "attn-check: %zu replay input(s) were bad and not checked:\n", bad.size());
    for (const auto& b : bad) std::fprintf(stderr, "  %s\n", b.c_str());
    return 2;
  }
  return rc;
}
