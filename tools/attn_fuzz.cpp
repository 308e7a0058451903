// attn_fuzz.cpp - attn-fuzz: overnight coverage-guided campaigns over attention kernels, and minimization.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "attnfuzz/device.h"
#include "attnfuzz/presets.h"
#include "attnfuzz/registry.h"
#include "fuzz/campaign.h"
#include "fuzz/sync.h"
#include "tools/cli_common.h"
#include "tools/worker_config.h"

namespace fs = std::filesystem;
using namespace attnfuzz;
using namespace attnfuzz::fuzz;

namespace {

// ---- the one options table of attn-fuzz (device / kernel / report options shared with attn-check) ----
struct Options {
  CommonOptions common;
  double max_time = 0;
  bool stop_when_each_fails = false;
  unsigned fuzz_workers = 0;
  std::string corpus;
  std::vector<std::string> seeds;
  bool no_seeds = false;
  bool mps = false;
  double progress = 5;
  int gpus = 0;
  int64_t max_seq = 160, max_d = 160;
  std::vector<std::string> fuzzer_args;
  std::string worker;
  std::string isolate = "auto";
  std::string minimize;
  double minimize_time = 60;
  double minimize_budget = -1;
  bool list = false, json = false;
  std::string sync, name;
  double sync_interval = 30;
  std::vector<std::string> merge;
  std::string compile_aware = "auto";  // fuzz/shape_pool.h
  double new_shape_share = 0.25;
};

void define_options(CLI::App& app, Options& o) {
  using namespace cli;
  o.common.order = "shuffle";  // campaigns default to shuffled thread order: races show in either direction
  o.common.timeout_s = 10;
  o.common.out = "reports/fuzz";
  add_common_options(app, o.common);
  // attn-check's --workers counts emulator threads; here it counts fuzzing processes (each emulates with 1).
  app.remove_option(app.get_option("--workers"));
  auto* c = "Campaign (most not with --merge, --minimize or --list)";
  std::vector<CLI::Option*> campaign;
  campaign.push_back(
      app.add_option("--max-time,-t", o.max_time, "stop after this many seconds (0: run until Ctrl-C)")
          ->group(c)
          ->check(real_range(0, 31536000, false))
          ->capture_default_str());
  campaign.push_back(app.add_flag("--stop-when-each-fails", o.stop_when_each_fails,
                                  "stop once each selected kernel has a distinct failure from this run (a kernel "
                                  "that hung and is quarantined counts): a check that known bugs are still "
                                  "found; --max-time stays the limit")
                         ->group(c));
  campaign.push_back(
      app.add_option("--workers,-j", o.fuzz_workers,
                     "fuzzing worker processes (libFuzzer -fork=N); 0: one per core on cpu, one per "
                     "GPU on GPUs")
          ->group(c)
          ->check(int_range(0, 1024))
          ->capture_default_str());
  campaign.push_back(
      app.add_option("--minimize-budget", o.minimize_budget,
                     "seconds, in all, for shrinking the new distinct failures when the workers end (after "
                     "--max-time; the summary shows the minimal cases); default a tenth of --max-time, at most "
                     "300 (30 without it); 0: none")
          ->group(c)
          ->check(real_range(0, 31536000, false)));
  campaign.push_back(
      app.add_option("--gpus", o.gpus, "GPU worker groups (HIP_/CUDA_VISIBLE_DEVICES per group); 0: detect")
          ->group(c)
          ->check(int_range(0, 64))
          ->capture_default_str());
  campaign.push_back(app.add_option("--corpus", o.corpus,
                                    "resumable corpus directory of .case files (default OUT/fuzz-corpus)")
                         ->group(c)
                         ->check(non_empty()));
  auto* seeds = app.add_option("--seeds", o.seeds,
                               "extra read-only .case directories (default: the source tree's corpus/seed)")
                    ->group(c)
                    ->check(CLI::ExistingDirectory);
  campaign.push_back(seeds);
  auto* no_seeds = app.add_flag("--no-seeds", o.no_seeds, "do not read the seed corpus")->group(c);
  campaign.push_back(no_seeds);
  campaign.push_back(app.add_flag("--mps", o.mps,
                                  "nvidia: the workers share each GPU through a private CUDA MPS daemon (their "
                                  "launches overlap instead of time-slicing; crash / hang verdicts are re-run "
                                  "alone outside MPS); default --workers: one per core")
                         ->group(c));
  seeds->excludes(no_seeds);
  campaign.push_back(app.add_option("--progress", o.progress, "seconds between progress lines")
                         ->group(c)
                         ->check(real_range(0.1, 86400, false))
                         ->capture_default_str());
  app.add_option("--max-seq", o.max_seq, "largest Sq and Sk the fuzzer generates")
      ->group(c)
      ->check(int_range(1, 65536))
      ->capture_default_str();
  app.add_option("--max-d", o.max_d, "largest D and Dv the fuzzer generates")
      ->group(c)
      ->check(int_range(1, 65536))
      ->capture_default_str();
  campaign.push_back(app.add_option("--fuzzer-arg", o.fuzzer_args,
                                    "extra libFuzzer flag for the workers, e.g. -seed=1 (repeatable)")
                         ->group(c)
                         ->allow_extra_args(false)
                         ->check(CLI::Validator(
                             [](std::string& in) {
                               return in.size() >= 2 && in[0] == '-' && in[1] != '-'
                                          ? std::string()
                                          : "'" + in + "' is not a libFuzzer flag: need -NAME=VALUE";
                             },
                             "-FLAG")));
  app.add_option("--isolate", o.isolate,
                 "cpu launches in a forked child: auto (after a kernel first kills a worker), always, never")
      ->group(c)
      ->check(CLI::IsMember({"auto", "always", "never"}))
      ->capture_default_str();
  campaign.push_back(
      app.add_option("--worker", o.worker,
                     "the libFuzzer worker binary (default: attn-fuzz-worker beside attn-fuzz)")
          ->group(c)
          ->check(executable_file()));
  campaign.push_back(
      app.add_option("--compile-aware", o.compile_aware,
                     "kernels that compile per shape (JIT) get most inputs on shapes they have compiled: auto "
                     "(adapter kernels that declare recompiles_per_shape, or whose first calls measure >= 4x their "
                     "repeat calls), on (every kernel), off (every input's shape as drawn)")
          ->group(c)
          ->check(CLI::IsMember({"auto", "on", "off"}))
          ->capture_default_str());
  campaign.push_back(
      app.add_option("--new-shape-share", o.new_shape_share,
                     "compile-aware kernels: a new shape is tried while first calls at new shapes took at most "
                     "this share of the kernel's check time (1: every new shape)")
          ->group(c)
          ->check(real_range(0, 1, false))
          ->capture_default_str());
  auto* sy = "Campaigns beyond one machine (fuzz/README.md)";
  auto* sync = app.add_option("--sync", o.sync,
                              "share corpus entries and distinct failures with the other campaigns syncing "
                              "through DIR (a shared file system; created if missing)")
                   ->group(sy)
                   ->check(writable_dir());
  campaign.push_back(sync);
  campaign.push_back(app.add_option("--sync-interval", o.sync_interval, "seconds between sync rounds")
                         ->group(sy)
                         ->check(real_range(0.1, 86400, false))
                         ->needs(sync)
                         ->capture_default_str());
  campaign.push_back(
      app.add_option("--name", o.name, "this campaign's name in DIR and merged summaries (default: the name of the campaign this OUT resumes, else HOST-PID)")
          ->group(sy)
          ->check(checked_by(&campaign_name_problem)));
  auto* merge = app.add_option("--merge", o.merge,
                               "write one deduplicated summary of these campaign directories (their --out) "
                               "into --out (default reports/merged)")
                    ->group(sy)
                    ->check(CLI::ExistingDirectory)
                    ->expected(1, -1);
  auto* m = "Mode (instead of a campaign)";
  auto* minimize = app.add_option("--minimize", o.minimize,
                                  "shrink the failing case of FILE (same kernel and class) and write it")
                       ->group(m)
                       ->check(existing_file());
  app.add_option("--minimize-time", o.minimize_time, "seconds the minimizer may spend")
      ->group(m)
      ->check(real_range(0, 31536000, true))
      ->needs(minimize)
      ->capture_default_str();
  auto* list = app.add_flag("--list", o.list, "list the registered kernels with what each declares, and exit")->group(m);
  app.add_flag("--json", o.json, "with --list: the same facts as one JSON document")->group(m)->needs(list);
  // A minimization is not a campaign: campaign flags with --minimize would be silently ignored.
  for (CLI::Option* x : campaign) minimize->excludes(x);
  list->excludes(minimize);
  for (CLI::Option* x : campaign) list->excludes(x);
  // A merge is not a campaign either (it only reads campaign directories).
  for (CLI::Option* x : campaign) merge->excludes(x);
  merge->excludes(minimize);
  merge->excludes(list);
}

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "attn-fuzz: %s\n", msg.c_str());
  std::exit(2);
}

std::string self_dir(const char* argv0) {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) p = fs::absolute(argv0);
  return p.parent_path().string();
}

// GPU ids to give one worker group each: the visible-devices variable if set, else the devices that open.
std::vector<std::string> gpu_groups(Backend b, int requested) {
  std::vector<std::string> ids;
  if (b == Backend::kCpu || b == Backend::kAdapter) return ids;
  const char* env = std::getenv(b == Backend::kNvidia ? "CUDA_VISIBLE_DEVICES" : "HIP_VISIBLE_DEVICES");
  if (env && *env) {
    std::string s = env;
    size_t pos = 0;
    while (pos <= s.size()) {
      const size_t comma = s.find(',', pos);
      const std::string id = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      if (!id.empty()) ids.push_back(id);
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  } else {
    for (int i = 0; i < 64; ++i) {
      DeviceOptions d;
      d.gpu_index = i;
      try {
        open_device(b, d);
      } catch (const std::exception&) {
        break;
      }
      ids.push_back(std::to_string(i));
    }
  }
  if (requested > 0 && static_cast<size_t>(requested) < ids.size())
    ids.resize(static_cast<size_t>(requested));
  return ids;
}

}  // namespace

// The option groups --help shows (--help-all: every group); the names are the groups' titles above.
static const std::set<std::string> kBriefHelp = {"Options", "Kernels and device", "Mode (instead of a campaign)",
                                          "Campaign (most not with --merge, --minimize or --list)"};

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"attn-fuzz: coverage-guided fuzzing campaigns over attention kernels (libFuzzer fork mode)",
               "attn-fuzz"};
  app.footer(R"(Examples:
  attn-fuzz --max-time 60                               # every kernel, cpu emulator when no GPU
  attn-fuzz --kernel 'flash-*' --max-time 28800 --out reports/night   # overnight; Ctrl-C stops and summarizes
  attn-fuzz --plugin build/lib/libattnfuzz_planted_cpu.so --kernel 'planted-*' --max-time 60
  attn-fuzz --backend nvidia --max-time 300             # one worker per visible GPU
  attn-fuzz --dtype f16 --adapter 'python3 -m attnfuzz.adapters.torch_sdpa --backends flash' --max-time 300
  attn-fuzz --minimize reports/fuzz/failures/mask-0123456789abcdef.case
  attn-fuzz --max-time 3600 --sync /shared/sync --out /shared/run/a   # many campaigns share one DIR
  attn-fuzz --merge /shared/run/a /shared/run/b --out /shared/run/merged
Resume: run again with the same --out (or --corpus); the corpus of .case files is read back.
Exit status: 0 no failure, 1 distinct failures found (see OUT/summary.md), 2 usage or input error.)");
  define_options(app, o);
  app.set_version_flag("--version", "attn-fuzz " ATTNFUZZ_VERSION);
  if (const int rc = cli::parse_or_exit_code(app, argc, argv, "attn-fuzz", kBriefHelp); rc >= 0) return rc;
  if (o.common.preset == "list") {
    std::fputs(preset_table().c_str(), stdout);
    return 0;
  }
  if (o.common.no_isolate && app.count("--isolate") && o.isolate != "never")
    usage_error("--no-isolate contradicts --isolate " + o.isolate);
  std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + shell_quote(argv[i]);
  if (!o.merge.empty())
    return merge_campaigns(o.merge, app.count("--out") ? o.common.out : std::string("reports/merged"),
                           command_line, o.common.quiet, o.common.fail_tiers);

  // Plug-ins and the backend, through the shared session code (it also checks that --out is writable).
  CommonOptions session_opts = o.common;
  session_opts.backend = o.common.backend;
  Backend backend = Backend::kCpu;
  if (!o.common.adapter.empty()) {
    if (o.common.backend != "auto" && o.common.backend != "adapter")
      usage_error("--adapter runs kernels in the adapter process: drop --backend " + o.common.backend);
    backend = Backend::kAdapter;
  } else if (o.common.backend == "auto") {
    for (Backend b : built_backends())
      if (backend_available(b)) {
        backend = b;
        break;
      }
  } else if (!parse_backend(o.common.backend, backend)) {
    usage_error("unknown --backend '" + o.common.backend + "': cpu, nvidia, amd or auto");
  } else if (std::string why; !backend_available(backend, &why)) {
    usage_error("backend " + o.common.backend + " cannot be used: " + why);
  }
  if (o.mps && backend != Backend::kNvidia)
    usage_error(std::string("--mps shares a GPU between the workers through CUDA MPS: it needs the nvidia backend, "
                            "not ") + backend_name(backend));
  session_opts.backend = backend_name(backend);
  Session s = open_session(session_opts, "attn-fuzz", argc, argv);
  if (o.list) {
    list_kernels(s, o.json);
    return 0;
  }
  s.set_device(nullptr);  // the workers open their own devices

  WorkerConfig w = cli::common_worker_config(o.common, backend);
  w.isolate = o.common.no_isolate ? "never" : o.isolate;
  w.limits.max_seq = o.max_seq;
  w.limits.max_dim = o.max_d;
  if (!o.common.preset
           .empty())  // issue 28 item 9: cases near a model's geometry (fuzz/codec.h FuzzLimits::preset)
    if (std::string e = fuzz::set_preset(w.limits, o.common.preset); !e.empty()) usage_error(e);
  if (has_backward(case_pass(o.common)) && case_dtype(o.common) > AF_DTYPE_BF16)
    usage_error("--pass " + o.common.pass + " is checked in f32, f16 and bf16 only: drop --dtype " + o.common.dtype);
  w.out = o.common.out;
  w.command = command_line;
  w.reports = !o.common.no_reports;
  w.compile_aware = o.compile_aware;
  w.new_shape_share = o.new_shape_share;

  if (!o.minimize.empty()) {
    MinimizeOptions mo;
    mo.max_time_s = o.minimize_time;
    mo.out_dir = (fs::path(o.common.out) / "minimized").string();
    mo.quiet = o.common.quiet;
    WorkerConfig here = w;
    here.plugins.clear();  // already loaded into this process by open_session
    return minimize_file(o.minimize, here, mo);
  }

  CampaignOptions c;
  c.worker = w;
  c.worker_binary = o.worker.empty() ? self_dir(argv[0]) + "/attn-fuzz-worker" : o.worker;
  c.corpus_dir = o.corpus.empty() ? (fs::path(o.common.out) / "fuzz-corpus").string() : o.corpus;
  if (!o.no_seeds) {
    c.seed_dirs = o.seeds;
#ifdef ATTNFUZZ_SOURCE_DIR
    if (o.seeds.empty()) c.seed_dirs.push_back(std::string(ATTNFUZZ_SOURCE_DIR) + "/corpus/seed");
#endif
  }
  c.gpu_ids = gpu_groups(backend, o.gpus);
  if (backend != Backend::kCpu && backend != Backend::kAdapter && c.gpu_ids.empty()) usage_error("no GPU of backend " + w.backend + " found");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  c.workers = o.fuzz_workers                 ? o.fuzz_workers
              : backend == Backend::kCpu     ? cores
              : backend == Backend::kAdapter ? 1  // each worker process starts its own adapter
              : o.mps                        ? std::max(cores, static_cast<unsigned>(c.gpu_ids.size()))
                                             : static_cast<unsigned>(c.gpu_ids.size());
  c.mps = o.mps;
  c.worker.mps = o.mps;
  c.max_time_s = o.max_time;
  c.stop_when_each_fails = o.stop_when_each_fails;
  c.progress_s = o.progress;
  c.fuzzer_args = o.fuzzer_args;
  c.command_line = command_line;
  c.quiet = o.common.quiet;
  c.sync_dir = o.sync;
  c.name = o.name;
  c.max_failures = o.common.max_failures;
  c.all_failures = o.common.all_failures;
  c.sync_interval_s = o.sync_interval;
  c.minimize_budget_s = o.minimize_budget;
  c.fail_tiers = o.common.fail_tiers;
  return run_campaign(c);
}
