// attn_props.cpp - attn-props: runs the RapidCheck properties over kernels (long campaigns, the README's
// table).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "attnfuzz/registry.h"
#include "properties/properties.h"
#include "tools/cli_common.h"

using namespace attnfuzz;
using namespace attnfuzz::props;

namespace {
std::string check_property(const std::string& name) {
  Property p;
  if (name == "all" || parse_property(name, p)) return {};
  std::string have;
  for (Property q : all_properties()) have += std::string(have.empty() ? "" : ", ") + property_name(q);
  return "unknown property '" + name + "' (have: all, " + have + ")";
}

// What the command line asks for.
struct Args {
  std::vector<std::string> properties{"all"};
  std::string kernels = "all", out, table, adapter;
  std::vector<std::string> plugins;
  int max_success = 50;
  uint64_t seed = 0;
  bool no_shrink = false, strict = false, quiet = false;
  std::string values = "ieee", pass = "fwd", dtype = "f32";
};

// attn-props's option table.
void define_options(CLI::App& app, Args& a) {
  using namespace cli;
  const char* props_g = "Properties";
  const char* kernels_g = "Kernels";
  const char* cases = "Cases";
  const char* out_g = "Output";
  app.add_option("--property,-p", a.properties, "comma-separated property names, or 'all'")
      ->delimiter(',')
      ->check(checked_by(check_property))
      ->capture_default_str()
      ->group(props_g);
  app.add_option("--kernel,-k", a.kernels, "kernel names or globs, comma separated ('all')")
      ->check(kernel_list())
      ->capture_default_str()
      ->group(kernels_g);
  app.add_option("--plugin", a.plugins, "load kernels from a cpu plug-in shared library (repeatable)")
      ->check(existing_file())
      ->group(kernels_g);
  app.add_option("--adapter", a.adapter,
                 "run the properties on the kernels of this adapter process (adapters/PROTOCOL.md)")
      ->check(non_empty())
      ->group(kernels_g);
  app.add_option("--max-success,-n", a.max_success, "cases per (property, kernel)")
      ->check(int_range(1, 1000000))
      ->capture_default_str()
      ->group(props_g);
  app.add_option("--seed", a.seed, "RapidCheck seed, decimal or 0x hex (0: fixed per property and kernel)")
      ->transform(u64())
      ->capture_default_str()
      ->group(props_g);
  app.add_flag("--no-shrink", a.no_shrink, "report the first failing case without shrinking")->group(props_g);
  app.add_flag("--strict", a.strict, "causal-prefix, row-independence and batch-head must hold bitwise")
      ->group(props_g);
  app.add_option("--out,-o", a.out,
                 "directory for failing cases (default $ATTNFUZZ_PROPERTY_OUT or "
                 "<build>/property-failures)")
      ->check(writable_dir())
      ->group(out_g);
  app.add_option("--table", a.table, "also write a Markdown table property x kernel to this file")
      ->check(writable_file())
      ->group(out_g);
  app.add_flag("--quiet,-q", a.quiet, "no per-failure report")->group(out_g);
  app.add_option(
         "--values", a.values,
         "value domain: ieee | finite (no NaN / Inf in cases and perturbations) | activations (LLM-like: "
         "|x| <= 64, outlier channels, scale near 1/sqrt(D))")
      ->check(CLI::IsMember({"ieee", "finite", "activations"}))
      ->capture_default_str()
      ->group(cases);
  app.add_option("--dtype", a.dtype, "dtype of generated cases: f32 | f16 | bf16 | fp8-e4m3 | fp8-e5m2")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "fp8-e4m3", "fp8-e5m2"}))
      ->capture_default_str()
      ->group(cases);
  app.add_option("--pass", a.pass,
                 "pass of the cases: fwd | bwd | fwdbwd (backward: oracle, key-permutation, batch-head and "
                 "determinism "
                 "on dQ / dK / dV; kernels without a backward launch are not run)")
      ->check(CLI::IsMember({"fwd", "bwd", "fwdbwd"}))
      ->capture_default_str()
      ->group(cases);
  app.footer(
      "Exit status: 0 every property held on at least one case, 1 a property failed, 2 usage or input\n"
      "error (also when nothing selected could run a case).");
  app.set_version_flag("--version", "attn-props " ATTNFUZZ_VERSION);
}

// The selected properties, in the order given ("all": every one).
std::vector<Property> selected_properties(const Args& a) {
  std::vector<Property> props;
  for (const std::string& name : a.properties) {
    if (name == "all") return all_properties();
    Property p;
    (void)parse_property(name, p);  // checked by the option table
    props.push_back(p);
  }
  return props;
}

using Cells = std::map<std::pair<std::string, std::string>, std::string>;  // (kernel, property) -> verdict

// The Markdown table property x kernel; false when the file cannot be written.
bool write_table(const std::string& path, const std::vector<Property>& props,
                 const std::vector<const KernelEntry*>& ks, const Cells& cell) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  std::fprintf(f, "| kernel |");
  for (Property p : props) std::fprintf(f, " %s |", property_name(p));
  std::fprintf(f, "\n|---|");
  for (size_t i = 0; i < props.size(); ++i) std::fprintf(f, "---|");
  std::fprintf(f, "\n");
  for (const KernelEntry* k : ks) {
    std::fprintf(f, "| %s |", k->kernel.name);
    for (Property p : props) std::fprintf(f, " %s |", cell.at({k->kernel.name, property_name(p)}).c_str());
    std::fprintf(f, "\n");
  }
  std::fclose(f);
  return true;
}

// Every (kernel, property) pair, one line each; counts failures and pairs that ran a case.
struct Tally {
  int failures = 0, ran = 0;
  std::string why_none;  // why the last (property, kernel) ran no case
  Cells cell;
};
Tally run_all(const std::vector<Property>& props, const std::vector<const KernelEntry*>& ks,
              const PropertyOptions& o) {
  Tally t;
  for (const KernelEntry* k : ks)
    for (Property p : props) {
      const PropertyOutcome r = run_property(p, *k, o);
      // A pass of 0 cases checked nothing (no backward launch, no mask, dense only): "skip" with the reason.
      const bool skipped = r.passed && r.tests == 0;
      const char* v = skipped ? "skip" : r.passed ? "pass" : r.gave_up ? "gave up" : "FAIL";
      t.failures += !r.passed;
      t.ran += r.tests > 0 || !r.passed;
      std::string note = r.passed ? "" : r.failure;
      if (skipped) {
        note = r.rc_message.empty() ? "nothing to run" : r.rc_message;
        while (!note.empty() && (note.back() == '\n' || note.back() == ' ')) note.pop_back();
        t.why_none = note;
      }
      std::printf("%-18s %-28s %-5s %3d case(s) %4.1fs%s%s\n", property_name(p), k->kernel.name, v, r.tests,
                  r.seconds, note.empty() ? "" : "  ", note.c_str());
      std::fflush(stdout);
      t.cell[{k->kernel.name, property_name(p)}] = skipped ? "skip" : r.passed ? "pass" : "**FAIL**";
    }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "attn-props: RapidCheck properties (oracle and metamorphic) of attention kernels on the cpu emulator.\n"
      "RC_PARAMS, when set, overrides --max-success / --seed (e.g. reproduce=...).",
      "attn-props"};
  define_options(app, a);
  if (const int rc = cli::parse_or_exit_code(app, argc, argv, "attn-props"); rc >= 0) return rc;
  const std::vector<Property> props = selected_properties(a);
  std::vector<const KernelEntry*> ks;
  try {
    for (const auto& p : a.plugins) Registry::global().load_plugin(p);
    if (!a.adapter.empty()) use_adapter(a.adapter);
    ks = Registry::global().select(a.adapter.empty() ? Backend::kCpu : Backend::kAdapter, a.kernels);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn-props: %s\n", e.what());
    return 2;
  }
  PropertyOptions o;
  o.max_success = a.max_success;
  o.seed = a.seed;
  o.shrink = !a.no_shrink;
  o.strict = a.strict;
  o.out = a.out;
  o.quiet = a.quiet;
  (void)parse_value_domain(a.values, o.domain);
  o.dtype = *parse_dtype(a.dtype);
  (void)parse_pass(a.pass, o.pass);
  if (has_backward(o.pass) && o.dtype != AF_DTYPE_F32 && o.dtype != AF_DTYPE_F16 &&
      o.dtype != AF_DTYPE_BF16) {
    std::fprintf(
        stderr,
        "attn-props: the backward pass is checked in f32, f16 and bf16 only (--pass %s with --dtype %s)\n",
        a.pass.c_str(), a.dtype.c_str());
    return 2;
  }
  const Tally t = run_all(props, ks, o);
  if (t.ran == 0) {
    std::fprintf(stderr, "attn-props: nothing checked: no selected (property, kernel) pair ran a case (%s)\n",
                 t.why_none.c_str());
    return 2;
  }
  if (!a.table.empty() && !write_table(a.table, props, ks, t.cell)) {
    std::fprintf(stderr, "attn-props: cannot write %s\n", a.table.c_str());
    return 2;
  }
  return t.failures ? 1 : 0;
}
