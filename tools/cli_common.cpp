// cli_common.cpp - shared tool plumbing: options, session, progress line, verdict lines, corpus saving,
// reports.
#include "tools/cli_common.h"

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "attnfuzz/dropout.h"
#include "check/repeat.h"

namespace fs = std::filesystem;

namespace attnfuzz {

namespace cli {

namespace {
// Whole-string decimal integer (std::from_chars: no sign but '-', no space, no junk, no overflow). A leading
// zero is refused ("010"): CLI11 converts with base 0 and would read it as octal.
bool parse_i64(const std::string& s, int64_t& out) {
  const char *b = s.data(), *e = s.data() + s.size();
  const size_t digit = !s.empty() && s[0] == '-' ? 1 : 0;
  if (s.size() > digit + 1 && s[digit] == '0') return false;
  const auto [p, ec] = std::from_chars(b, e, out, 10);
  return ec == std::errc() && p == e && b != e;
}
}  // namespace

bool parse_u64(const std::string& s, uint64_t& out) {
  const bool hex = s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
  const char *b = s.data() + (hex ? 2 : 0), *e = s.data() + s.size();
  if (b == e || *b == '-' || *b == '+') return false;
  const auto [p, ec] = std::from_chars(b, e, out, hex ? 16 : 10);
  return ec == std::errc() && p == e;
}

namespace {
std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.10g", v);
  return b;
}
}  // namespace

CLI::Validator int_range(int64_t lo, int64_t hi) {
  // CLI::Range judges the range (and words the refusal); the decimal check comes first because CLI11 2.1
  // converts integers with strtoll base 0, which reads "010" as 8 and "0x10" as 16.
  const CLI::Range range(lo, hi);
  return CLI::Validator(
      [range](std::string& in) -> std::string {
        int64_t v = 0;
        if (!parse_i64(in, v)) return "'" + in + "' is not an integer (decimal, no leading zero)";
        return range(in);
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

CLI::Validator u64() {
  // Not CLI11's conversion: a seed is decimal or 0x hex (as reports print it), never octal (CLI11 2.1 reads
  // unsigned integers with strtoull base 0).
  return CLI::Validator(
      [](std::string& in) -> std::string {
        uint64_t v = 0;
        if (!parse_u64(in, v))
          return "'" + in + "' is not an integer in [0, 18446744073709551615] (decimal or 0x hex)";
        in = std::to_string(v);  // a transform: CLI11 then reads plain decimal
        return {};
      },
      "UINT64");
}

CLI::Validator real_range(double lo, double hi, bool lo_open) {
  // Not CLI::Range<double>: NaN passes it (every comparison with NaN is false), it has no open bound, and its
  // refusal prints the bounds with std::to_string ("0.100000").
  const std::string range =
      std::string("a finite number in ") + (lo_open ? "(" : "[") + num(lo) + ", " + num(hi) + "]";
  return CLI::Validator(
      [lo, hi, lo_open, range](std::string& in) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(in.c_str(), &end);
        if (in.empty() || end != in.c_str() + in.size() || std::isspace(static_cast<unsigned char>(in[0])))
          return "'" + in + "' is not " + range;
        if (!std::isfinite(v) || (lo_open ? v <= lo : v < lo) || v > hi)
          return in + " is out of range: " + range;
        return {};
      },
      std::string("NUMBER in ") + (lo_open ? "(" : "[") + num(lo) + ", " + num(hi) + "]");
}

CLI::Validator non_empty() {
  return CLI::Validator(
      [](std::string& in) { return in.empty() ? std::string("must not be empty") : std::string(); }, "TEXT");
}

CLI::Validator kernel_list() {
  // A whole-string check, not ->delimiter(','): CLI11 2.1 splits on the delimiter and drops empty items
  // (Option::_add_result), so "online-row,,naive" would read as two names instead of being refused.
  return CLI::Validator(
      [](std::string& in) -> std::string {
        const std::string need = "a comma-separated list of kernel names or globs ('all'), none empty";
        if (in.empty()) return "'' is empty: need " + need;
        size_t start = 0;
        while (true) {
          const size_t comma = in.find(',', start);
          if ((comma == std::string::npos ? in.size() : comma) == start)
            return "'" + in + "' has an empty name: need " + need;
          if (comma == std::string::npos) break;
          start = comma + 1;
        }
        return {};
      },
      "NAMES");
}

CLI::Validator existing_file() {
  // Not CLI::ExistingFile: it accepts anything that exists and is not a directory, so a FIFO or /dev/zero
  // given as --plugin or --q would be opened (and read forever).
  return CLI::Validator(
      [](std::string& in) -> std::string {
        std::error_code ec;
        if (in.empty()) return "'' is empty: need an existing file";
        if (!fs::exists(in, ec)) return in + ": no such file";
        if (!fs::is_regular_file(in, ec)) return in + ": not a regular file";
        return {};
      },
      "FILE");
}

CLI::Validator executable_file() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        std::error_code ec;
        if (in.empty()) return "'' is empty: need an executable file";
        if (!fs::is_regular_file(in, ec)) return in + ": no such regular file";
        if (::access(in.c_str(), X_OK) != 0) return in + ": not executable";
        return {};
      },
      "FILE");
}

CLI::Validator writable_file() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        std::error_code ec;
        if (in.empty()) return "'' is empty: need a file name";
        if (fs::is_directory(in, ec)) return in + ": is a directory";
        if (fs::exists(in, ec) && !fs::is_regular_file(in, ec)) return in + ": not a regular file";
        if (fs::exists(in, ec) ? ::access(in.c_str(), W_OK) != 0 : false) return in + ": not writable";
        const fs::path dir = fs::path(in).has_parent_path() ? fs::path(in).parent_path() : fs::path(".");
        if (!fs::is_directory(dir, ec)) return in + ": no directory " + dir.string();
        if (::access(dir.c_str(), W_OK | X_OK) != 0)
          return in + ": directory " + dir.string() + " not writable";
        return {};
      },
      "FILE");
}

CLI::Validator writable_dir() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        std::error_code ec;
        if (in.empty()) return "'' is empty: need a directory";
        if (fs::exists(in, ec) && !fs::is_directory(in, ec)) return in + ": not a directory";
        fs::create_directories(in, ec);
        if (ec) return in + ": cannot create the directory: " + ec.message();
        if (::access(in.c_str(), W_OK | X_OK) != 0) return in + ": not writable";
        return {};
      },
      "DIR");
}

CLI::Validator checked_by(std::string (*parse)(const std::string&)) {
  return CLI::Validator([parse](std::string& in) { return parse(in); }, "TEXT");
}

namespace {
// --help as every tool prints it: "--flag TYPE=DEFAULT" and the description wrapped beside it. CLI11 2.1's
// own formatter joins the option's type and its validators' descriptions ("UINT:UINT64", "INT:INT in [1, 8]")
// and appends every Excludes: name (50 of them on --sweep); here the validator's description alone names the
// type, Needs becomes "(needs --tsan)", a short Excludes list "(not with --no-classify)", and a long one is
// left to the group's title, which states the rule ("Case (not with --sweep / --replay ...)").
class HelpFormatter : public CLI::Formatter {
 public:
  static constexpr size_t kWidth = 110;  // characters per line
  static constexpr size_t kMaxExcludes = 2;
  // brief: the groups --help prints in full (the others are named in one line; --help-all prints them);
  // empty:
  // --help prints every group.
  explicit HelpFormatter(std::set<std::string> brief) : brief_(std::move(brief)) { column_width(30); }

  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    if (mode != CLI::AppFormatMode::Normal || brief_.empty())
      return CLI::Formatter::make_help(app, name, mode);
    std::string out = make_description(app) + make_usage(app, name) + make_positionals(app), rest;
    for (const std::string& group : app->get_groups()) {
      const std::vector<const CLI::Option*> opts = app->get_options(
          [&](const CLI::Option* o) { return o->get_group() == group && o->nonpositional(); });
      if (group.empty() || opts.empty()) continue;
      if (brief_.count(group)) {
        out += make_group(group, false, opts) + "\n";
      } else {
        const std::string title = group.substr(0, group.find(" ("));
        rest += (rest.empty() ? "" : ", ") + title + fmt_count(opts.size());
      }
    }
    if (!rest.empty()) out += wrap("More options (--help-all): " + rest + ".", kWidth) + "\n";
    return out + "\n" + make_footer(app);
  }

  std::string make_option_opts(const CLI::Option* opt) const override {
    if (!opt->get_option_text().empty()) return " " + opt->get_option_text();
    if (opt->get_type_size() == 0) return {};
    std::string type = opt->get_type_name();
    if (const size_t colon = type.find(':'); colon != std::string::npos) type = type.substr(colon + 1);
    std::string out = " " + type;
    if (!opt->get_default_str().empty()) out += "=" + opt->get_default_str();
    if (opt->get_expected_max() == CLI::detail::expected_max_vector_size) out += " ...";
    if (opt->get_required()) out += " REQUIRED";
    return out;
  }

  std::string make_option_desc(const CLI::Option* opt) const override {
    std::string d = opt->get_description();
    auto names = [](const std::set<CLI::Option*>& opts) {
      std::vector<std::string> v;
      for (const CLI::Option* o : opts) v.push_back(o->get_name());
      std::sort(v.begin(), v.end());
      std::string s;
      for (const auto& n : v) s += (s.empty() ? "" : ", ") + n;
      return s;
    };
    if (!opt->get_needs().empty()) d += " (needs " + names(opt->get_needs()) + ")";
    if (!opt->get_excludes().empty() && opt->get_excludes().size() <= kMaxExcludes)
      d += " (not with " + names(opt->get_excludes()) + ")";
    return wrap(d, kWidth - get_column_width());
  }

 private:
  std::set<std::string> brief_;

  static std::string fmt_count(size_t n) {
    return " (" + std::to_string(n) + (n == 1 ? " option)" : " options)");
  }
  // d wrapped at word boundaries into lines of at most `room` characters; CLI11 indents each line after a
  // '\n' to the description column.
  static std::string wrap(const std::string& d, size_t room) {
    std::string out, line;
    size_t at = 0;
    while (at < d.size()) {
      size_t end = d.find(' ', at);
      if (end == std::string::npos) end = d.size();
      const std::string word = d.substr(at, end - at);
      if (!line.empty() && line.size() + 1 + word.size() > room) {
        out += line + "\n";
        line.clear();
      }
      line += (line.empty() ? "" : " ") + word;
      at = end + 1;
    }
    return out + line;
  }
};
}  // namespace

int parse_or_exit_code(CLI::App& app, int argc, char** argv, const std::string& tool,
                       const std::set<std::string>& brief_groups) {
  if (!brief_groups.empty()) app.set_help_all_flag("--help-all", "every option, by topic");
  app.formatter(std::make_shared<HelpFormatter>(brief_groups));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::string msg = e.what();
    for (char& c : msg)
      if (c == '\n') c = ' ';
    std::fprintf(stderr, "%s: %s (see --help)\n", tool.c_str(), msg.c_str());
    return 2;
  }
  return -1;
}

}  // namespace cli


namespace {

// Kernels and device: --kernel, --backend, plug-ins, workers.
void add_kernel_options(CLI::App& app, CommonOptions& o) {
  using namespace cli;
  auto* k = "Kernels and device";
  app.add_option("--kernel", o.kernel, "kernel names or globs, comma separated ('all')")
      ->group(k)
      ->check(kernel_list())
      ->capture_default_str();
  app.add_option("--backend,-b", o.backend,
                 "cpu | nvidia | amd | auto (a GPU backend with a device, else cpu)")
      ->group(k)
      ->check(CLI::IsMember({"cpu", "nvidia", "amd", "auto"}))
      ->capture_default_str();
  app.add_option("--plugin", o.plugins, "load kernels from a plug-in shared library (repeatable)")
      ->group(k)
      ->check(existing_file());
  app.add_option(
         "--adapter", o.adapter,
         "run the kernels of an adapter process started with this shell command (adapters/PROTOCOL.md), "
         "e.g. 'python3 -m attnfuzz.adapters.numpy_ref'")
      ->group(k)
      ->check(non_empty());
  app.add_option("--order", o.order, "cpu emulator thread order in each round: forward | reverse | shuffle")
      ->group(k)
      ->check(CLI::IsMember({"forward", "reverse", "shuffle"}))
      ->capture_default_str();
  app.add_option("--order-seed", o.order_seed, "seed of --order shuffle (decimal or 0x hex)")
      ->group(k)
      ->transform(u64())
      ->capture_default_str();
  app.add_option("--workers", o.workers, "cpu emulator OS threads (0 = all cores)")
      ->group(k)
      ->check(int_range(0, 1024))
      ->capture_default_str();
  app.add_option("--warp-size", o.warp_size, "cpu emulator warp size: 32 or 64")
      ->group(k)
      ->check(CLI::IsMember({"32", "64"}))
      ->capture_default_str();
  app.add_option("--timeout", o.timeout_s, "seconds before a launch counts as a hang")
      ->group(k)
      ->check(real_range(0, 86400, true))
      ->capture_default_str();
  app.add_option("--compile-timeout", o.compile_timeout_s,
                 "--timeout of a compiling adapter kernel's first call at a problem")
      ->group(k)
      ->check(real_range(0, 86400, true))
      ->capture_default_str();
  app.add_flag("--no-isolate", o.no_isolate, "cpu: run launches in-process (faster; a crash ends the tool)")
      ->group(k);
}

// Oracle and reports, the case side: rows, arbiter bits, value domain, dtype, pass.
void add_oracle_options(CLI::App& app, CommonOptions& o) {
  using namespace cli;
  auto* r = "Oracle and reports";
  app.add_option("--oracle-rows", o.oracle_rows,
                 "check about N query rows (tile edges, fully masked and non-finite rows always); 0 = all")
      ->group(r)
      ->check(int_range(0, kMaxElements))
      ->capture_default_str();
  app.add_option("--mp-bits", o.mp_bits, "bits of the multiprecision arbiter (>= 100)")
      ->group(r)
      ->check(int_range(100, 4096))
      ->capture_default_str();
  app.add_option(
         "--values", o.values,
         "value domain of generated cases: ieee (NaN, +-Inf, subnormals, -0, FLT_MAX) | finite (the same "
         "without NaN and Inf) | activations (LLM-like: finite, |x| <= 64, outlier channels, scale near "
         "1/sqrt(D), no special value but -0; always the ordinary tier); replay uses the domain recorded in "
         "the file")
      ->group(r)
      ->check(CLI::IsMember({"ieee", "finite", "activations"}))
      ->capture_default_str();
  app.add_option(
         "--dtype", o.dtype,
         "element type of q, k, v, o in generated cases: f32 | f16 | bf16 | fp8-e4m3 | fp8-e5m2 (fp8: with "
         "descale factors); attn-fuzz also any; replay uses the dtype recorded in the file")
      ->group(r)
      ->check(CLI::IsMember({"f32", "f16", "bf16", "fp8-e4m3", "fp8-e5m2", "any"}))
      ->capture_default_str();
  app.add_option(
         "--pass", o.pass,
         "pass of generated cases: fwd (O, LSE) | bwd (dQ, dK, dV of the backward launch given the exact O "
         "and LSE) | fwdbwd (the kernel's own forward feeds its backward); replay uses the file's pass")
      ->group(r)
      ->check(CLI::IsMember({"fwd", "bwd", "fwdbwd"}))
      ->capture_default_str();
}

// Score variants and dropout.
void add_variant_options(CLI::App& app, CommonOptions& o) {
  using namespace cli;
  auto* vg = "Score variants (docs/semantics.md \"Variants\")";
  app.add_option("--preset", o.preset,
                 "a model preset's geometry ('list' lists them): attn-check --sweep runs its grid instead of "
                 "the edge "
                 "grid; attn-fuzz keeps its cases near it (its heads, D and Dv within 8, its mask, softcap "
                 "and sinks)")
      ->group(vg);
  app.add_option(
         "--variant", o.variant,
         "variants of generated cases: sink, softcap, alibi, bias, mask-dense, mask-bits, block-sparse, "
         "dropout, head-descale (per-head fp8 descales: fp8 dtypes only; its sweep is fp8-e4m3 unless "
         "--dtype fp8-e5m2), kv-shared (MLA: V the first Dv columns of K's rows, one buffer; Dv <= D), '+' "
         "or "
         "',' separated, or all (one case: mask-dense, not mask-bits; the sweep: both; never head-descale or "
         "kv-shared); with --sweep the variant sweep; with --seq-layout only sink, softcap, alibi and kv-shared (per "
         "sequence); a kernel that does not declare one is unsupported")
      ->group(vg)
      ->check(checked_by([](const std::string& t) -> std::string {
        uint32_t bits = 0;
        if (t == "all") return {};
        std::string e = parse_variant_names(t, bits);
        if (e.empty() && (bits & ~kCheckedVariants))
          e = "only sink, softcap, alibi, bias, mask-dense, mask-bits, block-sparse, dropout, head-descale "
              "and "
              "kv-shared are checked";
        return e;
      }));
  auto* dg = "Dropout (docs/semantics.md \"Dropout\")";
  app.add_option(
         "--dropout", o.dropout,
         "dropout probability P in [0, 1) of generated cases (implies --variant dropout); with --sweep the "
         "sweep grid at P (--variant dropout --sweep: the dropout sweep)")
      ->group(dg)
      ->check(real_range(0, 1, false));
  app.add_option("--dropout-rng", o.dropout_rng,
                 "where the keep mask comes from: exported (the kernel writes it) | philox-flash (Philox in "
                 "FlashAttention's layout, reproduced by the tool)")
      ->group(dg)
      ->check(CLI::IsMember({"exported", "philox-flash"}))
      ->capture_default_str();
  app.add_option("--dropout-seed", o.dropout_seed, "the generator's seed")->group(dg)->capture_default_str();
  app.add_option("--dropout-offset", o.dropout_offset,
                 "the generator's counter offset (past 2^32 tests wrapping)")
      ->group(dg)
      ->capture_default_str();
  app.add_option("--softcap", o.softcap, "with --variant softcap: s <- CAP tanh(s / CAP)")
      ->group(vg)
      ->check(real_range(0, 3e38, true))
      ->capture_default_str();
  app.add_option("--sink-range", o.sink_range,
                 "with --variant sink: generated sink logits uniform in [-R, R]")
      ->group(vg)
      ->check(real_range(0, 1e30, true))
      ->capture_default_str();
  app.add_option("--bias-range", o.bias_range, "with --variant bias: generated bias uniform in [-R, R]")
      ->group(vg)
      ->check(real_range(0, 1e30, true))
      ->capture_default_str();
  app.add_option(
         "--bias-broadcast", o.bias_broadcast,
         "with --variant bias: the dimensions the bias is broadcast over (stride 0), a subset of bhij "
         "(b batch, h query head, i query row, j key), e.g. bh")
      ->group(vg)
      ->check(checked_by([](const std::string& t) -> std::string {
        for (char ch : t)
          if (ch != 'b' && ch != 'h' && ch != 'i' && ch != 'j') return "'" + t + "' is not a subset of bhij";
        return {};
      }));
  app.add_option(
         "--mask-pattern", o.mask_pattern,
         "with --variant mask-dense / mask-bits: random:D | rows:D (D in [0, 1]; rows: some rows fully "
         "masked) | ones | zeros | causal")
      ->group(vg)
      ->check(checked_by([](const std::string& t) { return validate_mask_pattern(t, true); }))
      ->capture_default_str();
  app.add_option("--block-pattern", o.block_pattern,
                 "with --variant block-sparse: mixed | full | partial | empty-some | zeros (0 empty, 1 full, "
                 "2 partial "
                 "blocks; a partial block's keys are the custom mask's)")
      ->group(vg)
      ->check(checked_by([](const std::string& t) { return validate_mask_pattern(t, false); }))
      ->capture_default_str();
  app.add_option("--block-q", o.block_q, "with --variant block-sparse: query rows per block")
      ->group(vg)
      ->check(int_range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--block-k", o.block_k, "with --variant block-sparse: keys per block")
      ->group(vg)
      ->check(int_range(1, 1 << 20))
      ->capture_default_str();
  app.add_option(
         "--mask-broadcast", o.mask_broadcast,
         "with a custom or block mask: the dimensions it is broadcast over (stride 0), a subset of bhi")
      ->group(vg)
      ->check(checked_by([](const std::string& t) -> std::string {
        for (char ch : t)
          if (ch != 'b' && ch != 'h' && ch != 'i') return "'" + t + "' is not a subset of bhi";
        return {};
      }));
}

// Oracle and reports, the output side: --out, --quiet, how many failures are shown.
void add_report_options(CLI::App& app, CommonOptions& o) {
  using namespace cli;
  auto* r = "Oracle and reports";
  app.add_option("--out", o.out, "report directory (JSON, Markdown, SVG heatmaps, JUnit, corpus/)")
      ->group(r)
      ->check(non_empty())
      ->capture_default_str();
  app.add_flag("--no-reports", o.no_reports, "write no report files (failing cases are still saved)")
      ->group(r);
  app.add_flag("--quiet", o.quiet, "only the summary")->group(r);
  auto* max_failures =
      app.add_option(
             "--max-failures", o.max_failures,
             "runs of several checks: failures shown per kernel x class, each with its deciding evidence "
             "and a heatmap; the rest are counted (report.json lists every one)")
          ->group(r)
          ->check(int_range(1, 1000000))
          ->capture_default_str();
  app.add_flag("--all-failures", o.all_failures,
               "show every failure with all its evidence, and write a heatmap for each")
      ->group(r)
      ->excludes(max_failures);
  app.add_option(
         "--fail-tiers", o.fail_tiers,
         "input tiers whose failures make the exit status 1: all, or a comma list of ordinary, extreme, "
         "non-finite-visible, non-finite-masked (docs/semantics.md); the others are still reported")
      ->group(r)
      ->check(checked_by([](const std::string& t) {
        unsigned bits = 0;
        return parse_fail_tiers(t, bits);
      }))
      ->capture_default_str();
}

// Classification: detectors, reruns, TSan, compute-sanitizer.
void add_classification_options(CLI::App& app, CommonOptions& o) {
  using namespace cli;
  auto* c = "Classification (check/README.md)";
  auto* no_classify =
      app.add_flag("--no-classify", o.no_classify, "keep check's first class: run no detector experiments")
          ->group(c);
  app.add_option("--reruns", o.reruns, "GPU: bitwise reruns of a failing case (a difference = barrier-race)")
      ->group(c)
      ->check(int_range(0, 1000))
      ->capture_default_str();
  auto* tsan =
      app.add_flag("--tsan", o.tsan, "cpu: re-run failing cases in the ThreadSanitizer build of attn-check")
          ->group(c);
  app.add_option("--tsan-binary", o.tsan_binary,
                 "TSan attn-check (default $ATTNFUZZ_TSAN_ATTN_CHECK, else " + default_tsan_binary() + ")")
      ->group(c)
      ->check(executable_file())
      ->needs(tsan);
  app.add_option("--tsan-plugin", o.tsan_plugins, "TSan-built twin of a --plugin (repeatable)")
      ->group(c)
      ->check(existing_file())
      ->needs(tsan);
  auto* cs =
      app.add_flag(
             "--compute-sanitizer", o.compute_sanitizer,
             "nvidia: run racecheck, synccheck and memcheck on failing cases (compute-sanitizer on PATH)")
          ->group(c);
  tsan->excludes(no_classify);
  cs->excludes(no_classify);
  app.add_flag(
         "--amplify", o.amplify,
         "after a passing check of a case with a variant whose effect is within the bound (sink, softcap, "
         "ALiBi, bias, custom mask, per-head descales), check a sibling with that parameter amplified: an "
         "output that is the exact result without it is ignored-parameter")
      ->group(c);
  app.add_flag("--repeat-calls", o.repeat_calls,
               "check each forward dense case right after the same shape with another scale, mask, dtype or "
               "strides: a plan / graph cache keyed without that parameter is named (stale cache); campaigns too")
      ->group(c);
}

}  // namespace

// The options both tools share, group by group in --help's order.
void add_common_options(CLI::App& app, CommonOptions& o) {
  add_kernel_options(app, o);
  add_oracle_options(app, o);
  add_variant_options(app, o);
  add_report_options(app, o);
  add_classification_options(app, o);
}

ValueDomain value_domain(const CommonOptions& o) {
  ValueDomain d = ValueDomain::kIeee;
  (void)parse_value_domain(o.values, d);  // checked by the option table
  return d;
}

uint32_t case_variants(const CommonOptions& o) {
  uint32_t bits = 0;
  if (o.variant == "all")
    // head-descale: fp8 only; kv-shared: a geometry (Dv <= D), not a score variant
    bits = kCheckedVariants & ~(AF_VARIANT_DROPOUT | AF_VARIANT_HEAD_DESCALE | AF_VARIANT_KV_SHARED);
  else
    (void)parse_variant_names(o.variant, bits);  // checked by the option table
  if (o.dropout >= 0) bits |= AF_VARIANT_DROPOUT;
  return bits;
}

std::string apply_dropout_options(const CommonOptions& o, Case& c) {
  int32_t rng = AF_DROPOUT_RNG_PHILOX_FLASH;
  (void)parse_dropout_rng(o.dropout_rng, rng);  // checked by the option table
  return set_dropout(c.problem, o.dropout >= 0 ? o.dropout : 0.1, rng, o.dropout_seed, o.dropout_offset);
}

std::string apply_variant_options(const CommonOptions& o, Case& c) {
  const uint32_t bits = case_variants(o);
  if (!bits) return {};
  c.variants.sink_range = o.sink_range;
  c.variants.bias_range = o.bias_range;
  // "all" on one case: the dense custom mask (mask-dense and mask-bits are exclusive; the sweep takes both)
  const uint32_t one = o.variant == "all" ? bits & ~AF_VARIANT_MASK_BITS : bits;
  if (std::string e = set_variants(c, one & (kScoreVariants | AF_VARIANT_HEAD_DESCALE | AF_VARIANT_KV_SHARED),
                                   o.softcap, o.bias_broadcast);
      !e.empty())
    return e;
  if (one & kMaskVariants)
    if (std::string e = set_mask_variants(c, one & kMaskVariants, o.mask_pattern, o.block_pattern,
                                          o.mask_broadcast, o.block_q, o.block_k);
        !e.empty())
      return e;
  return (one & AF_VARIANT_DROPOUT) ? apply_dropout_options(o, c) : std::string();
}

int32_t case_dtype(const CommonOptions& o) {
  if (auto d = parse_dtype(o.dtype)) return *d;
  return -1;  // "any" (the option table accepts nothing else)
}

std::vector<CLI::Option*> add_sequence_options(CLI::App& app, SequenceOptions& o, const char* group) {
  using namespace cli;
  const std::string lengths = "comma-separated lengths, one per sequence (batch = their count)";
  auto list = CLI::Validator(
      [](std::string& in) -> std::string {
        std::vector<int64_t> v;
        if (!parse_lengths(in, v))
          return "'" + in + "' is not a comma-separated list of lengths in [0, 1000000000] (e.g. 3,0,17)";
        return {};
      },
      "N[,N...]");
  app.add_option(
         "--seq-layout", o.layout,
         "sequence layout: dense | varlen (packed q and K/V, cu_seqlens) | varlen-q | varlen-k | kvcache "
         "(dense K/V with seqused-k) | paged (paged K/V, seqused-k) | decode (paged, 1..8 query tokens); "
         "with --sweep: that layout's sweep")
      ->group(group)
      ->check(CLI::IsMember({"dense", "varlen", "varlen-q", "varlen-k", "kvcache", "paged", "decode"}));
  std::vector<CLI::Option*> v;
  v.push_back(app.add_option("--seqlens-q", o.seqlens_q, "query tokens per sequence (packed q): " + lengths)
                  ->group(group)
                  ->check(list));
  v.push_back(
      app.add_option("--seqlens-k", o.seqlens_k,
                     "key slots per sequence (packed K/V: cu_seqlens_k differences; paged: pages reserved, "
                     "default = seqused-k): " +
                         lengths)
          ->group(group)
          ->check(list));
  v.push_back(
      app.add_option("--seqused-k", o.seqused_k,
                     "keys in use per sequence (KV cache; <= its slots, or <= --sk for kvcache): " + lengths)
          ->group(group)
          ->check(list));
  v.push_back(app.add_option("--page-size", o.page_size, "tokens per page of paged K/V")
                  ->group(group)
                  ->check(int_range(1, 1024))
                  ->capture_default_str());
  v.push_back(
      app.add_option("--page-order", o.page_order, "paged: 0 = pool pages in order, else a shuffle seed")
          ->group(group)
          ->transform(u64())
          ->capture_default_str());
  v.push_back(app.add_option("--spare-pages", o.spare_pages, "paged: unreferenced (poisoned) pool pages")
                  ->group(group)
                  ->check(int_range(0, 1 << 20))
                  ->capture_default_str());
  v.push_back(app.add_option("--malformed", o.malformed,
                             "KIND[@SEQ]: a defect in the metadata the kernel receives (cu-q-decreasing, "
                             "cu-k-decreasing, cu-k-past-total, seqused-over-capacity, seqused-negative, "
                             "page-out-of-pool, page-negative, page-unused-out-of-pool; docs/semantics.md "
                             "\"Malformed metadata\"): the kernel must refuse it or be exactly right")
                  ->group(group)
                  ->check(CLI::Validator(
                      [](std::string& in) {
                        Malformed m;
                        return parse_malformed(in, m);
                      },
                      "KIND[@SEQ]")));
  return v;
}

bool parse_lengths(const std::string& text, std::vector<int64_t>& out) {
  // A whole-string check, not CLI11's ->delimiter(','): CLI11 2.1 drops empty items ("3,,4" reads as 3,4).
  out.clear();
  if (text.empty()) return false;
  const char* p = text.data();
  const char* const end = text.data() + text.size();
  while (true) {
    int64_t v = -1;
    const auto [next, ec] = std::from_chars(p, end, v, 10);
    if (ec != std::errc() || next == p || v < 0 || v > 1000000000) return false;
    out.push_back(v);
    if (next == end) return true;
    if (*next != ',' || next + 1 == end) return false;
    p = next + 1;
  }
}

std::string apply_sequence_options(const SequenceOptions& o, Case& c) {
  const std::string L = o.layout.empty() ? "dense" : o.layout;
  SeqLayout& s = c.seqs;
  s = {};
  for (const auto& [text, out] : {std::pair<const std::string*, std::vector<int64_t>*>{&o.seqlens_q, &s.q},
                                  {&o.seqlens_k, &s.k},
                                  {&o.seqused_k, &s.used}})
    if (!text->empty() && !parse_lengths(*text, *out))
      return "a length list is malformed or holds a length above 10^9";
  Problem& p = c.problem;
  const bool any = !s.q.empty() || !s.k.empty() || !s.used.empty();
  const bool paged = L == "paged" || L == "decode";
  if (!paged)  // flags of paged K/V only: a value given for another layout would be silently ignored
    for (const auto& [given, flag] : {std::pair<bool, const char*>{o.given.page_size, "--page-size"},
                                      {o.given.page_order, "--page-order"},
                                      {o.given.spare_pages, "--spare-pages"}})
      if (given) return std::string(flag) + " applies to --seq-layout paged or decode only";
  if (L == "dense") {
    if (any || !o.malformed.empty())
      return "--seqlens-q / --seqlens-k / --seqused-k / --malformed need --seq-layout (varlen, kvcache, paged, ...)";
    return {};
  }
  // The lists set the batch (their count) and the lengths they give: a shape flag beside them would be
  // overridden, so it is refused.
  if (o.given.batch && any)
    return "--batch does not apply beside --seqlens-q / --seqlens-k / --seqused-k (the batch is the number "
           "of lengths)";
  if (o.given.sq && !s.q.empty())
    return "--sq does not apply beside --seqlens-q (Sq is the longest sequence)";
  if (o.given.sk && (!s.k.empty() || paged))
    return std::string("--sk does not apply beside ") +
           (paged ? "--seq-layout " + L : std::string("--seqlens-k")) +
           " (Sk is the longest used length; --sk is the capacity of --seq-layout kvcache)";
  p.q_layout = (L == "varlen" || L == "varlen-q" || !s.q.empty()) ? AF_SEQ_PACKED : AF_SEQ_DENSE;
  p.kv_layout = (L == "varlen" || L == "varlen-k") ? AF_SEQ_PACKED
                : (L == "paged" || L == "decode")  ? AF_SEQ_PAGED
                                                   : AF_SEQ_DENSE;
  if (p.kv_layout == AF_SEQ_PACKED && s.k.empty()) {
    if (s.q.empty()) return "--seq-layout " + L + " needs --seqlens-k";
    s.k = s.q;  // self-attention: each sequence's keys are its queries
  }
  if (p.q_layout == AF_SEQ_PACKED && s.q.empty()) return "--seq-layout " + L + " needs --seqlens-q";
  if ((L == "kvcache" || p.kv_layout == AF_SEQ_PAGED) && s.used.empty())
    return "--seq-layout " + L + " needs --seqused-k (the keys in use of every sequence)";
  if (p.kv_layout == AF_SEQ_PAGED) {
    p.page_size = static_cast<int32_t>(o.page_size);
    s.page_order = o.page_order;
    s.spare_pages = o.spare_pages;
  } else if (o.page_order || o.spare_pages) {
    return "--page-order and --spare-pages apply to --seq-layout paged or decode";
  }
  if (L == "decode" && (p.q_layout != AF_SEQ_DENSE || p.seq_q < 1 || p.seq_q > 8))
    return "--seq-layout decode takes a dense q of 1..8 query tokens per sequence (--sq 1..8)";
  const std::vector<int64_t>* first = !s.q.empty() ? &s.q : !s.used.empty() ? &s.used : &s.k;
  p.batch = static_cast<int64_t>(first->size());
  if (std::string e = set_sequence_fields(c); !e.empty()) return e;
  if (!o.malformed.empty()) {
    if (std::string e = parse_malformed(o.malformed, s.malformed); !e.empty()) return "--malformed: " + e;
    if (std::string e = validate_malformed(c); !e.empty()) return "--malformed: " + e;
  }
  return {};
}

namespace {
// Bytes of memory a check may take, and where that limit comes from: $ATTNFUZZ_MEMORY_LIMIT_MB when set,
// else MemAvailable, else the physical memory; 0 if unknown.
uint64_t memory_limit_bytes(std::string& source) {
  if (const char* env = std::getenv("ATTNFUZZ_MEMORY_LIMIT_MB"); env && *env) {
    uint64_t mb = 0;
    source = "$ATTNFUZZ_MEMORY_LIMIT_MB";
    if (cli::parse_u64(env, mb) && mb < (uint64_t{1} << 40)) return mb << 20;
  }
  source = "the memory available now";
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  uint64_t kb = 0;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  source = "the physical memory";
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(size) : 0;
}
}  // namespace

uint64_t case_memory_bytes(const Case& c) {
  const Problem& p = c.problem;
  double elements = static_cast<double>(q_elements(p)) + static_cast<double>(k_elements(p)) +
                    static_cast<double>(v_elements(p)) + static_cast<double>(o_elements(p)) +
                    static_cast<double>(lse_elements(p));
  if (has_backward(c.pass))  // dO, dQ, dK, dV
    elements += static_cast<double>(o_elements(p)) + static_cast<double>(q_elements(p)) +
                static_cast<double>(k_elements(p)) + static_cast<double>(v_elements(p));
  // fp32 values on the host, the guarded device (or shared) buffers and the copies read back / kept for the
  // detectors: kCaseMemoryCopies of every element.
  return static_cast<uint64_t>(elements * 4.0 * kCaseMemoryCopies);
}

std::string memory_refusal(const Case& c) {
  std::string source;
  const uint64_t need = case_memory_bytes(c), have = memory_limit_bytes(source);
  if (have == 0 || need <= have) return {};
  char b[240];
  std::snprintf(
      b, sizeof b,
      "the case needs about %.1f GiB of memory, more than the limit of %.1f GiB (%s): use a smaller "
      "shape%s",
      need / 1073741824.0, have / 1073741824.0, source.c_str(),
      c.seqs.spare_pages ? " or fewer --spare-pages" : "");
  return b;
}

Pass case_pass(const CommonOptions& o) {
  Pass p = Pass::kFwd;
  (void)parse_pass(o.pass, p);  // checked by the option table
  return p;
}

std::string count_of(int64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

std::string adapter_flag(const CommonOptions& o) {
  return o.adapter.empty() ? std::string() : " --adapter " + shell_quote(o.adapter);
}

namespace {
[[noreturn]] void die(const std::string& tool, const std::string& msg) {
  std::fprintf(stderr, "%s: %s\n", tool.c_str(), msg.c_str());
  std::exit(2);
}

std::string fmt_ratio(double r) {
  char b[32];
  if (std::isinf(r)) return "inf";
  if (std::isnan(r)) return "-";
  std::snprintf(b, sizeof b, r >= 100 ? "%.3g" : "%.2f", r);
  return b;
}

std::string shape(const Problem& p) {
  char b[160];
  std::snprintf(b, sizeof b, "%lldx%lld D=%lld%s %s", (long long)p.seq_q, (long long)p.seq_k,
                (long long)p.head_dim,
                p.head_dim_v != p.head_dim ? ("/" + std::to_string(p.head_dim_v)).c_str() : "",
                mask_to_string(p).c_str());
  // Sequence layouts: Sq x Sk are the largest lengths; name the layout and the batch of sequences.
  if (has_sequences(p)) return std::string(b) + " " + layout_name(p) + " B=" + std::to_string(p.batch);
  return b;
}
}  // namespace

std::unique_ptr<Device> open_tool_device(const CommonOptions& o, const std::string& tool) {
  DeviceOptions d;
  if (!parse_thread_order(o.order, d.order))
    die(tool, "unknown --order '" + o.order + "': forward, reverse or shuffle");
  d.order_seed = o.order_seed;
  d.workers = o.workers;
  d.warp_size = o.warp_size;
  d.timeout_s = o.timeout_s;
  d.compile_timeout_s = o.compile_timeout_s;
  d.isolate = !o.no_isolate;
  d.adapter_command = o.adapter;
  if (!(o.timeout_s > 0)) die(tool, "--timeout must be > 0");
  try {
    return open_device(o.backend, d);
  } catch (const DeviceError& e) {
    die(tool, e.what());
  }
}

void Session::set_device(std::unique_ptr<Device> d) {
  run.pool.reset();  // the pool frees its buffers on its device: before that device goes
  device = std::move(d);
  if (device) run.pool = std::make_shared<BufferPool>(*device);  // as a campaign's worker (fuzz/worker.cpp)
}

Session open_session(const CommonOptions& o, const std::string& tool, int argc, char** argv) {
  Session s;
  s.tool = tool;
  s.opts = o;
  for (int i = 0; i < argc; ++i) s.command_line += (i ? " " : "") + shell_quote(argv[i]);
  s.registry = &Registry::global();
  for (const auto& p : o.plugins) {
    try {
      s.registry->load_plugin(p);
    } catch (const std::exception& e) {
      die(tool, e.what());
    }
  }
  s.set_device(open_tool_device(o, tool));
  s.run.oracle.row_budget = o.oracle_rows;
  s.run.oracle.mp_bits = o.mp_bits;
  if (o.oracle_rows < 0) die(tool, "--oracle-rows must be >= 0");
  s.classify.enabled = !o.no_classify;
  s.classify.reruns = o.reruns;
  s.classify.tsan = o.tsan;
  s.classify.tsan_binary = o.tsan_binary;
  s.classify.tsan_plugins = o.tsan_plugins;
  s.classify.plugins = o.plugins;
  s.classify.compute_sanitizer = o.compute_sanitizer;
  // --out must be writable now, not after an hour of checking.
  std::error_code ec;
  fs::create_directories(fs::path(o.out) / "corpus", ec);
  const fs::path probe = fs::path(o.out) / ".write-test";
  {
    std::ofstream f(probe);
    if (ec || !f) die(tool, "cannot write to --out '" + o.out + "'" + (ec ? ": " + ec.message() : ""));
  }
  fs::remove(probe, ec);
  return s;
}

Runner::Runner(Session& s, const CommonOptions& o) : s_(s), o_(o) { tty_ = isatty(2); }

void Runner::begin(int64_t total) {
  total_ = total;
  start_ = last_progress_ = std::chrono::steady_clock::now();
  if (!o_.quiet)  // several checks: stdout's first line is the results' first line (finish), this goes with
                  // progress
    std::fprintf(several() ? stderr : stdout, "%s %s on %s: %s\n", s_.tool.c_str(), ATTNFUZZ_VERSION,
                 s_.device->name().c_str(), count_of(total, "check").c_str());
}

void Runner::progress(bool final) {
  if (o_.quiet || total_ < 2) return;
  const auto now = std::chrono::steady_clock::now();
  const double since = std::chrono::duration<double>(now - last_progress_).count();
  if (!final && since < (tty_ ? 0.25 : 10.0)) return;
  // Not on a terminal every line stays: one a tenth of the run, or a minute, so a long sweep's log stays
  // short.
  const int decile = static_cast<int>(10 * done_ / std::max<int64_t>(total_, 1));
  if (!tty_ && !final && decile == last_decile_ && since < 60) return;
  last_decile_ = decile;
  last_progress_ = now;
  std::map<Verdict, int64_t> n;
  for (const auto& e : entries_) ++n[e.result.verdict];
  const double el = std::chrono::duration<double>(now - start_).count();
  std::fprintf(
      stderr, "%s[%lld/%lld %3.0f%%] %.1fs  pass %lld  FAIL %lld  unsupported %lld  outside-contract %lld%s",
      tty_ ? "\r" : "", (long long)done_, (long long)total_, 100.0 * done_ / std::max<int64_t>(total_, 1), el,
      (long long)n[Verdict::kPass], (long long)n[Verdict::kFail], (long long)n[Verdict::kUnsupported],
      (long long)n[Verdict::kOutsideContract], tty_ && !final ? "   " : "\n");
  std::fflush(stderr);
}

const Judged& Runner::check(const KernelEntry& k, PreparedCase& pc, const std::string& origin) {
  last_ = check_in_modes(*s_.device, k, pc, s_.run, {.repeat_calls = o_.repeat_calls, .amplify = o_.amplify});
  if (o_.audit && last_.result.verdict == Verdict::kPass && passes_[k.kernel.name]++ % o_.audit_every == 0) {
    ++audited_;  // a pass is audited for races / OOB that did not show in the output (--audit)
    audit_found_ += audit_passing_case(*s_.device, k, pc, s_.run, last_, s_.classify).found;
  }
  classify_failure(*s_.device, k, pc, s_.run, last_, s_.classify);
  return record(pc.the_case(), std::move(last_), "");
}

std::string Runner::replay_command_for(const CheckResult& r, const std::string& corpus_path) const {
  std::string cmd = "attn-check --replay " + shell_quote(corpus_path) +
                    (r.backend == "adapter" ? adapter_flag(o_)
                     : r.backend != "cpu"   ? " --backend " + r.backend
                                            : "");
  for (const auto& p : o_.plugins) cmd += " --plugin " + shell_quote(p);
  auto is_audit = [](const Evidence& e) { return e.detector == "audit"; };
  if (std::any_of(r.evidence.begin(), r.evidence.end(), is_audit))
    cmd += " --audit --audit-every 1";  // the output passes: only the audit shows the hazard
  if (o_.repeat_calls) cmd += " --repeat-calls";  // a stale cache shows only after the sibling call
  if (o_.repeat_calls && o_.no_isolate) cmd += " --no-isolate";  // and, on the cpu backend, in the same process
  if (r.decided_by == "amplify") cmd += " --amplify";  // the case passes: only its amplified sibling fails
  if (o_.order != CommonOptions{}.order || o_.order_seed != CommonOptions{}.order_seed)  // races depend on it
    cmd += " --order " + shell_quote(o_.order) + " --order-seed " + std::to_string(o_.order_seed);
  return cmd;
}

const Judged& Runner::record(const Case& the_case, Judged judged, const std::string& replay_command) {
  last_ = std::move(judged);
  ++done_;
  RunEntry rec{the_case, last_.result, "", "", ""};
  const CheckResult& r = rec.result;
  const bool fail = r.verdict == Verdict::kFail;
  // Several checks: the first --max-failures failures of each kernel x class are shown and get a heatmap.
  const int64_t before = fail ? tally_.add(r.kernel, failure_class_name(r.failure)) : 0;
  const bool shown = fail && (!several() || o_.all_failures || before < o_.max_failures);
  if (fail) ++failures_;
  if (fail && !replay_command.empty()) {  // not a case: nothing to save
    rec.replay_command = replay_command;
  } else if (fail) {
    CorpusFile cf;
    cf.tool.name = s_.tool;
    cf.tool.command = s_.command_line;
    cf.the_case = the_case;
    cf.verdict = recorded_verdict(r, std::string(failure_class_name(r.failure)) + ":" + r.kernel);
    try {
      rec.corpus_path = save_to_corpus_dir(fs::path(o_.out) / "corpus", cf).string();
    } catch (const CorpusError& e) {
      std::fprintf(stderr, "%s: warning: %s\n", s_.tool.c_str(), e.what());
    }
    rec.replay_command = replay_command_for(r, rec.corpus_path);
  }
  if (shown && !o_.no_reports)
    rec.heatmap_path = last_.grad_maps.empty() || (!r.tensor.empty() && r.tensor[0] != 'd')
                           ? write_heatmap(rec, last_.ratio_map)
                           : write_grad_heatmaps(rec, last_.grad_maps);
  if (!o_.quiet && !several()) {
    const auto [head, body] = verdict_text(the_case, rec, false);
    std::printf("%s%s\n", head.c_str(), body.c_str());
    std::fflush(stdout);
  } else if (!o_.quiet && shown) {
    auto [head, body] = verdict_text(the_case, rec, !o_.all_failures);
    const Problem& p = the_case.problem;
    shown_.push_back({r.kernel, failure_class_name(r.failure), std::move(head), std::move(body),
                      rec.replay_command,
                      p.batch * p.heads_q * p.seq_q * std::max<int64_t>(p.seq_k, 1) * p.head_dim});
  }
  entries_.push_back(std::move(rec));
  progress(false);
  return last_;
}

std::pair<std::string, std::string> Runner::verdict_text(const Case& c, const RunEntry& rec,
                                                         bool condensed) const {
  const CheckResult& r = rec.result;
  const bool fail = r.verdict == Verdict::kFail;
  char b[1024];
  std::string head, body;
  std::snprintf(b, sizeof b, "%-16s %-18s %s%s  %s%s", verdict_name(r.verdict), r.kernel.c_str(),
                shape(c.problem).c_str(),
                c.pass == Pass::kFwd ? "" : (std::string(" pass=") + pass_name(c.pass)).c_str(),
                fail ? failure_class_name(r.failure) : "",
                fail && !r.tensor.empty() ? (" in " + r.tensor).c_str() : "");
  head = b;
  if (r.compared) head += "  err/bound " + fmt_ratio(r.max_ratio);
  if (!r.reason.empty() && r.verdict != Verdict::kPass) body += "\n    " + r.reason;
  // The worst element once: the comparison's reason names it already when the comparison decided the verdict.
  if (fail && !r.worst.empty() &&
      r.reason.find("worst " + element_name(r.worst.front())) == std::string::npos) {
    const ElementReport& w = r.worst.front();
    std::snprintf(b, sizeof b, "\n    worst %s: expected %.9g got %.9g bound %.3g", element_name(w).c_str(),
                  w.expected, w.got, w.bound);
    body += b;
  }
  if (fail && condensed)
    for (const Evidence* ev : deciding_evidence(r)) body += "\n    " + ev->detector + ": " + ev->detail;
  else if (fail)
    for (const Evidence& ev : r.evidence)
      if (ev.detector != "compare") body += "\n    " + ev.detector + ": " + ev.detail;
  if (!rec.replay_command.empty()) body += "\n    replay: " + rec.replay_command;
  return {head, body};
}

void Runner::replay_verdict(const std::string& line, bool same) {
  ++replays_;
  reproduced_ += same;
  if (!several()) {
    std::printf("%s\n", line.c_str());
  } else if (!same || o_.all_failures) {
    replay_lines_.push_back(line);
  }
}

void Runner::print_results() {
  if (o_.quiet || !several()) return;
  if (!shown_.empty()) {  // where to start: the smallest case among the first failures
    const Shown* start = &shown_.front();
    for (const Shown& x : shown_)
      if (x.elements < start->elements) start = &x;
    std::printf("%s\n", tally_.headline(start->kernel, start->cls, start->replay).c_str());
    if (!o_.all_failures)
      std::printf(
          "the first %s of each kernel x class, with the evidence that decided its class (every line: "
          "summary.md, report.json; --all-failures prints them):\n",
          o_.max_failures == 1 ? "failure" : (std::to_string(o_.max_failures) + " failures").c_str());
    if (!o_.no_reports)
      std::printf("heatmaps of the failures shown: %s (summary.md links each)\n",
                  (fs::path(o_.out) / "heatmap-*.svg").c_str());
  }
  for (const auto& [kernel, cls] : tally_.order()) {  // grouped by pair, in the order the pairs first failed
    const int64_t n = tally_.count(kernel, cls);
    int64_t i = 0;
    for (const Shown& x : shown_)
      if (x.kernel == kernel && x.cls == cls) {
        const bool more = ++i == 1 && !o_.all_failures && n > o_.max_failures;
        std::printf("%s%s%s\n", x.head.c_str(),
                    more ? ("  (first of " + std::to_string(n) + ")").c_str() : "", x.body.c_str());
      }
  }
  if (replays_ > 1)
    std::printf("replay: %lld of %lld recorded verdict(s) reproduced%s\n", (long long)reproduced_,
                (long long)replays_, replay_lines_.empty() ? "" : ":");
  for (const std::string& l : replay_lines_) std::printf("  %s\n", l.c_str());
  std::fflush(stdout);
}

namespace {
// The mask seen from the keys: key j of p is visible to query rows i with i - (j - off) in [-right, left],
// i.e. the same kind of window over a problem with Sq and Sk swapped, sides swapped, the alignment kept
// (bottom-right off' = Sq - Sk = -off). The dK / dV heatmaps draw it beside their key rows.
Problem keys_as_rows(const Problem& p) {
  Problem t = p;
  std::swap(t.seq_q, t.seq_k);
  const int64_t left = window_left(p), right = window_right(p);
  if (p.mask_kind != AF_MASK_NONE) {
    t.mask_kind = AF_MASK_WINDOW;
    t.window_left = right;
    t.window_right = left;
  }
  return t;
}
}  // namespace

std::string Runner::write_grad_heatmaps(const RunEntry& e, const std::vector<GradMap>& maps) {
  std::string failing;
  for (const GradMap& g : maps) {
    bool bad = false;
    for (double r : g.ratio) bad |= !(std::isnan(r) || r <= 1);
    if (!bad) continue;
    const Problem& p = e.the_case.problem;
    const bool q = g.tensor == "dQ";
    const Problem shown = q ? p : keys_as_rows(p);
    RatioMap m(g.rows, g.cols);
    for (int64_t s = 0; s < g.rows; ++s)
      for (int64_t d = 0; d < g.cols; ++d) {
        const double r = g.ratio[static_cast<size_t>(s * g.cols + d)];
        if (!std::isnan(r)) m.fold(s, d, r);
      }
    HeatmapOptions ho;
    ho.title = e.result.kernel + ": " + std::string(failure_class_name(e.result.failure)) + ", " + g.tensor +
               (q                  ? " (query rows x D)"
                : g.tensor == "dK" ? " (keys x D)"
                                   : " (keys x Dv)") +
               (e.the_case.label.empty() ? "" : " (" + e.the_case.label + ")");
    ho.subtitle = describe(e.the_case) + "  max err/bound " + fmt_ratio(e.result.max_ratio);
    std::string name = heatmap_file_name(e.result.kernel, e.the_case);
    name.insert(name.size() - 4, "-" + g.tensor);
    try {
      write_heatmap_files(fs::path(o_.out) / name, heatmap_svg(m, shown, ho));
    } catch (const ReportError& err) {
      std::fprintf(stderr, "%s: warning: %s\n", s_.tool.c_str(), err.what());
      continue;
    }
    if (failing.empty() || g.tensor == e.result.tensor) failing = name;
  }
  return failing;
}

std::string Runner::write_heatmap(const RunEntry& e, const std::vector<double>& ratio_map) {
  const Problem& p = e.the_case.problem;
  if (ratio_map.size() != static_cast<size_t>(p.seq_q * p.head_dim_v)) return {};
  RatioMap m(p.seq_q, p.head_dim_v);
  for (int64_t s = 0; s < p.seq_q; ++s)
    for (int64_t d = 0; d < p.head_dim_v; ++d) {
      const double r = ratio_map[static_cast<size_t>(s * p.head_dim_v + d)];
      if (!std::isnan(r)) m.fold(s, d, r);  // NaN here means "not compared" (sampled out, outside contract)
    }
  HeatmapOptions ho;
  ho.title = e.result.kernel + ": " + std::string(failure_class_name(e.result.failure)) +
             (e.the_case.label.empty() ? "" : " (" + e.the_case.label + ")");
  ho.subtitle = describe(e.the_case) + "  max err/bound " + fmt_ratio(e.result.max_ratio);
  const std::string name = heatmap_file_name(e.result.kernel, e.the_case);
  try {
    write_heatmap_files(fs::path(o_.out) / name, heatmap_svg(m, p, ho));
  } catch (const ReportError& err) {
    std::fprintf(stderr, "%s: warning: %s\n", s_.tool.c_str(), err.what());
    return {};
  }
  return name;
}

void Runner::print_table() const {
  struct Row {
    int64_t pass = 0, fail = 0, unsupported = 0, outside = 0;
    double worst = 0;
    std::map<std::string, int64_t> classes;
  };
  std::map<std::string, Row> rows;
  for (const auto& r : entries_) {
    Row& row = rows[r.result.kernel];
    switch (r.result.verdict) {
      case Verdict::kPass:
        ++row.pass;
        break;
      case Verdict::kFail:
        ++row.fail;
        ++row.classes[failure_class_name(r.result.failure)];
        break;
      case Verdict::kUnsupported:
        ++row.unsupported;
        break;
      case Verdict::kOutsideContract:
        ++row.outside;
        break;
    }
    if (r.result.verdict != Verdict::kUnsupported && !std::isnan(r.result.max_ratio))
      row.worst = std::max(row.worst, r.result.max_ratio);
  }
  // Many kernels and bounded output: a row for each kernel that failed; the others named on two lines.
  const bool group = several() && !o_.all_failures && rows.size() > 12;
  std::string passed, nothing;
  int64_t n_passed = 0, n_nothing = 0;
  int width = 22;  // the kernel column as wide as its longest name: the counts line up
  for (const auto& [name, row] : rows) width = std::max(width, static_cast<int>(name.size()));
  std::printf("\n%-*s %6s %6s %11s %9s %10s  %s\n", width, "kernel", "pass", "FAIL", "unsupported", "outside",
              "max err/bnd", "failure classes");
  for (const auto& [name, row] : rows) {
    if (group && row.fail == 0) {
      const bool none = row.pass + row.outside == 0;
      (none ? nothing : passed) += ((none ? n_nothing : n_passed)++ ? ", " : "") + name;
      continue;
    }
    std::string cls;
    for (const auto& [c, n] : row.classes) cls += (cls.empty() ? "" : ", ") + c + " x" + std::to_string(n);
    std::printf("%-*s %6lld %6lld %11lld %9lld %10s  %s\n", width, name.c_str(), (long long)row.pass,
                (long long)row.fail, (long long)row.unsupported, (long long)row.outside,
                fmt_ratio(row.worst).c_str(), cls.c_str());
  }
  if (n_passed)
    std::printf("no failure (pass, unsupported or outside the contract): %lld kernel(s): %s\n",
                (long long)n_passed, passed.c_str());
  if (n_nothing)
    std::printf("NOTHING CHECKED (every case unsupported): %lld kernel(s): %s\n", (long long)n_nothing,
                nothing.c_str());
}

int Runner::finish() {
  progress(true);
  print_results();
  print_table();
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (audited_)
    std::printf("audit: %s audited (every %lld. pass per kernel), %s found\n",
                count_of(audited_, "passing check").c_str(), (long long)o_.audit_every,
                count_of(audit_found_, "hazard").c_str());
  const bool none_checked = std::all_of(entries_.begin(), entries_.end(), [](const RunEntry& e) {
    return e.result.verdict == Verdict::kUnsupported;
  });
  std::printf("%s in %.1f s: %s\n", count_of(static_cast<int64_t>(entries_.size()), "check").c_str(), el,
              failures_                           ? (std::to_string(failures_) + " FAILED").c_str()
              : none_checked && !entries_.empty() ? "nothing checked (every one unsupported)"
                                                  : "all passed");
  if (!o_.no_reports) {
    try {
      RunRecord rec;
      rec.tool.name = s_.tool;
      rec.tool.command = s_.command_line;
      rec.backend = backend_name(s_.device->backend());
      rec.device = s_.device->name();
      rec.wall_s = el;
      rec.entries = entries_;
      const ReportPaths paths = write_reports(rec, o_.out);
      std::printf("reports: %s  %s  %s\n", paths.markdown.c_str(), paths.json.c_str(), paths.junit.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: cannot write reports: %s\n", s_.tool.c_str(), e.what());
      return 2;
    }
  }
  return failures_ ? tier_exit_status() : 0;
}

// The failures by input tier, ordinary first, and the exit status --fail-tiers gives them: 1 when a failure
// is in a counted tier, else 0 with one line saying so.
int Runner::tier_exit_status() const {
  std::vector<InputTier> tiers;
  for (const RunEntry& e : entries_)
    if (e.result.verdict == Verdict::kFail) tiers.push_back(input_tier(e.the_case));
  const TierTally t = tally_tiers(tiers, o_.fail_tiers);
  std::printf("failures by input tier: %s\n", input_tier_counts(t.n).c_str());
  return attnfuzz::tier_exit_status(t, o_.fail_tiers);
}

}  // namespace attnfuzz
