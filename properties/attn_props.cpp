// attn_props.cpp - attn-props: runs the RapidCheck properties over kernels (long campaigns, the README's
// table).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "attnfuzz/registry.h"
#include "properties/properties.h"

using namespace attnfuzz;
using namespace attnfuzz::props;

int main(int argc, char** argv) {
  std::string properties = "all", kernels = "all", out, table, adapter;
  std::vector<std::string> plugins;
  int max_success = 50;
  uint64_t seed = 0;
  bool no_shrink = false, strict = false, quiet = false;
  std::string values = "ieee", pass = "fwd";
  CLI::App app{
      "attn-props: RapidCheck properties (oracle and metamorphic) of attention kernels on the cpu "
      "emulator. RC_PARAMS, when set, overrides --max-success / --seed (e.g. reproduce=...)."};
  app.add_option("--property,-p", properties, "comma-separated property names, or 'all'")
      ->capture_default_str();
  app.add_option("--kernel,-k", kernels, "kernel names or globs, comma separated ('all')")
      ->capture_default_str();
  app.add_option("--plugin", plugins, "load kernels from a cpu plug-in shared library (repeatable)");
  app.add_option("--adapter", adapter,
                 "run the properties on the kernels of this adapter process (adapters/PROTOCOL.md)");
  app.add_option("--max-success,-n", max_success, "cases per (property, kernel)")->capture_default_str();
  app.add_option("--seed", seed, "RapidCheck seed (0: fixed per property and kernel)")->capture_default_str();
  app.add_flag("--no-shrink", no_shrink, "report the first failing case without shrinking");
  app.add_flag("--strict", strict, "causal-prefix, row-independence and batch-head must hold bitwise");
  app.add_option("--out,-o", out,
                 "directory for failing cases (default $ATTNFUZZ_PROPERTY_OUT or "
                 "<build>/property-failures)");
  app.add_option("--table", table, "also write a Markdown table property x kernel to this file");
  app.add_flag("--quiet,-q", quiet, "no per-failure report");
  app.add_option("--values", values, "value domain: ieee | finite (no NaN / Inf in cases and perturbations)")
      ->check(CLI::IsMember({"ieee", "finite"}))
      ->capture_default_str();
  std::string dtype = "f32";
  app.add_option("--dtype", dtype, "dtype of generated cases: f32 | f16 | bf16 | fp8-e4m3 | fp8-e5m2")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "fp8-e4m3", "fp8-e5m2"}))
      ->capture_default_str();
  app.add_option("--pass", pass,
                 "pass of the cases: fwd | bwd | fwdbwd (backward: oracle, key-permutation, batch-head and determinism "
                 "on dQ / dK / dV; kernels without a backward launch are not run)")
      ->check(CLI::IsMember({"fwd", "bwd", "fwdbwd"}))
      ->capture_default_str();
  app.set_version_flag("--version", "attn-props " ATTNFUZZ_VERSION);
  CLI11_PARSE(app, argc, argv);

  std::vector<Property> props;
  if (properties == "all") {
    props = all_properties();
  } else {
    std::stringstream ss(properties);
    for (std::string name; std::getline(ss, name, ',');) {
      Property p;
      if (!parse_property(name, p)) {
        std::fprintf(stderr, "attn-props: unknown property '%s'\n", name.c_str());
        return 2;
      }
      props.push_back(p);
    }
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
  int failures = 0;
  std::map<std::pair<std::string, std::string>, std::string> cell;
  for (const KernelEntry* k : ks)
    for (Property p : props) {
      const PropertyOutcome r = run_property(p, *k, o);
      const char* v = r.passed ? "pass" : r.gave_up ? "gave up" : "FAIL";
      failures += !r.passed;
      std::printf("%-18s %-28s %-5s %3d case(s) %4.1fs%s%s\n", property_name(p), k->kernel.name, v, r.tests,
                  r.seconds, r.passed ? "" : "  ", r.passed ? "" : r.failure.c_str());
      std::fflush(stdout);
      cell[{k->kernel.name, property_name(p)}] = r.passed ? "pass" : "**FAIL**";
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
