// registry_test.cpp - the kernel registry: ABI v1 plug-ins still load and run, tunables are validated and
// resolved.
#include "attnfuzz/registry.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "check/runner.h"

namespace attnfuzz {
namespace {

const KernelEntry& v1_kernel() {
  static std::once_flag once;
  std::call_once(once, [] { Registry::global().load_plugin(V1_PLUGIN); });
  const KernelEntry* e = Registry::global().find(Backend::kCpu, "v1-naive");
  if (!e) throw std::runtime_error("v1-naive not registered");
  return *e;
}

TEST(Registry, AbiV1PluginLoadsWithEveryV2FieldZero) {
  const KernelEntry& e = v1_kernel();
  EXPECT_STREQ(e.kernel.family, "naive");
  EXPECT_EQ(e.kernel.max_head_dim, 512);
  EXPECT_EQ(e.kernel.writes_lse, 1);
  EXPECT_NE(e.kernel.launch, nullptr);
  EXPECT_EQ(e.kernel.features, 0u);
  EXPECT_EQ(e.kernel.n_tunables, 0);
  EXPECT_EQ(e.kernel.tunables, nullptr);
  EXPECT_EQ(e.kernel.launch_bwd, nullptr);
  EXPECT_EQ(e.kernel.bwd_workspace_bytes, nullptr);
}

TEST(Registry, AbiV1PluginPassesAgainstTheOracle) {
  const KernelEntry& e = v1_kernel();
  DeviceOptions o;
  o.workers = 1;
  auto dev = open_device("cpu", o);
  Problem p = make_problem(2, 4, 2, 7, 13, 19, 11);  // GQA, Dv != D: every v1 stride and shape field is read
  PreparedCase pc(make_case(p, 3));
  Judged j = check_case(*dev, e, pc, RunOptions{});
  EXPECT_EQ(j.result.verdict, Verdict::kPass) << j.result.reason;
}

TEST(Registry, RefusesAPluginOfAnUnknownAbiVersion) {
  Registry r;
  try {
    r.load_plugin(ABI99_PLUGIN);
    FAIL() << "an ABI 99 plug-in was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("ABI version 99"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("versions 1 to 2"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(r.all().empty());
}

af_tunable splits_tunable() {
  af_tunable t{};
  t.name = "num_splits";
  t.description = "KV splits";
  t.role = AF_TUNABLE_KV_SPLITS;
  t.n_values = 3;
  t.values[0] = 4;
  t.values[1] = 1;
  t.values[2] = 7;
  return t;
}

TEST(Registry, ResolveTunablesKeepsAcceptedValuesAndDefaultsTheRest) {
  static const af_tunable tu[] = {splits_tunable()};
  af_kernel k{};
  k.n_tunables = 1;
  k.tunables = tu;
  Problem p = make_problem(1, 1, 1, 4, 4, 8, 8);
  resolve_tunables(k, p);
  EXPECT_EQ(p.tunables[0], 4);  // 0 = default
  p.tunables[0] = 7;
  p.tunables[1] = 5;  // not declared: cleared
  resolve_tunables(k, p);
  EXPECT_EQ(p.tunables[0], 7);
  EXPECT_EQ(p.tunables[1], 0);
  p.tunables[0] = 3;  // not accepted
  resolve_tunables(k, p);
  EXPECT_EQ(p.tunables[0], 4);
  EXPECT_EQ(tunables_to_string(k, p), "num_splits=4");
}

int noop_launch(const af_problem*, const af_buffers*, void*) { return 0; }

TEST(Registry, RefusesMalformedTunables) {
  Registry r;
  af_tunable bad = splits_tunable();
  bad.values[1] = 0;  // values must be >= 1 (0 means "default" in a case)
  af_kernel k{};
  k.name = "t";
  k.family = "t";
  k.launch = noop_launch;
  k.n_tunables = 1;
  k.tunables = &bad;
  EXPECT_THROW(r.add(Backend::kCpu, &k, 1, "test"), std::runtime_error);
  k.n_tunables = AF_MAX_TUNABLES + 1;
  EXPECT_THROW(r.add(Backend::kCpu, &k, 1, "test"), std::runtime_error);
  af_tunable good = splits_tunable();
  k.n_tunables = 1;
  k.tunables = &good;
  EXPECT_NO_THROW(r.add(Backend::kCpu, &k, 1, "test"));
}

TEST(Registry, UnsupportedReasonNamesTheMissingLayoutFeature) {
  af_kernel k{};
  Problem p = make_problem(1, 1, 1, 4, 4, 8, 8);
  EXPECT_EQ(unsupported_reason(k, p), "");
  p.kv_layout = AF_SEQ_PAGED;
  EXPECT_EQ(unsupported_reason(k, p), "paged k/v not supported");
  k.features = AF_FEATURE_KV_PAGED;
  EXPECT_EQ(unsupported_reason(k, p), "");
}

}  // namespace
}  // namespace attnfuzz
