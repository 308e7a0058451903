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
}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> properties{"all"};
  std::string kernels = "all", out, table, adapter;
  std::vector<std::string> plugins;
  int max_success = 50;
  uint64_t seed = 0;
  bool no_shrink = false, strict = false, quiet = false;
  std::string values = "ieee", pass = "fwd";
  CLI::App app{
      "attn-props: RapidCheck properties (oracle and metamorphic) of attention kernels on the cpu emulator.\n"
      "RC_PARAMS, when set, overrides --max-success / --seed (e.g. reproduce=...).",
      "attn-props"};
  using namespace cli;
  const char* props_g = "Properties";
  const char* kernels_g = "Kernels";
  const char* cases = "Cases";
  const char* out_g = "Output";
  app.add_option("--property,-p", properties, "comma-separated property names, or 'all'")
      ->delimiter(',')
      ->check(checked_by(check_property))
      ->capture_default_str()
      ->group(props_g);
  app.add_option("--kernel,-k", kernels, "kernel names or globs, comma separated ('all')")
      ->check(kernel_list())
      ->capture_default_str()
      ->group(kernels_g);
  app.add_option("--plugin", plugins, "load kernels from a cpu plug-in shared library (repeatable)")
      ->check(existing_file())
      ->group(kernels_g);
  app.add_option("--adapter", adapter,
                 "run the properties on the kernels of this adapter process (adapters/PROTOCOL.md)")
      ->check(non_empty())
      ->group(kernels_g);
  app.add_option("--max-success,-n", max_success, "cases per (property, kernel)")
      ->check(int_range(1, 1000000))
      ->capture_default_str()
      ->group(props_g);
  app.add_option("--seed", seed, "RapidCheck seed, decimal or 0x hex (0: fixed per property and kernel)")
      ->transform(u64())
      ->capture_default_str()
      ->group(props_g);
  app.add_flag("--no-shrink", no_shrink, "report the first failing case without shrinking")
      ->group(props_g);
  app.add_flag("--strict", strict, "causal-prefix, row-independence and batch-head must hold bitwise")
      ->group(props_g);
  app.add_option("--out,-o", out,
                 "directory for failing cases (default $ATTNFUZZ_PROPERTY_OUT or "
                 "<build>/property-failures)")
      ->check(writable_dir())
      ->group(out_g);
  app.add_option("--table", table, "also write a Markdown table property x kernel to this file")
      ->check(writable_file())
      ->group(out_g);
  app.add_flag("--quiet,-q", quiet, "no per-failure report")
      ->group(out_g);
  app.add_option("--values", values, "value domain: ieee | finite (no NaN / Inf in cases and perturbations)")
      ->check(CLI::IsMember({"ieee", "finite"}))
      ->capture_default_str()
      ->group(cases);
  std::string dtype = "f32";
  app.add_option("--dtype", dtype, "dtype of generated cases: f32 | f16 | bf16 | fp8-e4m3 | fp8-e5m2")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "fp8-e4m3", "fp8-e5m2"}))
      ->capture_default_str()
      ->group(cases);
  app.add_option("--pass", pass,
                 "pass of the cases: fwd | bwd | fwdbwd (backward: oracle, key-permutation, batch-head and determinism "
                 "on dQ / dK / dV; kernels without a backward launch are not run)")
      ->check(CLI::IsMember({"fwd", "bwd", "fwdbwd"}))
      ->capture_default_str()
      ->group(cases);
  app.footer("Exit status: 0 every property held on at least one case, 1 a property failed, 2 usage or input\n"
             "error (also when nothing selected could run a case).");
  app.set_version_flag("--version", "attn-props " ATTNFUZZ_VERSION);
  if (const int rc = parse_or_exit_code(app, argc, argv, "attn-props"); rc >= 0) return rc;

  std::vector<Property> props;
  for (const std::string& name : properties) {
    if (name == "all") {
      props = all_properties();
      break;
    }
    Property p;
    (void)parse_property(name, p);  // checked by the option table
    props.push_back(p);
  }
  std::vector<const KernelEntry*> ks;
  try {
    for (const auto& p : plugins) Registry::global().load_plugin(p);
    if (!adapter.empty()) use_adapter(adapter);
    ks = Registry::global().select(adapter.empty() ? Backend::kCpu : Backend::kAdapter, kernels);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn-props: %s\n", e.what());
    return 2;
  }
  PropertyOptions o;
  o.max_success = max_success;
  o.seed = seed;
  o.shrink = !no_shrink;
  o.strict = strict;
  o.out = out;
  o.quiet = quiet;
  (void)parse_value_domain(values, o.domain);
  o.dtype = *parse_dtype(dtype);
  (void)parse_pass(pass, o.pass);
  if (has_backward(o.pass) && o.dtype != AF_DTYPE_F32 && o.dtype != AF_DTYPE_F16 && o.dtype != AF_DTYPE_BF16) {
    std::fprintf(stderr, "attn-props: the backward pass is checked in f32, f16 and bf16 only (--pass %s with --dtype %s)\n",
                 pass.c_str(), dtype.c_str());
    return 2;
  }
  int failures = 0, ran = 0;
  std::string why_none;  // why the last (property, kernel) ran no case
  std::map<std::pair<std::string, std::string>, std::string> cell;
  for (const KernelEntry* k : ks)
    for (Property p : props) {
      const PropertyOutcome r = run_property(p, *k, o);
      // A pass of 0 cases checked nothing (no backward launch, no mask, dense only): "skip" with the reason.
      const bool skipped = r.passed && r.tests == 0;
      const char* v = skipped ? "skip" : r.passed ? "pass" : r.gave_up ? "gave up" : "FAIL";
      failures += !r.passed;
      ran += r.tests > 0 || !r.passed;
      std::string note = r.passed ? "" : r.failure;
      if (skipped) {
        note = r.rc_message.empty() ? "nothing to run" : r.rc_message;
        while (!note.empty() && (note.back() == '\n' || note.back() == ' ')) note.pop_back();
        why_none = note;
      }
      std::printf("%-18s %-28s %-5s %3d case(s) %4.1fs%s%s\n", property_name(p), k->kernel.name, v, r.tests,
                  r.seconds, note.empty() ? "" : "  ", note.c_str());
      std::fflush(stdout);
      cell[{k->kernel.name, property_name(p)}] = skipped ? "skip" : r.passed ? "pass" : "**FAIL**";
    }
  if (ran == 0) {
    std::fprintf(stderr, "attn-props: nothing checked: no selected (property, kernel) pair ran a case (%s)\n",
                 why_none.c_str());
    return 2;
  }
  if (!table.empty()) {
    FILE* f = std::fopen(table.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "attn-props: cannot write %s\n", table.c_str());
      return 2;
    }
    std::fprintf(f, "| kernel |");
    for (Property p : props) std::fprintf(f, " %s |", property_name(p));
    std::fprintf(f, "\n|---|");
    for (size_t i = 0; i < props.size(); ++i) std::fprintf(f, "---|");
    std::fprintf(f, "\n");
    for (const KernelEntry* k : ks) {
      std::fprintf(f, "| %s |", k->kernel.name);
      for (Property p : props) std::fprintf(f, " %s |", cell[{k->kernel.name, property_name(p)}].c_str());
      std::fprintf(f, "\n");
    }
    std::fclose(f);
  }
  return failures ? 1 : 0;
}
