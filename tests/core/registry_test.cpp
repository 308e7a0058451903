// registry_test.cpp - the kernel registry: ABI v1 and v2 plug-ins still load and run, tunables and v3
// declarations are validated, support questions see the pass and the declared page sizes.
#include "attnfuzz/registry.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
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
    EXPECT_NE(std::string(e.what()).find("versions 1 to 3"), std::string::npos) << e.what();
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

// Issue 27 item 17: --plugin libx.so (no directory) is the file here, as the existence check read it, not a
// name for dlopen's library search.
TEST(Registry, APluginNamedWithoutADirectoryIsTheFileHere) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("af-plugin-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(V1_PLUGIN, dir / "libcopy.so", std::filesystem::copy_options::overwrite_existing);
  const auto here = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  Registry r;
  EXPECT_NO_THROW(r.load_plugin("libcopy.so"));
  std::filesystem::current_path(here);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(r.all().size(), 1u);
  EXPECT_STREQ(r.all()[0].kernel.name, "v1-naive");
}

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

// Issue 27 item 12: a table whose names, tunables or bits the tools cannot use is refused at load, with a
// message naming the kernel, never listed and then unselectable.
TEST(Registry, RefusesTablesTheToolsCannotUse) {
  auto refused = [](af_kernel k, const std::string& says) {
    Registry r;
    try {
      r.add(Backend::kCpu, &k, 1, "test");
      ADD_FAILURE() << "accepted: " << says;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  af_kernel k{};
  k.name = "t";
  k.family = "t";
  k.launch = noop_launch;
  for (const char* name : {"bad,comma", "all", "star*", "two words", "q?"}) {
    af_kernel n = k;
    n.name = name;
    refused(n, "cannot be selected by --kernel");
  }
  af_kernel f = k;
  f.features = 1u << 7;
  refused(f, "feature bit this attn-fuzz does not know");
  af_kernel m = k;
  m.masks = 1u << 9;
  refused(m, "unknown mask bits");
  af_kernel d = k;
  d.max_head_dim = -5;
  refused(d, "negative max head dim");
  static af_tunable spaced = splits_tunable();
  spaced.name = "num splits=3";
  af_kernel t1 = k;
  t1.n_tunables = 1;
  t1.tunables = &spaced;
  refused(t1, "tunable 'num splits=3'");
  static const af_tunable twice[] = {splits_tunable(), splits_tunable()};
  af_kernel t2 = k;
  t2.n_tunables = 2;
  t2.tunables = twice;
  refused(t2, "declares the tunable 'num_splits' twice");
}

// Items 5 and 11: the values a replay refuses (the CLI's --tunable refuses the same).
TEST(Registry, TunablesRefusalNamesTheValueAndWhatIsAccepted) {
  static const af_tunable tu[] = {splits_tunable()};
  af_kernel k{};
  k.name = "s";
  k.n_tunables = 1;
  k.tunables = tu;
  Problem p = make_problem(1, 1, 1, 4, 4, 8, 8);
  EXPECT_EQ(tunables_refusal(k, p), "");  // 0: the default
  p.tunables[0] = 7;
  EXPECT_EQ(tunables_refusal(k, p), "");
  p.tunables[0] = 3;
  EXPECT_EQ(tunables_refusal(k, p), "tunables[0] = 3: kernel s's num_splits accepts 4, 1, 7 (0 = default)");
  p.tunables[0] = 0;
  p.tunables[2] = 1;
  EXPECT_EQ(tunables_refusal(k, p), "tunables[2] = 1, but kernel s declares 1 tunable(s)");
}

TEST(Registry, UnsupportedReasonNamesTheMissingLayoutFeature) {
  af_kernel k{};
  k.launch = noop_launch;
  Problem p = make_problem(1, 1, 1, 4, 4, 8, 8);
  EXPECT_EQ(unsupported_reason(k, p), "");
  p.kv_layout = AF_SEQ_PAGED;
  p.page_size = 16;
  EXPECT_EQ(unsupported_reason(k, p), "paged k/v not supported");
  k.features = AF_FEATURE_KV_PAGED;
  EXPECT_EQ(unsupported_reason(k, p), "");
}

// Issue 28: a kernel declaring layouts and variants takes a variant case on a layout only with
// AF_FEATURE_LAYOUT_VARIANTS; kv-shared (geometry) and dense variant cases need no such bit.
TEST(Registry, VariantsOnALayoutNeedTheLayoutVariantsFeature) {
  af_kernel k{};
  k.launch = noop_launch;
  k.features = AF_FEATURE_Q_PACKED | AF_FEATURE_KV_PACKED;
  k.variants = AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI | AF_VARIANT_KV_SHARED;
  Problem p = make_problem(2, 2, 1, 4, 4, 8, 8);
  p.variants = AF_VARIANT_SINK | AF_VARIANT_SOFTCAP;
  p.softcap = 30;
  EXPECT_EQ(unsupported_reason(k, p), "");  // dense
  p.q_layout = p.kv_layout = AF_SEQ_PACKED;
  EXPECT_EQ(unsupported_reason(k, p),
            "variant sink+softcap on a sequence layout (varlen) not declared by the kernel "
            "(AF_FEATURE_LAYOUT_VARIANTS in af_kernel::features)");
  k.features |= AF_FEATURE_LAYOUT_VARIANTS;
  EXPECT_EQ(unsupported_reason(k, p), "");
  k.features &= ~AF_FEATURE_LAYOUT_VARIANTS;
  p.variants = AF_VARIANT_KV_SHARED;
  EXPECT_EQ(unsupported_reason(k, p), "");
  Registry r;  // the bit is known: a table declaring it loads
  k.name = "lv";
  k.family = "t";
  k.features |= AF_FEATURE_LAYOUT_VARIANTS;
  EXPECT_NO_THROW(r.add(Backend::kCpu, &k, 1, "test"));
}

TEST(Registry, AbiV2PluginLoadsWithItsV2FieldsAndEveryV3FieldZero) {
  static std::once_flag once;
  std::call_once(once, [] { Registry::global().load_plugin(V2_PLUGIN); });
  const KernelEntry* e = Registry::global().find(Backend::kCpu, "v2-naive");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->kernel.max_head_dim, 512);
  ASSERT_EQ(e->kernel.n_tunables, 1);
  EXPECT_STREQ(e->kernel.tunables[0].name, "unroll");
  EXPECT_EQ(e->kernel.tunables[0].values[1], 5);
  EXPECT_EQ(e->kernel.launch_bwd, nullptr);
  EXPECT_EQ(e->kernel.compute_model, AF_COMPUTE_FUSED);
  EXPECT_EQ(e->kernel.kind, AF_KIND_ATTENTION);
  EXPECT_EQ(e->kernel.flags | e->kernel.variants | e->kernel.dropout_rngs, 0u);
  EXPECT_EQ(e->kernel.min_page_size + e->kernel.max_page_size, 0);
  DeviceOptions o;
  o.workers = 1;
  auto dev = open_device("cpu", o);
  PreparedCase pc(make_case(make_problem(2, 4, 2, 7, 13, 19, 11), 5));
  Judged j = check_case(*dev, *e, pc, RunOptions{});
  EXPECT_EQ(j.result.verdict, Verdict::kPass) << j.result.reason;
}

int g_asked[4], g_n_asked = 0;
int recording_check(const af_problem* p, char*, size_t) {
  if (g_n_asked < 4) g_asked[g_n_asked++] = p->pass;
  return 0;
}

TEST(Registry, ABackwardOnlyKernelLoadsAndClaimsBackwardCasesOnly) {
  Registry r;
  af_kernel k{};
  k.name = "bwd-only";
  k.family = "t";
  k.launch_bwd = noop_launch;
  k.writes_lse = 1;
  ASSERT_NO_THROW(r.add(Backend::kCpu, &k, 1, "test"));
  const Problem p = make_problem(1, 1, 1, 4, 4, 8, 8);
  EXPECT_NE(case_unsupported_reason(k, p, Pass::kFwd).find("backward-only"), std::string::npos);
  EXPECT_NE(case_unsupported_reason(k, p, Pass::kFwdBwd).find("backward-only"), std::string::npos);
  EXPECT_EQ(case_unsupported_reason(k, p, Pass::kBwd), "");
  k.launch_bwd = nullptr;  // neither launch: refused
  k.name = "no-launch";
  EXPECT_THROW(r.add(Backend::kCpu, &k, 1, "test"), std::runtime_error);
}

TEST(Registry, CheckSupportSeesThePassItIsAskedAbout) {
  af_kernel k{};
  k.launch = noop_launch;
  k.launch_bwd = noop_launch;
  k.writes_lse = 1;
  k.check_support = recording_check;
  const Problem p = make_problem(1, 1, 1, 4, 4, 8, 8);
  g_n_asked = 0;
  EXPECT_EQ(case_unsupported_reason(k, p, Pass::kBwd), "");
  ASSERT_EQ(g_n_asked, 1);
  EXPECT_EQ(g_asked[0], AF_PASS_BACKWARD);
  g_n_asked = 0;
  EXPECT_EQ(case_unsupported_reason(k, p, Pass::kFwdBwd), "");  // asked once per launch it will get
  ASSERT_EQ(g_n_asked, 2);
  EXPECT_EQ(g_asked[0], AF_PASS_FORWARD);
  EXPECT_EQ(g_asked[1], AF_PASS_BACKWARD);
}

TEST(Registry, PageSizesFollowTheKernelsDeclaration) {
  af_kernel k{};
  k.launch = noop_launch;
  k.features = AF_FEATURE_KV_PAGED;
  Problem p = make_problem(1, 1, 1, 4, 4, 8, 8);
  p.kv_layout = AF_SEQ_PAGED;
  p.page_size = 1;  // vLLM / FlashInfer's page size 1
  EXPECT_NE(unsupported_reason(k, p).find("16 .. 256"), std::string::npos) << unsupported_reason(k, p);
  k.min_page_size = 1;
  k.max_page_size = 1024;
  EXPECT_EQ(unsupported_reason(k, p), "");
  p.page_size = 1024;
  EXPECT_EQ(unsupported_reason(k, p), "");
  Registry r;
  k.name = "pages";
  k.family = "t";
  k.max_page_size = 2048;  // beyond the ABI's range
  EXPECT_THROW(r.add(Backend::kCpu, &k, 1, "test"), std::runtime_error);
}

TEST(Registry, RefusesDeclarationsThisVersionDoesNotKnow) {
  Registry r;
  af_kernel k{};
  k.name = "x";
  k.family = "t";
  k.launch = noop_launch;
  k.compute_model = 7;
  EXPECT_THROW(r.add(Backend::kCpu, &k, 1, "test"), std::runtime_error);
  k.compute_model = AF_COMPUTE_UNFUSED;
  k.variants = 1u << 30;
  EXPECT_THROW(r.add(Backend::kCpu, &k, 1, "test"), std::runtime_error);
  k.variants = 0;
  k.features = 1u << 9;
  EXPECT_THROW(r.add(Backend::kCpu, &k, 1, "test"), std::runtime_error);
  k.features = 1u << 5;  // the first bit past AF_FEATURE_LAYOUT_VARIANTS
  EXPECT_THROW(r.add(Backend::kCpu, &k, 1, "test"), std::runtime_error);
  k.features = 0;
  EXPECT_NO_THROW(r.add(Backend::kCpu, &k, 1, "test"));
}

}  // namespace
}  // namespace attnfuzz
