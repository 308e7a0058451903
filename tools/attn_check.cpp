// attn_check.cpp - attn-check: validate kernels on one shape, a sweep of edge shapes, or replayed corpus files.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "attnfuzz/case.h"
#include "attnfuzz/corpus.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "check/runner.h"
#include "attnfuzz/report.h"
#include "npy/npy_cli.h"
#include "tools/cli_common.h"

namespace fs = std::filesystem;
using namespace attnfuzz;

namespace {

// ---- the one options table of attn-check ----
struct Options {
  CommonOptions common;
  // the case
  int64_t batch = 1, heads = 1, kv_heads = 0, sq = 7, sk = -1, d = 64, dv = 0;
  std::string mask = "none", scale, dtype = "f32", dist = "uniform";
  std::vector<std::string> specials;
  uint64_t seed = 0;
  int repeat = 1;
  // modes
  bool sweep = false;
  std::vector<std::string> replay;
  bool list = false;
  npy::NpyOptions npy;  // --npy / --npy-emit (npy/)
};

void define_options(CLI::App& app, Options& o) {
  add_common_options(app, o.common);
  auto* g = "Case (ignored with --sweep / --replay)";
  app.add_option("--batch", o.batch, "batch size B")->group(g)->capture_default_str();
  app.add_option("--heads", o.heads, "query heads Hq")->group(g)->capture_default_str();
  app.add_option("--kv-heads", o.kv_heads, "key/value heads Hkv (default Hq; Hq % Hkv == 0)")->group(g);
  app.add_option("--sq", o.sq, "query length Sq >= 1")->group(g)->capture_default_str();
  app.add_option("--sk", o.sk, "key length Sk >= 0 (default Sq)")->group(g);
  app.add_option("--d", o.d, "head dim D of q and k")->group(g)->capture_default_str();
  app.add_option("--dv", o.dv, "head dim Dv of v and o (default D)")->group(g);
  app.add_option("--mask", o.mask, "none | causal (= causal-br) | causal-tl | causal-br | window:L,R[-tl|-br]")
      ->group(g)->capture_default_str();
  app.add_option("--scale", o.scale, "score scale (default fp32(1/sqrt(D)))")->group(g);
  app.add_option("--dtype", o.dtype, "f32 (f16, bf16 later)")->group(g)->capture_default_str();
  app.add_option("--dist", o.dist, "uniform[:A] | normal[:SIGMA] | extreme:MAG (scores of magnitude ~MAG)")
      ->group(g)->capture_default_str();
  app.add_option("--special", o.specials,
                 "special values KIND[@q|k|v][:random|visible|masked|hidden|at=S,D][*COUNT], e.g. nan@k:masked "
                 "(repeatable)")
      ->group(g);
  app.add_option("--seed", o.seed, "value seed")->group(g)->capture_default_str();
  app.add_option("--repeat", o.repeat, "check N seeds: seed, seed+1, ...")->group(g)->check(CLI::Range(1, 1000000));
  auto* m = "Mode";
  app.add_flag("--sweep", o.sweep, "run the built-in grid of edge shapes over every kernel that supports each case")
      ->group(m);
  app.add_option("--replay", o.replay, "replay corpus files (or directories of .case files)")->group(m);
  app.add_flag("--list", o.list, "list the registered kernels and exit")->group(m);
  npy::add_npy_options(app, o.npy);
}

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "attn-check: %s\n", msg.c_str());
  std::exit(2);
}

// The single case described by the flags.
Case case_from_flags(const Options& o) {
  Problem p = make_problem(o.batch, o.heads, o.kv_heads ? o.kv_heads : o.heads, o.sq, o.sk < 0 ? o.sq : o.sk, o.d,
                           o.dv ? o.dv : o.d);
  if (std::string e = parse_mask(o.mask, p); !e.empty()) usage_error(e);
  if (auto dt = parse_dtype(o.dtype)) p.dtype = *dt;
  else usage_error("unknown --dtype '" + o.dtype + "': use f32");
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
  c.values.domain = value_domain(o.common);
  if (std::string e = parse_distribution(o.dist, c.values.dist); !e.empty()) usage_error(e);
  for (const auto& s : o.specials) {
    SpecialValue sv;
    if (std::string e = parse_special(s, sv); !e.empty()) usage_error(e);
    c.values.specials.push_back(sv);
  }
  if (std::string e = validate(c); !e.empty()) usage_error("invalid case: " + e);
  return c;
}

// A case to check, the kernels to check it with, and the verdict a replayed file recorded.
struct Job {
  Case c;
  std::string origin;  // "flags", "sweep", or the corpus file path
  std::optional<RecordedVerdict> recorded;
  std::string kernel_pattern;
};

std::vector<Job> replay_jobs(const Options& o) {
  std::vector<fs::path> files;
  for (const auto& r : o.replay) {
    std::error_code ec;
    if (fs::is_directory(r, ec)) {
      for (const auto& e : fs::directory_iterator(r))
        if (e.path().extension() == kCaseFileExtension) files.push_back(e.path());
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(r);
    }
  }
  if (files.empty()) usage_error("--replay: no .case files found");
  std::vector<Job> jobs;
  for (const auto& f : files) {
    try {
      CorpusFile cf = read_corpus_file(f);
      Job j{cf.the_case, f.string(), cf.verdict, o.common.kernel};
      if (cf.verdict && o.common.kernel == "all") j.kernel_pattern = cf.verdict->kernel;
      jobs.push_back(std::move(j));
    } catch (const CorpusError& e) {
      usage_error(e.what());
    }
  }
  return jobs;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"attn-check: does my attention kernel compute exactly the right thing for this shape?", "attn-check"};
  app.footer(R"(Examples:
  attn-check --kernel flash-bk32 --sq 7 --sk 13 --d 59 --mask causal-br
  attn-check --sweep                          # edge shapes x every kernel, cpu emulator when no GPU
  attn-check --kernel 'flash-*' --sq 4096 --d 128 --dist extreme:1e4 --oracle-rows 512
  attn-check --special nan@k:masked --mask causal-tl --sq 33 --sk 33
  attn-check --replay reports/corpus/mask-0123456789abcdef.case
  attn-check --plugin ./libmykernels.so --kernel my-flash --sweep
Exit status: 0 every check passed (unsupported / outside-contract are not failures), 1 a failure was found,
2 usage or input error.)");
  define_options(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!o.npy.emit.empty()) {
    std::string cmd;
    for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
    return npy::run_npy_emit(o.npy, case_from_flags(o), cmd);
  }
  Session s = open_session(o.common, "attn-check", argc, argv);
  if (npy::npy_mode(o.npy))
    return npy::run_npy(o.npy, {o.mask, o.scale, o.kv_heads, app.count("--mask") > 0, !o.scale.empty()}, s, o.common);
  if (o.list) {
    list_kernels(s);
    return 0;
  }
  const int modes = (o.sweep ? 1 : 0) + (o.replay.empty() ? 0 : 1);
  if (modes > 1) usage_error("--sweep and --replay are exclusive");

  std::vector<Job> jobs;
  if (!o.replay.empty()) {
    jobs = replay_jobs(o);
  } else if (o.sweep) {
    for (Case& c : sweep_grid(o.seed, value_domain(o.common)))
      jobs.push_back({std::move(c), "sweep", std::nullopt, o.common.kernel});
  } else {
    Case base = case_from_flags(o);
    for (int r = 0; r < o.repeat; ++r) {
      Case c = base;
      c.seed = o.seed + static_cast<uint64_t>(r);
      jobs.push_back({std::move(c), "flags", std::nullopt, o.common.kernel});
    }
  }

  // Kernel selection errors are usage errors; so is an explicitly named kernel that cannot run a
  // hand-written case (the user asked for something impossible).
  std::vector<std::vector<const KernelEntry*>> kernels(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    try {
      kernels[i] = s.registry->select(s.device->backend(), jobs[i].kernel_pattern);
    } catch (const std::invalid_argument& e) {
      usage_error(e.what());
    }
    if (jobs[i].origin == "flags" && o.common.kernel != "all" && o.common.kernel.find_first_of("*?[,") == std::string::npos)
      if (std::string why = unsupported_reason(kernels[i][0]->kernel, jobs[i].c.problem); !why.empty())
        usage_error("kernel " + o.common.kernel + " does not support this case: " + why);
  }

  Runner runner(s, o.common);
  int64_t total = 0;
  for (auto& k : kernels) total += static_cast<int64_t>(k.size());
  runner.begin(total);
  bool mismatch = false;
  for (size_t i = 0; i < jobs.size(); ++i) {
    PreparedCase pc(jobs[i].c);
    for (const KernelEntry* k : kernels[i]) {
      const Judged& j = runner.check(*k, pc, jobs[i].origin);
      if (jobs[i].recorded && jobs[i].recorded->kernel == k->kernel.name) {
        const RecordedVerdict& rv = *jobs[i].recorded;
        const bool same = rv.verdict == j.result.verdict && rv.failure == j.result.failure;
        std::printf("replay %s: recorded %s%s%s, now %s%s%s -> %s\n", jobs[i].origin.c_str(), verdict_name(rv.verdict),
                    rv.failure != FailureClass::kNone ? "/" : "",
                    rv.failure != FailureClass::kNone ? failure_class_name(rv.failure) : "",
                    verdict_name(j.result.verdict), j.result.failure != FailureClass::kNone ? "/" : "",
                    j.result.failure != FailureClass::kNone ? failure_class_name(j.result.failure) : "",
                    same ? "reproduced" : "DIFFERENT");
        mismatch |= !same;
      }
    }
  }
  const int rc = runner.finish();
  if (mismatch) std::printf("note: a replayed verdict differs from the one recorded in its file\n");
  return rc;
}
