// cli_common.h - what attn-check and attn-fuzz share: device/kernel options, session set-up, checking and
// reporting.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "attnfuzz/corpus.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "attnfuzz/report.h"
#include "check/classify.h"
#include "check/runner.h"
#include "report/tiers.h"

// CLI11 by name only: its header costs about 5 CPU s per file (namespace-scope validators compiled in each), so only
// the files that build a CLI::App include <CLI/CLI.hpp> (issue 32).
namespace CLI {
class App;
class Option;
class Validator;
}  // namespace CLI

namespace attnfuzz {

// Options every tool has (one table: add_common_options).
struct CommonOptions {
  std::string kernel = "all";  // names or globs, comma separated
  std::string backend = "auto";
  std::vector<std::string> plugins;
  std::string adapter;                 // --adapter CMD: kernels of an external process (adapters/PROTOCOL.md)
  std::string out = "reports";
  std::string order = "shuffle";  // cpu emulator thread order (shuffle: a missing barrier shows either way)
  uint64_t order_seed = 1;
  unsigned workers = 0;
  unsigned warp_size = 32;
  double timeout_s = 30;
  double compile_timeout_s = 300;  // adapters: a JIT kernel's first call at a new problem (DeviceOptions)
  bool no_isolate = false;
  int64_t oracle_rows = 0;  // 0 = every row; else a sampled budget
  int mp_bits = 128;
  std::string values = "ieee";  // value domain of generated cases: ieee | finite | activations (case.h)
  std::string dtype = "f32";    // dtype of generated cases: f32 | f16 | bf16 | fp8-e4m3 | fp8-e5m2 (attn-fuzz: | any)
  std::string pass = "fwd";     // pass of generated cases: fwd | bwd | fwdbwd (case.h Pass)
  // Score variants of generated cases (issue 28; case.h VariantSpec): sink, softcap, alibi, bias ('+' or ','
  // separated, or all); with --sweep the variant sweep (variant_sweep_grid).
  std::string variant;
  // A model preset (include/attnfuzz/presets.h; 'list' lists them): attn-check --sweep runs its geometry's
  // grid, attn-fuzz keeps decoded shapes near it (fuzz/codec.h FuzzLimits::preset).
  std::string preset;
  float softcap = 30;
  double sink_range = 2, bias_range = 1;
  std::string bias_broadcast;  // subset of "bhij"
  // Dropout (issue 29; attnfuzz/dropout.h): --dropout P (>= 0: every generated case uses dropout with p = P; with
  // --sweep the whole sweep grid at P); --variant dropout --sweep is the dropout sweep (dropout_sweep_grid).
  double dropout = -1;
  std::string dropout_rng = "philox-flash";
  uint64_t dropout_seed = 1, dropout_offset = 0;
  // Custom masks (--variant mask-dense | mask-bits | block-sparse; case.h set_mask_variants)
  std::string mask_pattern = "random:0.5", block_pattern = "mixed", mask_broadcast;  // broadcast: subset of "bhi"
  int32_t block_q = 16, block_k = 16;
  bool quiet = false;
  bool no_reports = false;
  // bounded output (issue 26): failures shown with evidence and a heatmap per kernel x class; the rest counted
  int64_t max_failures = 1;
  bool all_failures = false;  // every failure with all its evidence, and a heatmap each
  // failure classification (check/classify.h)
  bool no_classify = false;
  int reruns = 5;     // GPU bitwise reruns of a failing case
  bool tsan = false;  // cpu: re-run failing cases in the TSan build of attn-check
  std::string tsan_binary;
  std::vector<std::string> tsan_plugins;
  bool compute_sanitizer = false;        // nvidia: racecheck / synccheck / memcheck on failing cases
  // attn-check --repeat-calls (check/repeat.h): every case right after the same shape with another scale
  bool repeat_calls = false;
  // --amplify of both tools (check/repeat.h amplify_passing): a passing variant case's sibling with the
  // parameter amplified
  bool amplify = false;
  // audit of passing cases (attn-check --audit; check/classify.h audit_passing_case)
  bool audit = false;
  int64_t audit_every = 8;               // every N-th passing check of each kernel (the first included)
  // Issue 30: the input tiers (case.h InputTier) whose failures count for the exit status: "all" or a comma
  // list of ordinary, extreme, non-finite-visible, non-finite-masked (--fail-tiers of both tools; tiers.h).
  std::string fail_tiers = "all";
};
void add_common_options(CLI::App& app, CommonOptions& o);
// The --values domain (add_common_options accepts only ieee, finite and activations).
ValueDomain value_domain(const CommonOptions& o);
// The --dtype of generated cases (af_dtype), or -1 for "any".
int32_t case_dtype(const CommonOptions& o);
// The --pass of generated cases (add_common_options accepts only fwd, bwd and fwdbwd).
Pass case_pass(const CommonOptions& o);
// The --variant bits (AF_VARIANT_*; "all" = the four checked score variants; --dropout P adds dropout), 0 when none.
uint32_t case_variants(const CommonOptions& o);
// Applies --variant, --softcap, --sink-range, --bias-range, --bias-broadcast to a case built from flags. Returns an
// error sentence or empty.
std::string apply_variant_options(const CommonOptions& o, Case& c);
// Applies --dropout (0.1 when only --variant dropout asked for it), --dropout-rng, --dropout-seed, --dropout-offset.
std::string apply_dropout_options(const CommonOptions& o, Case& c);

// Validators of the option tables (one set for every tool): each refuses a value with one line naming the
// allowed range; CLI11 prefixes the flag ("--sk: Value -1 not in range 0 to 2147483648"). Words and
// directories use CLI11's own (CLI::IsMember, CLI::ExistingDirectory); these are the checks CLI11 2.1 has no
// validator for, or whose CLI11 validator lets through what the tools refuse (each says why in cli_common.cpp).
namespace cli {
CLI::Validator int_range(int64_t lo, int64_t hi);  // a decimal integer (no octal), then CLI::Range(lo, hi)
CLI::Validator u64();  // a 64-bit unsigned integer, decimal or 0x hex (a transform: ->transform(u64()))
bool parse_u64(const std::string& text, uint64_t& out);         // the same parse: false on junk or overflow
CLI::Validator real_range(double lo, double hi, bool lo_open);  // a finite number in [lo|(lo, hi]
CLI::Validator non_empty();                                     // a non-empty string
CLI::Validator kernel_list();                                   // NAME|GLOB[,NAME|GLOB...], no empty item
CLI::Validator existing_file();                                 // a regular file that exists
CLI::Validator executable_file();                               // a regular file with execute permission
CLI::Validator writable_file();  // a path a file can be written at: not a directory, its directory writable
CLI::Validator writable_dir();  // a directory this process can write (created, with its parents, if missing)
CLI::Validator checked_by(std::string (*parse)(const std::string&));  // parse returns "" or the problem
// Parses argv; on a usage error prints "TOOL: message" (one line) and returns 2, on --help 0; else -1.
// brief_groups: the option groups --help prints (the others are named in one line, and --help-all prints every
// group); empty: --help prints every group.
int parse_or_exit_code(CLI::App& app, int argc, char** argv, const std::string& tool,
                       const std::set<std::string>& brief_groups = {});
}  // namespace cli

// Sequence-layout options (varlen / KV cache / paged KV / decode; README "Varlen, KV cache, paged KV"), one
// table for every tool that builds a case from flags.
struct SequenceOptions {
  std::string layout;  // "" (dense) | dense | varlen | varlen-q | varlen-k | kvcache | paged | decode
  std::string seqlens_q, seqlens_k, seqused_k;  // comma-separated per-sequence lengths
  int64_t page_size = 16;
  uint64_t page_order = 0;  // 0: pages in order; else the seed of the pool's shuffle
  int64_t spare_pages = 0;
  std::string malformed;  // --malformed KIND[@SEQ]: a defect in the arrays the kernel gets (case.h Malformation)
  // Which flags were typed (app.count), for the contradictions apply_sequence_options refuses.
  struct Given {
    bool batch = false, sq = false, sk = false, page_size = false, page_order = false, spare_pages = false;
  } given;
};
// "3,0,17": lengths in [0, 10^9], no empty item (std::from_chars). False on anything else.
bool parse_lengths(const std::string& text, std::vector<int64_t>& out);
// Adds --seq-layout, --seqlens-q, --seqlens-k, --seqused-k, --page-size, --page-order, --spare-pages, --malformed to group
// `group`; returns the per-case options (all but --seq-layout, which also selects a layout sweep).
std::vector<CLI::Option*> add_sequence_options(CLI::App& app, SequenceOptions& o, const char* group);
// Applies them to a dense case built from the shape flags (batch = the number of listed lengths; for kvcache
// --sk is the capacity). Returns an error sentence or empty; the case is validated by the caller.
std::string apply_sequence_options(const SequenceOptions& o, Case& c);

// Memory a check of c takes (estimated from its tensors' elements), and a refusal sentence when that is more
// than the machine has available (checked before generating anything: a case too large for the machine is
// refused with the limit named, never left to grow until the OOM killer ends the tool).
constexpr double kCaseMemoryCopies = 3;  // measured: peak RSS of a paged case with 65536 spare pages
uint64_t case_memory_bytes(const Case& c);
std::string memory_refusal(const Case& c);

// "1 check", "2 checks": a count with its noun in the right number.
std::string count_of(int64_t n, const std::string& noun);

// " --adapter 'CMD'" when o names one (replay commands), else empty.
std::string adapter_flag(const CommonOptions& o);

struct Session {
  std::string tool;  // "attn-check"
  std::string command_line;
  CommonOptions opts;
  Registry* registry = nullptr;
  std::unique_ptr<Device> device;
  RunOptions run;  // run.pool: guarded buffers reused between checks on `device` (destroyed before it)
  ClassifyOptions classify;
  // Closes the device (its pool first), or opens `d` (with a new pool).
  void set_device(std::unique_ptr<Device> d);
};
// Loads plug-ins, opens the device, checks --out is writable. Exits 2 with a message on bad input.
Session open_session(const CommonOptions& o, const std::string& tool, int argc, char** argv);
// The device of the options (--backend, --adapter, --order, --timeout, ...), as open_session opens it: to
// open it again after a step that needs it closed (attn-check --bug-report --minimize). Exits 2 with a
// message.
std::unique_ptr<Device> open_tool_device(const CommonOptions& o, const std::string& tool);
// --list: one aligned row per registered kernel with what it declares (tools/kernel_list.cpp); json: the same
// facts as one JSON document.
void list_kernels(const Session& s, bool json = false);

// Runs checks one after another, prints progress and verdicts, saves failing cases into <out>/corpus,
// and at the end prints the summary table and writes the reports.
class Runner {
 public:
  Runner(Session& s, const CommonOptions& o);
  void begin(int64_t total_checks);
  const Judged& check(const KernelEntry& k, PreparedCase& pc, const std::string& origin);
  // Records a check judged elsewhere (outputs read from NPY files) exactly like check(): verdict line,
  // heatmap, report entry. A non-empty replay_command is printed as the failure's replay line and the
  // case is not saved to the corpus (its inputs are files, not a generated case).
  const Judged& record(const Case& the_case, Judged judged, const std::string& replay_command);
  // Prints the summary, writes the reports; returns the exit code (0 all pass, 1 any failure).
  int finish();
  const std::vector<RunEntry>& entries() const { return entries_; }
  // A replayed file's recorded verdict against the new one: printed at once for a single check; in a run of
  // several, a DIFFERENT one is listed after the first line and reproduced ones are counted (--all-failures:
  // every line).
  void replay_verdict(const std::string& line, bool same);

 private:
  struct Shown {  // a failure shown in a run of several checks (printed by finish, after the first line)
    std::string kernel, cls, head, body, replay;
    int64_t elements = 0;  // the case's size: the smallest first failure is where to start
  };
  bool several() const { return total_ >= 2; }
  int tier_exit_status() const;
  // The verdict line and the lines under it; condensed: the deciding evidence only.
  std::pair<std::string, std::string> verdict_text(const Case& c, const RunEntry& rec, bool condensed) const;
  void print_results();       // the first line, the failures shown, the replayed verdicts (several checks)
  void print_table() const;   // one row per kernel (several checks, bounded: the ones that failed, the rest grouped)
  std::string replay_command_for(const CheckResult& r, const std::string& corpus_path) const;
  void progress(bool final);
  std::string write_heatmap(const RunEntry& e, const std::vector<double>& ratio_map);
  // Backward checks: one SVG per gradient tensor with a failing element; returns the failing tensor's.
  std::string write_grad_heatmaps(const RunEntry& e, const std::vector<GradMap>& maps);
  Session& s_;
  CommonOptions o_;
  std::vector<RunEntry> entries_;
  Judged last_;
  int64_t total_ = 0, done_ = 0, failures_ = 0;
  std::map<std::string, int64_t> passes_;  // passing checks per kernel (audit sampling)
  int64_t audited_ = 0, audit_found_ = 0;
  std::chrono::steady_clock::time_point start_, last_progress_;
  bool tty_ = false;
  int last_decile_ = -1;  // progress not on a terminal: a line each tenth of the run (or minute)
  FailureTally tally_;
  std::vector<Shown> shown_;
  std::vector<std::string> replay_lines_;
  int64_t replays_ = 0, reproduced_ = 0;
};

}  // namespace attnfuzz
