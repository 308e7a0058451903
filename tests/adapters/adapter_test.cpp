// adapter_test.cpp - attn-check / attn-fuzz --adapter end to end with the numpy adapters (python3 + numpy).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <filesystem>
#include <fstream>
#include <functional>
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "attnfuzz/corpus.h"

namespace fs = std::filesystem;

namespace {

// The class each planted numpy bug must get, exactly.
const std::vector<std::pair<std::string, std::vector<std::string>>> kPlantedClasses = {
    {"mask-leak", {"mask"}},
    {"missing-rescale", {"rescale"}},
    {"empty-row-nan", {"empty-row"}},
    {"lse-error", {"lse"}},
    {"empty-row-mean", {"empty-row"}},  // issue 25 item 7: not `mask` (the masked-K/V probe skips empty rows)
    {"split-average", {"split-kv"}},    // issue 25 item 7: through the adapter's declared num_splits tunable
};

struct Result {
  int code;
  std::string out;  // stdout and stderr
};

std::string py() {
  return "PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=" + std::string(SOURCE_DIR) + "/python " + PYTHON;
}
std::string bin_dir() { return fs::path(ATTN_CHECK).parent_path().string(); }
std::string numpy_adapter(const std::string& extra = "") {
  return py() + " -m attnfuzz.adapters.numpy_ref" + (extra.empty() ? "" : " " + extra);
}
std::string misbehaving(const std::string& mode) {
  return py() + " " + SOURCE_DIR + "/tests/adapters/misbehaving_adapter.py " + mode;
}
std::string q(const std::string& s) { return "'" + s + "'"; }

Result sh(const std::string& cmd) {
  static int n = 0;
  const fs::path dir = fs::path(TEST_TMP);
  fs::create_directories(dir);
  const fs::path log = dir / ("log-" + std::to_string(getpid()) + "-" + std::to_string(n++) + ".txt");
  const int st = std::system((cmd + " > " + log.string() + " 2>&1").c_str());
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, ss.str()};
}

Result check(const std::string& adapter, const std::string& args, const std::string& out) {
  return sh(std::string(ATTN_CHECK) + " --adapter " + q(adapter) + " --out " + out + " " + args);
}

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

std::string fresh(const std::string& name) {
  const fs::path d = fs::path(TEST_TMP) / name;
  fs::remove_all(d);
  return d.string();
}

bool have_numpy() { return sh(py() + " -c 'import numpy'").code == 0; }

// String values of the given keys anywhere in a report.json (default: the failure classes).
std::vector<std::string> classes_in(const std::string& out,
                                    const std::vector<std::string>& keys = {"failure", "class"}) {
  std::ifstream f(fs::path(out) / "report.json");
  std::vector<std::string> v;
  if (!f) return v;
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& x) {
    if (x.is_object()) {
      for (auto it = x.begin(); it != x.end(); ++it) {
        if (std::find(keys.begin(), keys.end(), it.key()) != keys.end() && it->is_string())
          v.push_back(it->get<std::string>());
        walk(*it);
      }
    } else if (x.is_array()) {
      for (const auto& e : x) walk(e);
    }
  };
  walk(j);
  return v;
}

#define NEED_NUMPY() \
  if (!have_numpy()) GTEST_SKIP() << "python3 with numpy is not installed (scripts/install-deps.sh)"

TEST(Adapter, NumpyReferencePassesTheSweep) {
  NEED_NUMPY();
  const std::string out = fresh("sweep");
  Result r = check(numpy_adapter(), "--sweep --quiet", out);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "all passed")) << r.out;
  EXPECT_TRUE(has(r.out, "numpy-ref")) << r.out;
}

// f16 / bf16 / fp8 travel as stored elements: the numpy reference (P and O rounded like a kernel in that dtype;
// fp8 with descales) passes each dtype's sweep under the low-precision bound.
TEST(Adapter, NumpyReferencePassesTheLowPrecisionSweeps) {
  NEED_NUMPY();
  for (const char* dt : {"f16", "bf16", "fp8-e4m3", "fp8-e5m2"}) {
    const std::string out = fresh(std::string("sweep-") + dt);
    Result r = check(numpy_adapter(), std::string("--sweep --quiet --dtype ") + dt, out);
    EXPECT_EQ(r.code, 0) << dt << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "all passed")) << dt << "\n" << r.out;
    const auto verdicts = classes_in(out, {"verdict"});  // checked, not refused as unsupported
    EXPECT_GE(std::count(verdicts.begin(), verdicts.end(), std::string("pass")), 100) << dt << "\n" << r.out;
  }
}

// An adapter that declares no dtypes (written for f32 only) is never sent an f16 case: unsupported, not a failure.
TEST(Adapter, AnF32OnlyAdapterIsOfferedF32CasesOnly) {
  NEED_NUMPY();
  Result r = check(misbehaving("v1"), "--dtype f16 --sq 5 --sk 7 --d 8 --no-reports", fresh("v1-f16"));
  EXPECT_EQ(r.code, 2) << r.out;  // every check unsupported: nothing checked (issue 27 item 9)
  EXPECT_TRUE(has(r.out, "dtype f16 not supported")) << r.out;
  EXPECT_TRUE(has(r.out, "nothing checked")) << r.out;
  r = check(misbehaving("v1"), "--sq 5 --sk 7 --d 8 --no-reports", fresh("v1-f32"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "pass")) << r.out;
  // O in another dtype than the problem's is a protocol error of that case.
  r = check(misbehaving("f16-as-f32"), "--dtype f16 --sq 5 --sk 7 --d 8 --no-reports", fresh("f16-as-f32"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "tensor o has dtype f32, expected f16")) << r.out;
}

// A planted bug keeps its class in half precision (the bound is wider, the mask leak still stands out).
TEST(Adapter, PlantedBugsAreFoundInLowPrecisionWithTheirClass) {
  NEED_NUMPY();
  const std::tuple<const char*, const char*, const char*, const char*> cases[] = {
      {"mask-leak", "f16", "--sq 33 --sk 33 --d 16 --mask causal-br", "mask"},
      {"mask-leak", "fp8-e4m3", "--sq 33 --sk 33 --d 16 --mask causal-br", "mask"},
      {"empty-row-nan", "bf16", "--sq 9 --sk 4 --d 16 --mask causal-br", "empty-row"},
      // a row's last partial 16-key tile never loaded: `precision` before the keys probe (the tail paddings are f32)
      {"last-tile-dropped", "bf16", "--sq 4 --sk 37 --d 16", "mask"},
      {"last-tile-dropped", "f16", "--sq 4 --sk 100 --d 16", "mask"},
  };
  for (auto [bug, dt, shape, cls] : cases) {
    const std::string out = fresh(std::string("planted-") + dt + "-" + bug);
    Result r = check(numpy_adapter(std::string("--bug ") + bug), std::string(shape) + " --dtype " + dt, out);
    EXPECT_EQ(r.code, 1) << bug << "\n" << r.out;
    const auto got = classes_in(out);
    EXPECT_NE(std::find(got.begin(), got.end(), std::string(cls)), got.end()) << bug << " " << dt << "\n" << r.out;
    const auto dtypes = classes_in(out, {"dtype"});  // the report records the case's dtype
    EXPECT_NE(std::find(dtypes.begin(), dtypes.end(), std::string(dt)), dtypes.end()) << r.out;
  }
}

// An O element outside the range of V over its row's visible keys is no rounding of the right value: `wrong`, even
// where the low-precision bound leaves its err/bound under the precision limit of 1000. Pallas mha's outputs 16x too
// large on short sequences were `precision` at err/bound 150 (an H100 campaign); numpy_ref --bug short-seq-16x is
// that bug, here at err/bound 693.
TEST(Adapter, AnOutputOutsideTheRangeOfVIsWrongNotPrecision) {
  NEED_NUMPY();
  const std::string out = fresh("short-seq-16x");
  const Result r = check(numpy_adapter("--bug short-seq-16x"), "--sq 1 --sk 4 --d 1 --dtype f16 --scale 1 --seed 1",
                         out);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, " wrong ") && has(r.out, "err/bound 693")) << r.out;  // under the limit: the range decided
  std::ifstream f(fs::path(out) / "report.json");
  const nlohmann::json res = nlohmann::json::parse(f)["results"][0];
  EXPECT_EQ(res["class"], "wrong") << res.dump();
  EXPECT_TRUE(has(res["evidence"].dump(), "lies outside [") &&
              has(res["evidence"].dump(), "no softmax weighting of them gives it"))
      << res.dump();
  const Result ok = check(numpy_adapter(), "--sq 1 --sk 4 --d 1 --dtype f16 --scale 1 --seed 1 --no-reports",
                          fresh("short-seq-16x-ref"));
  EXPECT_EQ(ok.code, 0) << ok.out;
}

// Pallas's gqa decode at D = 1 on an H100 returned, to the f16 bit, the attention at 16 times its scale; numpy_ref --bug
// headdim-repeat-16 is that bug (q.k counted 16 / D times). On the minimized case the scale detector names the factor;
// the class stays the magnitude's (here wrong: numpy_ref returns the LSE too, err/bound 1.57e3; Pallas returned O
// alone, err/bound 170, which stays precision).
TEST(Adapter, ScoresSixteenTimesTooLargeAreNamedByTheScaleDetector) {
  NEED_NUMPY();
  const std::string out = fresh("headdim-repeat-16");
  const Result r = check(numpy_adapter("--bug headdim-repeat-16"),
                         "--replay " + std::string(SOURCE_DIR) +
                             "/examples/h100-campaigns-s20/pallas-f16--pallas-gqa-decode--precision-85407c3147c567fa.case"
                             " --kernel numpy-headdim-repeat-16",
                         out);
  EXPECT_EQ(r.code, 1) << r.out;
  std::ifstream f(fs::path(out) / "report.json");
  const nlohmann::json res = nlohmann::json::parse(f)["results"][0];
  EXPECT_EQ(res["class"], "wrong") << res.dump();
  EXPECT_TRUE(has(res["evidence"].dump(), "wrong by scale (")) << res.dump();
  EXPECT_TRUE(has(res["evidence"].dump(), "every score 16 times too large (scale x 16)")) << res.dump();
}

// torch's varlen_attn on an H100: window (0, unbounded) with Sq > Sk was named `rescale` by the reorder experiment
// (max key last fails), which a kernel that hides a row's last keys satisfies too. numpy_ref --bug fa2-window
// normalises the window as FlashAttention-2 does (flash-attention #895); on that case the mask detector now finds the
// mask it used, and on the earlier varlen finding (window (8, unbounded), 129x37) the same one.
TEST(Adapter, FlashAttention2sWindowNormalisationIsNamedMaskNotRescale) {
  NEED_NUMPY();
  const std::string fa2 = numpy_adapter("--bug fa2-window"), examples = std::string(SOURCE_DIR) + "/examples/";
  int n = 0;
  for (const char* file : {"h100-campaigns/varlen-bf16--torch-varlen-attn--rescale-26edd84adb39725e.case",
                           "jax-findings/varlen-window-unbounded-right-sq-gt-sk.case"}) {
    const Result r = check(fa2, "--replay " + examples + file + " --kernel numpy-fa2-window --no-reports",
                           fresh("fa2-window-" + std::to_string(n++)));
    EXPECT_EQ(r.code, 1) << file << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "  mask  ") && has(r.out, "FlashAttention-2's window normalisation")) << file << "\n"
                                                                                                   << r.out;
    EXPECT_FALSE(has(r.out, "rescale")) << file << "\n" << r.out;
  }
}

// Backward through the adapter: the numpy reference's dQ, dK, dV pass the gradient oracle on the bwd sweep and in
// fwd+bwd (its own O and LSE feed its backward); a backward that does not re-apply the mask is class mask.
// The SDPA findings (examples/sdpa-findings: failures of torch's backends on the H200) are not oracle artefacts:
// the numpy reference passes every one of those exact cases, in their dtypes and passes.
// examples/sdpa-findings, jax-findings and h100-campaigns: the library findings' exact cases pass on the numpy
// reference.
TEST(Adapter, NumpyReferencePassesEveryFindingCase) {
  NEED_NUMPY();
  for (const char* dir : {"sdpa-findings", "jax-findings", "h100-campaigns", "h200-campaigns", "h100-campaigns-s20",
                          "h100-campaigns-s22"}) {
    int n = 0;
    for (const auto& e : fs::directory_iterator(fs::path(SOURCE_DIR) / "examples" / dir)) {
      if (e.path().extension() != ".case") continue;
      ++n;
      const std::string name = e.path().stem().string();
      Result r = check(numpy_adapter(), "--replay " + e.path().string() + " --kernel numpy-ref --no-reports",
                       fresh("finding-" + name));
      EXPECT_EQ(r.code, 0) << name << "\n" << r.out;
      EXPECT_TRUE(has(r.out, "all passed")) << name << "\n" << r.out;
    }
    EXPECT_GE(n, 6) << dir;
  }
}

// SDPA takes a float attn_mask in the query's dtype, so in bf16 ALiBi + bias reach its kernels rounded: the H200's
// two float-mask `precision` findings (err/bound 3.7 and 6.5 there) are that rounding, to the last bit on an H100
// (scripts/device/float_mask_probe.py). A reference that rounds the term the same way passes them under the fused
// bound once it declares score_add_in_dtype (as torch_sdpa's float-mask route does), and fails them without.
TEST(Adapter, AScoreTermTakenInTheDtypeIsJudgedByItsDeclaration) {
  NEED_NUMPY();
  int n = 0;
  for (const auto& e : fs::directory_iterator(fs::path(SOURCE_DIR) / "examples" / "h200-campaigns")) {
    const std::string name = e.path().stem().string();
    if (e.path().extension() != ".case" || !has(name, "float-mask--precision")) continue;
    ++n;
    const std::string replay = "--replay " + e.path().string() + " --kernel numpy-ref --no-reports";
    Result r = check(numpy_adapter("--compute-model fused --score-add-in-dtype declared"), replay,
                     fresh("declared-" + name));
    EXPECT_EQ(r.code, 0) << name << "\n" << r.out;
    r = check(numpy_adapter("--compute-model fused --score-add-in-dtype undeclared"), replay,
              fresh("undeclared-" + name));
    EXPECT_EQ(r.code, 1) << name << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "precision")) << name << "\n" << r.out;
  }
  EXPECT_EQ(n, 2);
}

// A backward bound to one mask (numpy_ref --bug bwd-align-tl takes causal-br only and computes it as causal-tl, as
// an SDPA route that takes causal_lower_right only): the unmasked rerun cannot run, and on an H200 such a failure was
// left `precision`. The other-mask experiment on the gradients (an oracle experiment, no launch) names it.
TEST(Adapter, ABackwardBoundToOneMaskIsNamedMaskByTheGradientsOtherMaskExperiment) {
  NEED_NUMPY();
  const std::string out = fresh("bwd-align-tl");
  Result r = check(numpy_adapter("--bug bwd-align-tl"), "--pass bwd --sq 5 --sk 9 --d 16 --mask causal-br", out);
  EXPECT_EQ(r.code, 1) << r.out;
  const auto got = classes_in(out);
  EXPECT_NE(std::find(got.begin(), got.end(), std::string("mask")), got.end()) << r.out;
  std::ifstream md(fs::path(out) / "summary.md");
  std::stringstream text;
  text << md.rdbuf();
  EXPECT_TRUE(has(text.str(), "the gradients match the exact gradients of the same inputs under mask causal-tl"))
      << text.str();
}

// Session 20's H100 case: SDPA's efficient lower-right f16 backward (3x2, q = k = v = 0) returned dV[0] = dO_1 / 2 +
// dO_2 / 2, the bottom-right backward given the top-left forward's LSE; it was left `precision` (err/bound 97).
// numpy_ref --bug bwd-lse-tl is that computation, on that case: the forward-mask experiment names it.
// cuDNN's non-zero fully masked rows in the backward: session 22's H100 SDPA cuDNN lower-right case (40x9 causal-br,
// GQA 2:1, q = k = 0) failed every dV element of its KV head, named `wrong`; its dV was within 0.4% of a backward in
// which rows 0-30, which see no key, attend to all 9 keys. numpy_ref --bug bwd-empty-all-keys is that model: the
// empty-row detector's model fit names it, on that case (dK / dV only) and on random inputs (dQ too).
// Session 22's H100 jax-xla-bias case (31x1 causal-br, no LSE): rows 0-29 see no key and averaged V, which at Sk = 1
// is the unmasked result, so the mask detector's other-mask fit named it `mask`. A match that differs from the asked
// mask only in rows without keys is left to the empty-row detector.
TEST(Adapter, RowsWithoutKeysThatAverageVAreEmptyRowEvenWhereAnotherMaskMatches) {
  NEED_NUMPY();
  const std::string out = fresh("empty-row-mean-no-lse");
  Result r = check(numpy_adapter("--bug empty-row-mean --no-lse"),
                   "--replay " + std::string(SOURCE_DIR) +
                       "/examples/h100-campaigns-s22/jax-bf16--jax-xla-bias--mask-43dfe4d87a158d1f.case "
                       "--kernel numpy-empty-row-mean",
                   out);
  EXPECT_EQ(r.code, 1) << r.out;
  std::ifstream f(fs::path(out) / "report.json");
  const nlohmann::json res = nlohmann::json::parse(f)["results"][0];
  EXPECT_EQ(res["class"], "empty-row") << res.dump();
  EXPECT_TRUE(has(res["evidence"].dump(), "every failing row sees no key under the asked mask")) << res.dump();
}

TEST(Adapter, ABackwardWhoseRowsWithoutKeysAttendToEveryKeyIsNamedEmptyRow) {
  NEED_NUMPY();
  const std::string out = fresh("bwd-empty-all-keys");
  Result r = check(numpy_adapter("--bug bwd-empty-all-keys"),
                   "--replay " + std::string(SOURCE_DIR) +
                       "/examples/h100-campaigns-s22/sdpa-bwd-f16--sdpa-cudnn-lower-right--wrong-fda35cbce2b8d8e1.case "
                       "--kernel numpy-bwd-empty-all-keys",
                   out);
  EXPECT_EQ(r.code, 1) << r.out;
  std::ifstream f(fs::path(out) / "report.json");
  const nlohmann::json res = nlohmann::json::parse(f)["results"][0];
  EXPECT_EQ(res["class"], "empty-row") << res.dump();
  EXPECT_TRUE(has(res["evidence"].dump(), "the gradients match a model in which each of those rows attends to every "
                                          "key (P the softmax over all 9 keys, as if unmasked): all 3136 computed"))
      << res.dump();
  r = check(numpy_adapter("--bug bwd-empty-all-keys"), "--pass bwd --sq 9 --sk 4 --d 8 --mask causal-br --dtype f16",
            fresh("bwd-empty-all-keys-9x4"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "empty-row x1")) << r.out;
}

TEST(Adapter, ABackwardGivenAnotherMasksForwardIsNamedMask) {
  NEED_NUMPY();
  const std::string out = fresh("bwd-lse-tl");
  Result r = check(numpy_adapter("--bug bwd-lse-tl"),
                   "--replay " + std::string(SOURCE_DIR) +
                       "/examples/h100-campaigns-s20/sdpa-bwd-f16--sdpa-efficient-lower-right--precision-"
                       "25042af24e23d25e.case --kernel numpy-bwd-lse-tl",
                   out);
  EXPECT_EQ(r.code, 1) << r.out;
  std::ifstream f(fs::path(out) / "report.json");
  const nlohmann::json res = nlohmann::json::parse(f)["results"][0];
  EXPECT_EQ(res["class"], "mask") << res.dump();
  // With q = k = 0 every score is 0: the forward of mask none gives these rows the same LSE as causal-tl's.
  EXPECT_TRUE(has(res["evidence"].dump(), "the gradients match a backward under the asked mask causal-br given the "
                                          "forward (O, LSE) of mask none or causal-tl: all 56 computed elements"))
      << res.dump();
  // Where the forwards differ on rows the backward uses (random inputs, 5x4: bottom-right row 1 sees key 0, top-left
  // keys 0-1, none all 4), the top-left forward alone fits.
  const std::string out2 = fresh("bwd-lse-tl-5x4");
  r = check(numpy_adapter("--bug bwd-lse-tl"), "--pass bwd --sq 5 --sk 4 --d 8 --mask causal-br", out2);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "given the forward (O, LSE) of mask causal-tl: all")) << r.out;
  // The reference itself passes the case.
  EXPECT_EQ(check(numpy_adapter(), "--replay " + std::string(SOURCE_DIR) +
                                       "/examples/h100-campaigns-s20/sdpa-bwd-f16--sdpa-efficient-lower-right--"
                                       "precision-25042af24e23d25e.case --kernel numpy-ref --no-reports",
                  fresh("bwd-lse-tl-ref"))
                .code,
            0);
}

TEST(Adapter, BackwardSweepPassesAndAPlantedBackwardBugIsFound) {
  NEED_NUMPY();
  Result r = check(numpy_adapter(), "--sweep --quiet --pass bwd", fresh("sweep-bwd"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "all passed")) << r.out;
  r = check(numpy_adapter(), "--pass fwdbwd --sq 9 --sk 4 --d 16 --kv-heads 1 --heads 2 --mask causal-br",
            fresh("fwdbwd"));
  EXPECT_EQ(r.code, 0) << r.out;
  const std::string out = fresh("planted-bwd");
  r = check(numpy_adapter("--bug bwd-mask-leak"), "--pass bwd --sq 33 --sk 33 --d 16 --mask causal-tl", out);
  EXPECT_EQ(r.code, 1) << r.out;
  const auto got = classes_in(out);
  EXPECT_NE(std::find(got.begin(), got.end(), std::string("mask")), got.end()) << r.out;
  EXPECT_TRUE(has(r.out, "--pass bwd") || has(r.out, "bwd")) << r.out;
  // Low-precision backward (backward_dtypes): the numpy reference's f16 gradients pass, its planted backward bug
  // is found in bf16; a declaration without backward_dtypes keeps its backward f32 only (protocol 1 as before).
  r = check(numpy_adapter(), "--pass bwd --dtype f16 --sq 17 --sk 17 --d 16 --heads 2 --kv-heads 1 --mask causal-br",
            fresh("bwd-f16"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "1 check in")) << r.out;
  EXPECT_TRUE(has(r.out, "all passed")) << r.out;
  const std::string out16 = fresh("planted-bwd-bf16");
  r = check(numpy_adapter("--bug bwd-mask-leak"), "--pass bwd --dtype bf16 --sq 33 --sk 33 --d 16 --mask causal-tl",
            out16);
  EXPECT_EQ(r.code, 1) << r.out;
  const auto got16 = classes_in(out16);
  EXPECT_NE(std::find(got16.begin(), got16.end(), std::string("mask")), got16.end()) << r.out;
  r = check(misbehaving("bwd-no-dtypes"), "--pass bwd --dtype f16 --sq 5 --sk 7 --d 8 --no-reports",
            fresh("bwd-no-dtypes"));
  EXPECT_EQ(r.code, 2) << r.out;  // the one check is unsupported: nothing checked (issue 27 item 9)
  EXPECT_TRUE(has(r.out, "does not take f16")) << r.out;
  // The callable adapter serves a user's backward function next to the forward one (and bf16 forward arrays).
  const std::string callable = "PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=" + std::string(SOURCE_DIR) + "/python:" +
                               SOURCE_DIR + "/tests/adapters " + PYTHON +
                               " -m attnfuzz.adapters.callable callable_backward:attention_fwd --dtypes f32,bf16"
                               " --backward callable_backward:attention_bwd";
  r = check(callable, "--pass bwd --sq 9 --sk 12 --d 16 --heads 2 --kv-heads 1 --mask causal-br --no-reports",
            fresh("callable-bwd"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "1 check in")) << r.out;
  EXPECT_TRUE(has(r.out, "all passed")) << r.out;
  EXPECT_FALSE(has(r.out, "launch_bwd")) << r.out;  // checked, not refused as forward-only
  r = check(callable, "--dtype bf16 --sq 9 --sk 12 --d 16 --mask causal-br --no-reports", fresh("callable-bf16"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(has(r.out, "not supported")) << r.out;  // ran in bf16, not refused
  // A kernel without a backward declaration does not claim backward cases.
  r = check(numpy_adapter("--no-backward"), "--pass bwd --sq 5 --sk 7 --d 8 --no-reports", fresh("no-bwd"));
  EXPECT_EQ(r.code, 2) << r.out;  // nothing checked
  EXPECT_TRUE(has(r.out, "launch_bwd")) << r.out;
}

// Custom masks (issue 28 item 4) travel over the protocol: the numpy reference applies them (a kernel ignoring a
// random mask of density 0.5 fails these cases), forward and backward, dense / bits / block-sparse.
TEST(Adapter, NumpyReferenceAppliesTheCustomMasks) {
  NEED_NUMPY();
  for (const char* v : {"mask-dense", "mask-bits+block-sparse"})
    for (const char* pass : {"fwd", "bwd"}) {
      const Result r = check(numpy_adapter(), std::string("--variant ") + v + " --pass " + pass +
                                                  " --sq 19 --sk 37 --d 16 --heads 2 --kv-heads 1 --mask causal-br "
                                                  "--block-q 4 --block-k 8 --no-reports",
                             fresh(std::string("masks-") + v + "-" + pass));
      EXPECT_EQ(r.code, 0) << r.out;
      EXPECT_TRUE(has(r.out, "1 check in")) << r.out;
      EXPECT_TRUE(has(r.out, "all passed")) << r.out;
    }
  const Result r = check(numpy_adapter(), "--sweep --quiet --variant mask-bits+block-sparse", fresh("masks-sweep"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "all passed")) << r.out;
}

// Sequence layouts travel over the protocol (PROTOCOL.md "Sequence layouts"): packed q and K/V with their int32
// cu_seqlens, a KV cache's seqused_k, O back packed and LSE rows per sequence. The numpy reference declares them and
// passes, and its planted mask leak is found on a varlen case with its per-sequence diagnosis.
TEST(Adapter, NumpyReferenceTakesTheSequenceLayouts) {
  NEED_NUMPY();
  for (const char* layout : {"--seq-layout varlen --seqlens-q 3,0,17 --seqlens-k 5,1,40 --mask causal-br",
                             "--seq-layout kvcache --sq 4 --sk 64 --seqused-k 33,1,64 --mask window:8,0-br",
                             "--seq-layout varlen-q --seqlens-q 2,9 --sk 11"}) {
    const Result r = check(numpy_adapter(), std::string(layout) + " --heads 4 --kv-heads 2 --d 16 --no-reports",
                           fresh("layouts"));
    EXPECT_EQ(r.code, 0) << layout << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "1 check in")) << r.out;
  }
  const Result leak = check(numpy_adapter("--bug mask-leak"),
                            "--seq-layout varlen --seqlens-q 3,0,17 --seqlens-k 5,1,40 --mask causal-br --no-reports",
                            fresh("layouts-leak"));
  EXPECT_EQ(leak.code, 1) << leak.out;
  EXPECT_TRUE(has(leak.out, "aligned per sequence")) << leak.out;
  const Result paged = check(numpy_adapter(), "--seq-layout paged --sq 1 --seqused-k 33,1 --page-size 16 --no-reports",
                             fresh("layouts-paged"));
  EXPECT_TRUE(has(paged.out, "unsupported") || has(paged.out, "no kernel")) << paged.out;  // paged is not carried
  // Issue 28: sinks, softcap and ALiBi on a layout ("layout-variants": AF_FEATURE_LAYOUT_VARIANTS). The reference
  // declares it and applies them per sequence (sequences.per_sequence); its copy that ignores the softcap is named.
  const std::string lv_case = "--seq-layout varlen --seqlens-q 3,17 --seqlens-k 5,40 --mask causal-br --heads 4 "
                              "--kv-heads 2 --d 16 --variant sink+softcap+alibi --softcap 2 --no-reports";
  const Result lv = check(numpy_adapter(), lv_case, fresh("layouts-variants"));
  EXPECT_EQ(lv.code, 0) << lv.out;
  EXPECT_TRUE(has(lv.out, "1 check in") && has(lv.out, "all passed")) << lv.out;
  const Result lv_bug = check(numpy_adapter("--bug softcap-ignored"), lv_case, fresh("layouts-variants-bug"));
  EXPECT_EQ(lv_bug.code, 1) << lv_bug.out;
  EXPECT_TRUE(has(lv_bug.out, "ignored-parameter") && has(lv_bug.out, "softcap")) << lv_bug.out;
  // Malformed metadata (docs/semantics.md): the reference refuses it by name (sequences.check_metadata), a pass;
  // before, it sliced past total_k and was named accepted-malformed.
  const Result mal = check(numpy_adapter(), "--seq-layout varlen --seqlens-q 3,5 --seqlens-k 4,9 --malformed "
                                            "cu-k-past-total --no-reports", fresh("layouts-malformed"));
  EXPECT_EQ(mal.code, 0) << mal.out;
}

// Issue 30 item 1: malformed metadata travels over the protocol as the kernel would receive it. The reference refuses
// it by name (a pass); a copy that trusts the arrays (--bug trusts-metadata) is named accepted-malformed with the
// defect's values, for packed q (its LSE rows scattered by the sent cu_seqlens_q, clipped to the reply), packed K/V
// and a KV cache's seqused_k.
TEST(Adapter, MalformedMetadataTravelsAsSent) {
  NEED_NUMPY();
  const std::string varlen = "--seq-layout varlen --seqlens-q 3,5 --seqlens-k 4,9 --mask causal-br --no-reports ",
                    cache = "--seq-layout kvcache --sq 2 --sk 16 --seqused-k 5,16 --no-reports ";
  for (const auto& [args, values] :
       {std::pair{varlen + "--malformed cu-q-decreasing@0", "cu_seqlens_q[1] = -1 < cu_seqlens_q[0] = 0"},
        std::pair{varlen + "--malformed cu-k-past-total@0", "cu_seqlens_k[2] = 14 > total_k = 13"},
        std::pair{cache + "--malformed seqused-negative@0", "seqused_k[0] = -1 < 0"},
        std::pair{cache + "--malformed seqused-over-capacity@1", "seqused_k[1] = 17 > its capacity 16"}}) {
    const Result trusted = check(numpy_adapter("--bug trusts-metadata"), args, fresh("malformed-trusted"));
    EXPECT_EQ(trusted.code, 1) << args << "\n" << trusted.out;
    EXPECT_TRUE(has(trusted.out, "accepted-malformed") && has(trusted.out, values)) << args << "\n" << trusted.out;
    const Result ref = check(numpy_adapter(), args, fresh("malformed-ref"));
    EXPECT_EQ(ref.code, 0) << args << "\n" << ref.out;
  }
}

// Score variants (issue 28) travel over the protocol: sinks, ALiBi slopes and the bias as tensors, the softcap in
// the problem, d sinks and d bias back with dQ, dK, dV. The numpy reference applies them forward and backward (GQA,
// a bias broadcast over heads), passes their sweep, and a copy that ignores the sinks is named ignored-parameter.
TEST(Adapter, NumpyReferenceAppliesTheScoreVariants) {
  NEED_NUMPY();
  for (const char* v : {"sink+softcap", "alibi+bias", "sink+softcap+alibi+bias+mask-dense"})
    for (const char* pass : {"fwd", "bwd"}) {
      const Result r = check(numpy_adapter(), std::string("--variant ") + v + " --pass " + pass +
                                                  " --sq 13 --sk 29 --d 16 --heads 4 --kv-heads 2 --mask causal-br "
                                                  "--softcap 5 --bias-broadcast h --no-reports",
                             fresh(std::string("scores-") + v + "-" + pass));
      EXPECT_EQ(r.code, 0) << v << " " << pass << "\n" << r.out;
      EXPECT_TRUE(has(r.out, "1 check in")) << r.out;
      EXPECT_TRUE(has(r.out, "all passed")) << r.out;
    }
  const Result sw = check(numpy_adapter(), "--sweep --quiet --variant sink+softcap+alibi+bias", fresh("scores-sweep"));
  EXPECT_EQ(sw.code, 0) << sw.out;
  EXPECT_TRUE(has(sw.out, "all passed")) << sw.out;
  const Result bug = check(numpy_adapter("--bug sink-ignored"),
                           "--variant sink --sq 9 --sk 17 --d 8 --heads 2 --no-reports", fresh("sink-ignored"));
  EXPECT_EQ(bug.code, 1) << bug.out;
  EXPECT_TRUE(has(bug.out, "ignored-parameter")) << bug.out;
  EXPECT_TRUE(has(bug.out, "sink")) << bug.out;
  // A d bias off by a factor (dQ, dK, dV right) fails in dBias and is not "ignored-parameter": no probe of the
  // detector re-judges d bias (it once named a bias stride here).
  const Result half = check(numpy_adapter("--bug dbias-half"),
                            "--variant bias --pass bwd --sq 9 --sk 17 --d 8 --heads 2 --no-reports", fresh("dbias-half"));
  EXPECT_EQ(half.code, 1) << half.out;
  EXPECT_TRUE(has(half.out, "in dBias")) << half.out;
  EXPECT_FALSE(has(half.out, "ignored-parameter x")) << half.out;
  EXPECT_TRUE(has(half.out, "dBias: ")) << half.out;  // the failure text counts the dBias elements
}

// MLA's shared K/V latent over the protocol (PROTOCOL.md "Shared K/V latent"): a kv-shared run sends q and k
// alone and the helper hands the kernel V as the view k[..., :Dv]. The numpy reference passes the kv-shared
// sweep, and its copy that reads V's rows with their own length from K's buffer is named by the v_stride
// probe. The callable adapter declares the variants it is told (--variants): without them a sink case is
// unsupported, with them it is checked.
TEST(Adapter, KvSharedSendsKAloneAndTheCallableDeclaresItsVariants) {
  NEED_NUMPY();
  Result r = check(numpy_adapter(), "--sweep --quiet --variant kv-shared", fresh("kv-shared-sweep"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "all passed")) << r.out;
  r = check(numpy_adapter("--bug kv-latent-rows"),
            "--variant kv-shared --sq 3 --sk 40 --d 64 --dv 48 --heads 4 --kv-heads 1 --mask causal-br "
            "--no-reports",
            fresh("kv-latent-rows"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "ignored-parameter")) << r.out;
  EXPECT_TRUE(has(r.out, "v_stride (kv-shared")) << r.out;
  const std::string callable = "PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=" + std::string(SOURCE_DIR) +
                               "/python:" + SOURCE_DIR + "/tests/adapters " + PYTHON +
                               " -m attnfuzz.adapters.callable callable_backward:attention_fwd";
  const std::string sink = "--variant sink --sq 9 --sk 12 --d 16 --heads 2 --no-reports";
  r = check(callable, sink, fresh("callable-no-variants"));
  EXPECT_EQ(r.code, 2) << r.out;  // unsupported: nothing checked
  EXPECT_TRUE(has(r.out, "variant sink not declared")) << r.out;
  r = check(callable + " --variants sink,kv-shared", sink, fresh("callable-sink"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "all passed")) << r.out;
  r = check(callable + " --variants sink,kv-shared",
            "--variant kv-shared --sq 2 --sk 30 --d 32 --dv 16 --heads 4 --kv-heads 1 --no-reports",
            fresh("callable-kv-shared"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "all passed")) << r.out;
}

// attn-check --amplify over the protocol: numpy_ref --bug softcap-ignored passes a case whose cap (1000) is
// far above its scores; with --amplify its sibling with the cap at a quarter of the largest score names the
// softcap, and the replay line carries the flag. The correct reference passes both ways.
TEST(Adapter, AmplifyNamesAnIgnoredSoftcapOnACaseThatPasses) {
  NEED_NUMPY();
  const std::string c = "--variant softcap --softcap 1000 --sq 9 --sk 17 --d 16 --heads 2 --no-reports";
  Result r = check(numpy_adapter("--bug softcap-ignored"), c, fresh("softcap-ignored-quiet"));
  EXPECT_EQ(r.code, 0) << r.out;
  r = check(numpy_adapter("--bug softcap-ignored"), c + " --amplify", fresh("softcap-ignored-amplified"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "ignored-parameter")) << r.out;
  EXPECT_TRUE(has(r.out, "amplify: the case passes with the effect of the softcap")) << r.out;
  EXPECT_TRUE(has(r.out, "--amplify")) << r.out;  // the replay line
  r = check(numpy_adapter(), c + " --amplify", fresh("softcap-amplified-correct"));
  EXPECT_EQ(r.code, 0) << r.out;
}

// Dropout (issue 29) over the protocol: the kernel draws its own mask from (p, seed, offset) and sends it back; the
// tool checks O and the gradients given that mask, its keep fraction, and that forward and backward drew the same one.
// The planted copy whose backward wraps the counter offset at 32 bits passes below 2^32 and fails above it.
TEST(Adapter, NumpyReferenceAppliesDropoutAndAWrappedBackwardOffsetIsFound) {
  NEED_NUMPY();
  const std::string shape = " --dropout 0.3 --dropout-rng exported --sq 33 --sk 65 --d 16 --heads 4 --kv-heads 2 "
                            "--mask causal-br --no-reports";
  for (const char* pass : {"fwd", "bwd", "fwdbwd"}) {
    const Result r = check(numpy_adapter(), std::string("--pass ") + pass + shape, fresh(std::string("drop-") + pass));
    EXPECT_EQ(r.code, 0) << pass << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "all passed")) << r.out;
  }
  const Result quiet = check(numpy_adapter("--bug dropout-bwd-wrap"), "--pass fwdbwd --dropout-offset 5" + shape,
                             fresh("drop-wrap-quiet"));
  EXPECT_EQ(quiet.code, 0) << quiet.out;
  const Result found = check(numpy_adapter("--bug dropout-bwd-wrap"), "--pass fwdbwd --dropout-offset 4294967301" + shape,
                             fresh("drop-wrap"));
  EXPECT_EQ(found.code, 1) << found.out;
  EXPECT_TRUE(has(found.out, "the backward launch dropped other weights than the forward")) << found.out;
}

TEST(Adapter, ListShowsTheDeclaredKernels) {
  NEED_NUMPY();
  Result r = check(numpy_adapter(), "--list", fresh("list"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "numpy-ref")) << r.out;
  EXPECT_TRUE(has(r.out, "adapter")) << r.out;
}

TEST(Adapter, EachPlantedBugFailsWithItsClassAndReplays) {
  NEED_NUMPY();
  const std::map<std::string, std::string> shape = {
      {"mask-leak", "--sq 33 --sk 33 --d 16 --mask causal-br"},
      {"missing-rescale", "--sq 4 --sk 96 --d 16 --dist normal:3"},
      {"empty-row-nan", "--sq 9 --sk 4 --d 16 --mask causal-br"},
      {"lse-error", "--sq 8 --sk 20 --d 16"},
      {"empty-row-mean", "--sq 9 --sk 4 --d 16 --mask causal-br"},
      {"split-average", "--sq 4 --sk 40 --d 16"},
  };
  for (const auto& [bug, allowed] : kPlantedClasses) {
    const std::string out = fresh("planted-" + bug);
    const std::string adapter = numpy_adapter("--bug " + bug);
    Result r = check(adapter, shape.at(bug), out);
    EXPECT_EQ(r.code, 1) << bug << "\n" << r.out;
    const auto got = classes_in(out);
    bool ok = false;
    for (const auto& c : got)
      for (const auto& a : allowed) ok |= c == a;
    EXPECT_TRUE(ok) << bug << ": classes in the report do not include " << allowed.front() << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "scope: external implementation")) << r.out;
    // The replay line carries the adapter and reproduces the verdict.
    const auto pos = r.out.find("replay: ");
    ASSERT_NE(pos, std::string::npos) << r.out;
    const std::string replay = r.out.substr(pos + 8, r.out.find('\n', pos) - pos - 8);
    EXPECT_TRUE(has(replay, "--adapter ")) << replay;
    Result again = sh(std::string(ATTN_CHECK) + replay.substr(std::string("attn-check").size()) + " --out " +
                      fresh("replay-" + bug));
    EXPECT_EQ(again.code, 1) << again.out;
    EXPECT_TRUE(has(again.out, "reproduced")) << again.out;
  }
}

// The case file a failing check saved under out/corpus (the one there).
std::string saved_case(const std::string& out) {
  for (const auto& e : fs::directory_iterator(fs::path(out) / "corpus"))
    if (e.path().extension() == ".case") return e.path().string();
  return {};
}

// The maintainer's fix, in a copy of python/attnfuzz: the file of it appended to, the text, what the script then says.
struct Fix {
  std::string file, text, says;
};
// The reference ignores its planted bug.
const Fix kReferenceFixed = {"reference.py",
                             "\n_a, _b = attention, attention_backward\n"
                             "attention = lambda q, k, v, p, bug=None: _a(q, k, v, p)\n"
                             "attention_backward = lambda q, k, v, do, p, o=None, lse=None, bug=None: _b(q, k, v, do, "
                             "p, o=o, lse=lse)\n",
                             "fixed: every element within its bound"};
// Sequence metadata is checked even when the caller says to trust it (trusts-metadata fixed: it raises).
const Fix kMetadataChecked = {"sequences.py",
                              "\n_ps = per_sequence\nper_sequence = lambda q, k, v, p, fn, trust=False: _ps(q, k, v, p, "
                              "fn)\n",
                              "refused: ValueError: malformed sequence metadata"};

// Issue 30 item 4: attn-check --bug-report writes a script of at most 40 lines + .npz that calls the library
// as the adapter did (`call` in its source: the adapter's own call, e.g. bug='mask-leak'); run with python3 it exits 1
// on the buggy numpy reference and 0 on the fixed one (`fix`), forward and backward.
void bug_report_script(const std::string& bug, const std::string& args, const std::string& tag = "",
                       const Fix& fix = kReferenceFixed, const std::string& call = "") {
  const std::string name = bug + tag;
  const fs::path fixed = fresh("bug-report-fixed-" + name);
  fs::create_directories(fixed / "attnfuzz");
  fs::copy(fs::path(SOURCE_DIR) / "python" / "attnfuzz", fixed / "attnfuzz", fs::copy_options::recursive);
  std::ofstream(fixed / "attnfuzz" / fix.file, std::ios::app) << fix.text;
  const std::string adapter = numpy_adapter("--bug " + bug), out = fresh("bug-report-" + name);
  Result r = check(adapter, args, out);
  ASSERT_EQ(r.code, 1) << r.out;
  const std::string file = saved_case(out), dir = fresh("bug-report-" + name + "-bundle");
  r = check(adapter, "--replay " + file + " --bug-report " + dir, fresh("bug-report-" + name + "-replay"));
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream readme(fs::path(dir) / "README.md"), script(fs::path(dir) / "repro.py");
  std::stringstream rm, sc;
  rm << readme.rdbuf();
  sc << script.rdbuf();
  const std::string text = rm.str(), code = sc.str();
  EXPECT_TRUE(has(text, "python3 repro.py")) << text;
  EXPECT_TRUE(has(text, "--adapter ")) << text;  // the replay command, one line
  EXPECT_TRUE(has(code, call.empty() ? "bug='" + bug + "'" : call)) << code;
  EXPECT_LE(std::count(code.begin(), code.end(), '\n'), 40) << code;
  EXPECT_TRUE(fs::exists(fs::path(dir) / "repro.npz"));
  // From another directory: the script finds its .npz beside itself.
  auto run = [&](const std::string& path) {
    return sh("cd / && PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=" + path + " " + PYTHON + " " + dir +
              "/repro.py");
  };
  Result wrong = run(std::string(SOURCE_DIR) + "/python");
  EXPECT_EQ(wrong.code, 1) << wrong.out;
  EXPECT_TRUE(has(wrong.out, "STILL WRONG")) << wrong.out;
  Result ok = run(fixed.string());
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_TRUE(has(ok.out, fix.says)) << ok.out;
}

TEST(Adapter, BugReportScriptFailsOnTheBugAndPassesOnceFixed) {
  NEED_NUMPY();
  bug_report_script("mask-leak", "--sq 9 --sk 9 --d 8 --mask causal-br");
}

// Issue 30 item 3: a varlen case's script rebuilds the packed inputs (the .npz holds the run's cu_seqlens) and calls
// the library per sequence as the adapter does; expected O comes in q's packed layout.
TEST(Adapter, BugReportScriptOfAVarlenCase) {
  NEED_NUMPY();
  bug_report_script("mask-leak", "--seq-layout varlen --seqlens-q 3,0,7 --seqlens-k 5,1,9 --mask causal-br --d 8",
                    "-varlen");
}

// An accepted-malformed case's script passes the malformed cu_seqlens_k exactly as attn-fuzz sent it and holds the
// library to raising (docs/semantics.md "Malformed metadata": these arrays have no right result): exit 1 while
// numpy_ref --bug trusts-metadata computes on them, 0 once the library refuses them.
TEST(Adapter, BugReportScriptOfAnAcceptedMalformedCase) {
  NEED_NUMPY();
  bug_report_script("trusts-metadata",
                    "--seq-layout varlen --seqlens-q 3,5 --seqlens-k 4,9 --malformed cu-k-decreasing@1 --d 8", "",
                    kMetadataChecked, "trust=True");
}

TEST(Adapter, BugReportScriptOfABackwardCase) {
  NEED_NUMPY();
  bug_report_script("bwd-mask-leak", "--pass bwd --dtype bf16 --sq 9 --sk 9 --d 8 --mask causal-tl");
}

// Bad input to --bug-report is one line and exit 2: a file that does not reproduce (its recorded class
// edited), a kernel not loaded, a directory that cannot be written, a file without a failure.
TEST(Adapter, BugReportRefusesBadInputWithOneLine) {
  NEED_NUMPY();
  const std::string adapter = numpy_adapter("--bug mask-leak"), out = fresh("bug-report-bad");
  ASSERT_EQ(check(adapter, "--sq 9 --sk 9 --d 8 --mask causal-br", out).code, 1);
  std::ifstream in(saved_case(out));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  const fs::path edited = fs::path(out) / "edited.case";
  text.replace(text.find("\"class\": \"mask\""), 15, "\"class\": \"lse\"");
  std::ofstream(edited) << text;
  Result r =
      check(adapter, "--replay " + edited.string() + " --bug-report " + fresh("bad-1"), fresh("bad-1r"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "does not reproduce") && has(r.out, "recorded fail/lse, now fail/mask")) << r.out;
  r = check(numpy_adapter(), "--replay " + saved_case(out) + " --bug-report " + fresh("bad-2"),
            fresh("bad-2r"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "numpy-mask-leak is not loaded")) << r.out;
  r = check(adapter, "--replay " + saved_case(out) + " --bug-report " + saved_case(out) + "/x",
            fresh("bad-3r"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "--bug-report")) << r.out;
  r = check(adapter,
            "--replay " + std::string(SOURCE_DIR) +
                "/corpus/seed/batch-3x2h-20x45-causal-br.case --bug-report " + fresh("bad-4"),
            fresh("bad-4r"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "records no failure")) << r.out;
}

// Issue 30 item 6b: --repeat-calls checks each case right after the same shape with another scale; a plan
// cache keyed on the shape alone (numpy_ref --bug stale-plan) is named a stale cache, and its replay line
// reproduces it. Without --repeat-calls (the first call of each shape) and on the correct reference it
// passes: no false positive.
TEST(Adapter, RepeatCallsNameAStalePlanCache) {
  NEED_NUMPY();
  const std::string stale = numpy_adapter("--bug stale-plan"), c = " --sq 9 --sk 9 --d 8 --mask causal-br";
  Result r = check(stale, "--repeat-calls" + c, fresh("repeat-stale"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "ignored-parameter")) << r.out;
  EXPECT_TRUE(has(r.out, "the output is that call's exact result")) << r.out;
  EXPECT_TRUE(has(r.out, "(stale cache)")) << r.out;
  const auto pos = r.out.find("replay: attn-check");
  ASSERT_NE(pos, std::string::npos) << r.out;
  const std::string replay = r.out.substr(pos + 18, r.out.find('\n', pos) - pos - 18);
  EXPECT_TRUE(has(replay, "--repeat-calls")) << replay;
  Result again = sh(std::string(ATTN_CHECK) + replay + " --out " + fresh("repeat-replay"));
  EXPECT_EQ(again.code, 1) << again.out;
  EXPECT_TRUE(has(again.out, "-> reproduced")) << again.out;
  EXPECT_EQ(check(stale, c.substr(1), fresh("repeat-first")).code, 0);
  EXPECT_EQ(check(numpy_adapter(), "--repeat-calls" + c, fresh("repeat-ref")).code, 0);
}

// Issue 30 item 6b: each sibling kind (scale, mask, dtype) catches the plan cache keyed without that parameter
// alone, and the evidence names the parameter; a cache keyed on everything passes (no false positive).
TEST(Adapter, RepeatCallsNameTheParameterAStalePlanCacheLacks) {
  NEED_NUMPY();
  const std::string c = " --repeat-calls --sq 9 --sk 9 --d 8 --mask causal-br";
  for (const char* param : {"scale", "mask", "dtype"}) {
    Result r = check(numpy_adapter(std::string("--bug stale-plan --stale-key-lacks ") + param), c.substr(1),
                     fresh(std::string("repeat-lacks-") + param));
    EXPECT_EQ(r.code, 1) << param << "\n" << r.out;
    EXPECT_TRUE(has(r.out, std::string("keyed without the ") + param + " (stale cache)")) << param << "\n" << r.out;
  }
  EXPECT_EQ(check(numpy_adapter("--bug stale-plan --stale-key-lacks="), c.substr(1), fresh("repeat-lacks-none")).code, 0);
}

// Issue 25 item 7: a failure in which every output element is NaN (a scale <= 0 that a flash call turns into NaN)
// is never `empty-row`, though the case has empty rows; the empty-row rows read as the same root cause.
TEST(Adapter, EveryOutputNaNIsNeverEmptyRow) {
  NEED_NUMPY();
  const std::string out = fresh("scale-nan");
  Result r = check(numpy_adapter("--bug scale-nan"), "--sq 9 --sk 4 --d 16 --mask causal-br --scale -0.5", out);
  EXPECT_EQ(r.code, 1) << r.out;
  const auto got = classes_in(out);
  EXPECT_EQ(std::find(got.begin(), got.end(), std::string("empty-row")), got.end()) << r.out;
  EXPECT_TRUE(has(r.out, "every O element is NaN, in the rows with keys too")) << r.out;
}

// Issue 25 item 7: reruns of an adapter whose NaN outputs change sign run to run (a multithreaded BLAS's operand
// order) are no barrier race: the planted mask leak keeps its class.
TEST(Adapter, NaNSignNoiseIsNotARace) {
  NEED_NUMPY();
  const std::string out = fresh("nan-noise");
  Result r = check(numpy_adapter("--bug mask-leak --nan-noise"),
                   "--sq 33 --sk 33 --d 16 --mask causal-br --special nan@v:visible*3", out);
  EXPECT_EQ(r.code, 1) << r.out;
  const auto got = classes_in(out);
  EXPECT_EQ(std::find(got.begin(), got.end(), std::string("barrier-race")), got.end()) << r.out;
  EXPECT_NE(std::find(got.begin(), got.end(), std::string("mask")), got.end()) << r.out;
}

// The tunables of the adapter protocol (PROTOCOL.md): declared values are checked at the handshake.
TEST(Adapter, TunablesAreDeclaredAndSentByName) {
  NEED_NUMPY();
  const std::string k = " --kernel numpy-split-average --sq 4 --sk 40 --d 16";
  Result r = check(numpy_adapter("--bug split-average"), k + " --tunable num_splits=3", fresh("split-3"));
  EXPECT_EQ(r.code, 2) << r.out;  // not a declared value: the declaration reached the tool
  EXPECT_TRUE(has(r.out, "accepts 4, 1, 2, 8")) << r.out;
  // At 1 (no split) the planted combine bug is quiet, at the default 4 it fails: the value reaches the adapter.
  r = check(numpy_adapter("--bug split-average"), k + " --tunable num_splits=1", fresh("split-1"));
  EXPECT_EQ(r.code, 0) << r.out;
  r = check(numpy_adapter("--bug split-average"), k, fresh("split-4"));
  EXPECT_EQ(r.code, 1) << r.out;
}

TEST(Adapter, MisbehavingAdaptersGiveCrashHangOrProtocolErrorPerCase) {
  NEED_NUMPY();
  const std::pair<const char*, const char*> cases[] = {
      {"crash-on-run", "crash"},       {"segv-on-run", "crash"},         {"exit-on-run", "crash"},
      {"hang-on-run", "hang"},         {"bad-json", "launch-error"},     {"bad-shape", "launch-error"},
      {"bad-dtype", "launch-error"},   {"truncated", "launch-error"},    {"wrong-id", "launch-error"},
      {"huge-header", "launch-error"}, {"stdout-print", "launch-error"}, {"raise", "launch-error"},
  };
  for (auto [mode, cls] : cases) {
    const std::string out = fresh(std::string("bad-") + mode);
    // Two cases: each fails on its own (the adapter is restarted after the first); the tool ends normally.
    Result r = check(misbehaving(mode), "--sq 5 --sk 7 --d 8 --repeat 2 --timeout 2 --no-reports", out);
    EXPECT_EQ(r.code, 1) << mode << "\n" << r.out;
    EXPECT_TRUE(has(r.out, cls)) << mode << " should give " << cls << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "2 checks")) << mode << "\n" << r.out;
  }
  Result r = check(misbehaving("bad-json"), "--sq 5 --d 8 --no-reports", fresh("bad-json-msg"));
  EXPECT_TRUE(has(r.out, "adapter protocol error")) << r.out;
  r = check(misbehaving("segv-on-run"), "--sq 5 --d 8 --no-reports", fresh("segv-msg"));
  EXPECT_TRUE(has(r.out, "SIGSEGV")) << r.out;
}

TEST(Adapter, ACrashedAdapterIsRestartedAndLaterCasesPass) {
  NEED_NUMPY();
  // flaky crashes on every third run: 6 cases = 2 crashes, 4 passes.
  Result r = check(misbehaving("flaky"), "--sq 5 --sk 9 --d 8 --repeat 6 --no-reports", fresh("flaky"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "crash x2")) << r.out;
  EXPECT_TRUE(has(r.out, "     4      2")) << r.out;  // pass 4, FAIL 2 in the summary row
}

// A re-opened adapter (attn-check --bug-report --minimize closes and re-opens it; a restart after a crash) keeps the
// kernel names the registry points at: a name longer than std::string's inline buffer ("numpy-sink-ignored") was
// freed under the registry, "no kernel matches" with garbage names (torch_sdpa's kernels on the H200).
TEST(Adapter, AReopenedAdapterKeepsItsLongKernelNames) {
  NEED_NUMPY();
  const std::string out = fresh("reopen"), a = numpy_adapter("--bug sink-ignored");
  Result r = check(a, "--variant sink --sq 5 --sk 9 --d 8", out);
  ASSERT_EQ(r.code, 1) << r.out;
  r = sh(std::string(ATTN_CHECK) + " --replay " + saved_case(out) + " --adapter " + q(a) +
         " --minimize --minimize-time 5 --bug-report " + out + "/bundle --out " + out + "/work");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "bug report: ")) << r.out;
  EXPECT_FALSE(has(r.out, "no kernel matches")) << r.out;
}

TEST(Adapter, BadStartUpIsExitTwoWithAReason) {
  NEED_NUMPY();
  Result r = check(misbehaving("bad-hello"), "--sq 5 --d 8", fresh("bad-hello"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "protocol 99")) << r.out;
  r = check("exit 3", "--sq 5 --d 8", fresh("no-start"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "exited with status 3")) << r.out;
  r = sh(std::string(ATTN_CHECK) + " --adapter " + q(numpy_adapter()) + " --backend cpu --out " +
         fresh("mix"));
  EXPECT_EQ(r.code, 2) << r.out;
}

// Issue 27 item 12: kernel declarations the tool cannot use are refused at the handshake, each with one line.
TEST(Adapter, MalformedKernelDeclarationsAreRefused) {
  NEED_NUMPY();
  for (const auto& [mode, says] : std::vector<std::pair<std::string, std::string>>{
           {"dup-names", "kernel name 'bad-dup-names' is declared twice"},
           {"neg-max-d", "max_head_dim -5"},
           {"zero-multiple", "head_dim_multiple 0"},
           {"named-all", "'all'"},
           {"paged-feature", "features takes q-packed, kv-packed, seqused-k, layout-variants, not \"kv-paged\""}}) {
    Result r = check(misbehaving(mode), "--sq 5 --d 8 --no-reports", fresh("decl-" + mode));
    EXPECT_EQ(r.code, 2) << mode << "\n" << r.out;
    EXPECT_TRUE(has(r.out, says)) << mode << "\n" << r.out;
  }
}

// Issue 27 item 17: an adapter whose Python lacks numpy says so in one line (which interpreter, what it lacks)
// instead of a traceback.
TEST(Adapter, AnInterpreterWithoutNumpyIsNamedInOneLine) {
  NEED_NUMPY();
  const fs::path script = fs::path(TEST_TMP) / "no_numpy.py";
  fs::create_directories(script.parent_path());
  std::ofstream(script) << "import sys, runpy\nsys.modules['numpy'] = None  # import numpy fails\n"
                           "runpy.run_module('attnfuzz.adapters.numpy_ref', run_name='__main__')\n";
  Result r = check(py() + " " + script.string(), "--sq 5 --d 8 --no-reports", fresh("no-numpy"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "cannot import numpy")) << r.out;
  EXPECT_TRUE(has(r.out, PYTHON)) << r.out;
  EXPECT_FALSE(has(r.out, "Traceback")) << r.out;
}

TEST(Adapter, AttnFuzzCampaignFindsThePlantedMaskLeakWithAReplayableCase) {
  NEED_NUMPY();
  if (std::string(ATTN_FUZZ).empty()) GTEST_SKIP() << "attn-fuzz is not built (-DATTNFUZZ_FUZZ=ON)";
  const std::string out = fresh("fuzz");
  Result r = sh(std::string(ATTN_FUZZ) + " --adapter " + q(numpy_adapter("--bug mask-leak")) +
                " --max-time 40 --stop-when-each-fails --workers 1 --max-seq 48 --max-d 32 --progress 100 --out " +
                out);
  EXPECT_EQ(r.code, 1) << r.out;
  bool found = false;
  std::string replay;
  for (const auto& e : fs::directory_iterator(fs::path(out) / "failures"))
    if (e.path().extension() == ".case" && e.path().filename().string().rfind("mask-", 0) == 0) {
      found = true;
      replay = e.path().string();
    }
  ASSERT_TRUE(found) << r.out;
  Result again = check(numpy_adapter("--bug mask-leak"), "--replay " + replay, fresh("fuzz-replay"));
  EXPECT_EQ(again.code, 1) << again.out;
  EXPECT_TRUE(has(again.out, "reproduced")) << again.out;
}

// Issue 30 item 6b in campaigns: attn-fuzz --repeat-calls checks each case after its siblings in the worker's
// adapter process, so a plan cache keyed on the shape alone is named a stale cache (decided by
// repeat-calls/stale-cache), and the replay line carries --repeat-calls and reproduces it.
TEST(Adapter, RepeatCallsCampaignNamesAStalePlanCache) {
  NEED_NUMPY();
  if (std::string(ATTN_FUZZ).empty()) GTEST_SKIP() << "attn-fuzz is not built (-DATTNFUZZ_FUZZ=ON)";
  const std::string out = fresh("fuzz-repeat"), adapter = numpy_adapter("--bug stale-plan");
  // --stop-when-each-fails: the campaign ends at the first stale-plan finding (about 1 s); 3 s flat once found none
  // under a loaded ctest -j 2.
  Result r = sh(std::string(ATTN_FUZZ) + " --adapter " + q(adapter) +
                " --repeat-calls --max-time 10 --stop-when-each-fails --workers 1 --max-seq 24 --max-d 16 "
                "--minimize-budget 0 --progress 100 --out " + out);
  EXPECT_EQ(r.code, 1) << r.out;
  std::string file;
  for (const auto& e : fs::directory_iterator(fs::path(out) / "failures"))
    if (e.path().extension() == ".case" && e.path().filename().string().rfind("ignored-parameter-", 0) == 0)
      file = e.path().string();
  ASSERT_FALSE(file.empty()) << r.out;
  std::ifstream in(file);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_TRUE(has(ss.str(), "\"signature\": \"ignored-parameter:repeat-calls/stale-cache\"")) << ss.str();
  EXPECT_TRUE(has(r.out, "stale-plan' --repeat-calls")) << r.out;  // the summary's replay line
  Result again = check(adapter, "--replay " + file + " --repeat-calls", fresh("fuzz-repeat-replay"));
  EXPECT_EQ(again.code, 1) << again.out;
  EXPECT_TRUE(has(again.out, "reproduced")) << again.out;
}

// Issue 30 item 5: a kernel that compiles per shape (numpy_ref --compile-delay 0.2 declares recompiles_per_shape)
// gets most inputs on shapes it has compiled, and new shapes at the --new-shape-share rate (0.25 of its check time,
// give or take one compilation per worker process).
TEST(Adapter, CompileAwareCampaignSpendsMostChecksOnCompiledShapes) {
  NEED_NUMPY();
  if (std::string(ATTN_FUZZ).empty()) GTEST_SKIP() << "attn-fuzz is not built (-DATTNFUZZ_FUZZ=ON)";
  const std::string out = fresh("fuzz-compile-aware");
  Result r = sh(std::string(ATTN_FUZZ) + " --adapter " + q(numpy_adapter("--compile-delay 0.2")) +
                " --max-time 6 --workers 1 --max-seq 48 --max-d 32 --minimize-budget 0 --progress 100 --out " + out);
  EXPECT_EQ(r.code, 0) << r.out;  // a correct kernel
  EXPECT_TRUE(has(r.out, "compile-aware numpy-ref (declared by its adapter")) << r.out;
  std::ifstream f(fs::path(out) / "report.json");
  ASSERT_TRUE(f) << r.out;
  const nlohmann::json c = nlohmann::json::parse(f)["campaign"];
  ASSERT_TRUE(c["compile_aware"].contains("numpy-ref")) << c.dump();
  const nlohmann::json& t = c["compile_aware"]["numpy-ref"];
  EXPECT_EQ(t["mode"], "pooled") << t.dump();
  const int64_t shapes = t["new_shapes"], checks = c["cases"];
  EXPECT_GE(shapes, 2) << t.dump();            // the pool grows
  EXPECT_GE(checks, 10 * shapes) << t.dump();  // without it every check was a new shape: ~5 checks/s
  const double slack = 0.4 * t["worker_processes"].get<double>();
  EXPECT_LE(t["new_shape_s"].get<double>(), 0.25 * t["check_s"].get<double>() + slack) << t.dump();
}

// On an H200 the FlexAttention variant campaign carried a variant in 3 of its 189 corpus cases: inputs snapped onto
// a compiled shape took that shape's variant set (none, from the seeds). A kernel whose compiled code takes the score
// variants as data declares them (numpy_ref --variants-as-data: "data_variants"), and snapped inputs keep their own:
// without the declaration 0 of 117-143 corpus cases carried one in 6 s, with it 44-70 of 134-152.
TEST(Adapter, CompileAwarePoolKeepsTheInputsDataVariants) {
  NEED_NUMPY();
  if (std::string(ATTN_FUZZ).empty()) GTEST_SKIP() << "attn-fuzz is not built (-DATTNFUZZ_FUZZ=ON)";
  const std::string out = fresh("fuzz-data-variants");
  Result r = sh(std::string(ATTN_FUZZ) + " --adapter " + q(numpy_adapter("--compile-delay 0.2 --variants-as-data")) +
                " --variant sink,softcap,alibi,bias --max-time 6 --workers 1 --max-seq 48 --max-d 32"
                " --minimize-budget 0 --progress 100 --out " + out);
  EXPECT_EQ(r.code, 0) << r.out;  // a correct kernel
  EXPECT_TRUE(has(r.out, "compile-aware numpy-ref (declared by its adapter")) << r.out;
  int cases = 0, with_variants = 0;
  for (const auto& e : fs::directory_iterator(fs::path(out) / "fuzz-corpus")) {
    if (e.path().extension() != ".case") continue;
    ++cases;
    std::ifstream f(e.path());
    std::stringstream text;
    text << f.rdbuf();
    with_variants += has(text.str(), "variants=");
  }
  ASSERT_GE(cases, 20) << r.out;
  EXPECT_GE(with_variants * 100, 15 * cases) << with_variants << " of " << cases << " corpus cases carry a variant";
}

// A JIT kernel's first call at a new problem compiles: on a loaded H100, torch.compile'd FlexAttention outlasted the
// campaign's 10 s --timeout on its first case and a correct kernel was called `hang` and quarantined. Such a call gets
// --compile-timeout (numpy_ref --compile-delay 2 declares recompiles_per_shape and sleeps 2 s per new shape): it
// passes under --timeout 1 in attn-check and in a campaign's workers, and is a hang that names the option when
// --compile-timeout is shorter than the compilation.
TEST(Adapter, AJitKernelsFirstCallAtANewProblemGetsTheCompileTimeout) {
  NEED_NUMPY();
  const std::string jit = numpy_adapter("--compile-delay 2"), one = "--sq 9 --sk 9 --d 16 --timeout 1 --no-reports";
  const Result ok = check(jit, one + " --compile-timeout 30", fresh("compile-timeout-ok"));
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_TRUE(has(ok.out, "all passed")) << ok.out;
  const Result hang = check(jit, one + " --compile-timeout 1", fresh("compile-timeout-hang"));
  EXPECT_EQ(hang.code, 1) << hang.out;
  EXPECT_TRUE(has(hang.out, "hang")) << hang.out;
  const Result plain = check(numpy_adapter(), "--sq 9 --sk 9 --d 16 --compile-timeout 0 --no-reports",
                             fresh("compile-timeout-zero"));
  EXPECT_EQ(plain.code, 2) << plain.out;  // a timeout must be > 0
  if (std::string(ATTN_FUZZ).empty()) GTEST_SKIP() << "attn-fuzz is not built (-DATTNFUZZ_FUZZ=ON)";
  const std::string out = fresh("fuzz-compile-timeout");
  Result r = sh(std::string(ATTN_FUZZ) + " --adapter " + q(jit) + " --timeout 1 --compile-timeout 30 --max-time 6 " +
                "--workers 1 --max-seq 32 --max-d 16 --minimize-budget 0 --progress 100 --out " + out);
  EXPECT_EQ(r.code, 0) << r.out;  // a correct kernel: no hang, nothing quarantined
  EXPECT_FALSE(has(r.out, "quarantined")) << r.out;
}

// Issue 30 item 1: the campaign's minimizer on a kernel that compiles per shape (numpy_ref --compile-delay 1: a second
// per new shape, as torch.compile's FlexAttention takes several). Three failures of numpy-mask-leak in OUT/failures
// (saved by attn-check, as an earlier run of this OUT left them): one adapter process serves all three (the adapter
// command counts the starts of attn-fuzz itself, one to list the kernels, apart from the minimizing process's and the
// workers'),
// the phase ends within its budget but for a little, and the steps at the compiled shape ran first (the special
// values, the distribution and the scale are gone) before the shape shrinks ran the budget out.
TEST(Adapter, MinimizingACompilingKernelKeepsTheBudgetWithOneAdapterProcess) {
  NEED_NUMPY();
  if (std::string(ATTN_FUZZ).empty()) GTEST_SKIP() << "attn-fuzz is not built (-DATTNFUZZ_FUZZ=ON)";
  const std::string out = fresh("minimize-compiling"), bug = numpy_adapter("--bug mask-leak");
  fs::create_directories(fs::path(out) / "failures");
  const std::string specials = "--sq 33 --sk 33 --d 16 --mask causal-br --dist normal:4 --scale 0.5 --special "
                               "'inf@q:random*3'";
  const std::vector<std::string> found = {specials, "--sq 20 --sk 24 --d 8 --mask causal-tl --dist normal:2",
                                          "--sq 17 --sk 40 --d 32 --mask causal-br --heads 2 --kv-heads 1 --batch 2"};
  std::string with_specials;
  for (size_t i = 0; i < found.size(); ++i) {
    const std::string o = fresh("minimize-compiling-" + std::to_string(i));
    ASSERT_EQ(check(bug, found[i], o).code, 1);
    const fs::path f = saved_case(o), to = fs::path(out) / "failures" / f.filename();
    fs::copy_file(f, to);
    if (i == 0) with_specials = to.filename().string();
  }
  const std::string starts = out + "/starts.txt";
  const std::string adapter =
      "if [ -n \"$ATTNFUZZ_MINIMIZE\" ]; then echo minimizer; elif [ -n \"$ATTNFUZZ_WORKER_CONFIG\" ]; then echo worker; "
      "else echo attn-fuzz; fi >> " + starts + "; " + numpy_adapter("--bug mask-leak --compile-delay 1");
  const double budget = 4;  // --minimize-budget
  const auto t0 = std::chrono::steady_clock::now();
  Result r = sh(std::string(ATTN_FUZZ) + " --adapter " + q(adapter) +
                " --max-time 1 --workers 1 --max-seq 48 --max-d 32 --progress 100 --minimize-budget 4 --out " + out);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.code, 1) << r.out;
  std::vector<std::string> lines;
  std::ifstream in(starts);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  EXPECT_EQ(std::count(lines.begin(), lines.end(), "attn-fuzz"), 1) << r.out;  // the kernel list
  EXPECT_EQ(std::count(lines.begin(), lines.end(), "minimizer"), 1) << r.out;  // its process (campaign_minimize.cpp)
  EXPECT_TRUE(has(r.out, ", 1 adapter process(es) started")) << r.out;
  const auto at = r.out.find("failure(s) minimized in ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const double phase = std::stod(r.out.substr(at + 24));
  EXPECT_LE(phase, budget + 1.5) << r.out;  // + the one check nothing foresees: the first compilation
  EXPECT_LE(wall, 1 + budget + 12) << r.out;  // the campaign's second, start-up and wind-down, the phase
  EXPECT_TRUE(has(r.out, "its budget ran out: ")) << r.out;
  const attnfuzz::CorpusFile m = attnfuzz::read_corpus_file(fs::path(out) / "minimized" / with_specials);
  const attnfuzz::Case& c = m.the_case;
  EXPECT_TRUE(c.values.specials.empty()) << attnfuzz::describe(c);
  EXPECT_TRUE(c.explicit_values || c.values.dist.kind == attnfuzz::Distribution::kUniform) << attnfuzz::describe(c);
  EXPECT_EQ(c.problem.scale, attnfuzz::default_scale(c.problem.head_dim)) << attnfuzz::describe(c);
}

// A campaign whose kernels refuse every case it draws checks nothing, but its workers must stay alive (libFuzzer
// ends a fork job that sets no coverage counter, which the campaign counted as a dead worker, 50 in 30 s).
TEST(Adapter, CampaignOverAKernelThatRefusesEverythingKeepsItsWorkers) {
  NEED_NUMPY();
  if (std::string(ATTN_FUZZ).empty()) GTEST_SKIP() << "attn-fuzz is not built (-DATTNFUZZ_FUZZ=ON)";
  const std::string out = fresh("fuzz-refused");
  const std::string adapter = py() + " " + SOURCE_DIR + "/tests/adapters/refusing_adapter.py";
  Result r = sh(std::string(ATTN_FUZZ) + " --adapter " + q(adapter) +
                " --max-time 8 --workers 1 --max-seq 32 --max-d 32 --progress 100 --out " + out);
  // Nothing was checked: an input error (exit 2) that says why, not a pass and not dead workers.
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "refused all")) << r.out;
  EXPECT_TRUE(has(r.out, "most often refuse-all: ")) << r.out;  // and the adapter's own reason for it
  EXPECT_TRUE(has(r.out, "this kernel refuses every problem")) << r.out;
  std::ifstream f(fs::path(out) / "report.json");
  ASSERT_TRUE(f) << r.out;
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["campaign"]["worker_crashes"], 0) << r.out;
  EXPECT_EQ(j["campaign"]["cases"], 0) << r.out;
  EXPECT_GT(j["campaign"]["skipped_inputs"].get<int64_t>(), 10) << r.out;
}

TEST(Adapter, PropertiesRunOnAdapterKernels) {
  NEED_NUMPY();
  if (std::string(ATTN_PROPS).empty()) GTEST_SKIP() << "attn-props is not built (RapidCheck missing)";
  Result ok =
      sh(std::string(ATTN_PROPS) + " --adapter " + q(numpy_adapter()) + " -n 15 --out " + fresh("props"));
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_TRUE(has(ok.out, "key-permutation    numpy-ref")) << ok.out;
  Result bad = sh(std::string(ATTN_PROPS) + " --adapter " + q(numpy_adapter("--bug mask-leak")) +
                  " --property oracle -n 30 --out " + fresh("props-bad"));
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_TRUE(has(bad.out, "--adapter ")) << bad.out;  // the replay commands carry the adapter
}

TEST(Adapter, PytestEntryPointPassesACorrectKernelAndFailsAPlantedOne) {
  NEED_NUMPY();
  if (sh(py() + " -c 'import pytest'").code != 0) GTEST_SKIP() << "python3-pytest is not installed";
  const std::string pytest = "cd " + std::string(SOURCE_DIR) + " && ATTNFUZZ_BIN=" + bin_dir() + " " + py() +
                             " -m pytest -q -p no:cacheprovider ";
  // The example asks for a 20 s campaign; 4 s here keep the test short (the campaign still runs).
  const std::string fuzz = std::string(ATTN_FUZZ).empty() ? " --attnfuzz-fuzz-seconds 0" : " --attnfuzz-fuzz-seconds 4";
  Result ok = sh(pytest + "examples/pytest --basetemp " + fresh("pytest") + fuzz);
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_TRUE(has(ok.out, "2 passed")) << ok.out;  // f32 sweep + fuzz, and the f16 sweep
  Result bad =
      sh(pytest + "tests/adapters/pytest_planted/planted_leaky.py --basetemp " + fresh("pytest-planted"));
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_TRUE(has(bad.out, "1 failed")) << bad.out;
  EXPECT_TRUE(has(bad.out, "[mask] leaky-attention")) << bad.out;
  EXPECT_TRUE(has(bad.out, "replay: attn-check --replay")) << bad.out;
  EXPECT_TRUE(has(bad.out, "--adapter")) << bad.out;
}

// ---- issue 27 items 1, 2 and 14: no process outlives attn-fuzz, no adapter log left behind ---------------------

// Processes whose environment holds `mark` (set in attn-fuzz's environment: every descendant inherits it),
// zombies aside, with their command names.
std::vector<std::pair<pid_t, std::string>> marked(const std::string& mark) {
  std::vector<std::pair<pid_t, std::string>> v;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos || std::stoi(name) == getpid()) continue;
    std::ifstream env(e.path() / "environ", std::ios::binary), stat(e.path() / "stat");
    std::string envs((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>()), st;
    std::getline(stat, st);
    const size_t open = st.find('('), close = st.rfind(')');
    if (envs.find(mark + '\0') == std::string::npos || close == std::string::npos || close + 2 >= st.size() ||
        st[close + 2] == 'Z')
      continue;
    v.push_back({std::stoi(name), st.substr(open + 1, close - open - 1)});
  }
  return v;
}

std::string names(const std::vector<std::pair<pid_t, std::string>>& v) {
  std::string s;
  for (const auto& [pid, comm] : v) s += " " + std::to_string(pid) + " (" + comm + ")";
  return s;
}

// Adapter stderr logs (attnfuzz-adapter-*) in `dir`.
int adapter_logs(const fs::path& dir) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    n += e.path().filename().string().rfind("attnfuzz-adapter-", 0) == 0;
  return n;
}

// A campaign over an adapter that starts children (one in its process group, one in a session of its own with
// a child of its own) and, for the signals, hangs in its first launch; ended by SIGINT, SIGTERM, SIGKILL of
// attn-fuzz, or (0) by --max-time. Afterwards no process of it is left (before: the hung adapter lived on with
// PPID 1 after SIGINT and SIGKILL, and the children after every ending) and no adapter log is left in TMPDIR.
class AdapterCampaignEnd : public ::testing::TestWithParam<int> {};

TEST_P(AdapterCampaignEnd, NoProcessOfItOutlivesAttnFuzz) {
  NEED_NUMPY();
  if (std::string(ATTN_FUZZ).empty()) GTEST_SKIP() << "attn-fuzz is not built (-DATTNFUZZ_FUZZ=ON)";
  const int sig = GetParam();
  const std::string out = fresh(std::string("end-") + (sig ? sigabbrev_np(sig) : "normal"));
  const fs::path tmp = fs::path(out + "-tmp");
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  const std::string mark = "ATTNFUZZ_TEST_MARK=" + out;
  const std::string cmd = "exec " + std::string(ATTN_FUZZ) + " --adapter " +
                          q(misbehaving(sig ? "spawn-hang" : "spawn")) + " --out " + out +
                          " --workers 1 --timeout 60 --no-seeds --progress 100 --max-time " + (sig ? "0" : "10") +
                          " > " + out + ".log 2>&1";
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("ATTNFUZZ_TEST_MARK", out.c_str(), 1);
    setenv("TMPDIR", tmp.c_str(), 1);  // where adapter logs would be left
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_GT(pid, 0);
  int st = 0;
  if (sig) {  // until the adapter's children run, and a little longer (its first launch is in flight)
    // One reading decides (a second /proc scan can miss a process that is between fork and exec).
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool started = false;
    while (!started && std::chrono::steady_clock::now() < end) {
      started = names(marked(mark)).find("(sleep)") != std::string::npos;
      if (!started) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(started) << "the adapter's children did not start";
    std::this_thread::sleep_for(std::chrono::seconds(2));
    kill(pid, sig);
  }
  waitpid(pid, &st, 0);
  std::ifstream logf(out + ".log");
  const std::string log((std::istreambuf_iterator<char>(logf)), std::istreambuf_iterator<char>());
  if (sig == SIGKILL) EXPECT_TRUE(WIFSIGNALED(st)) << log;
  else if (sig) EXPECT_TRUE(WIFEXITED(st)) << st << "\n" << log;  // (2 when the hung launch was all it ran)
  else EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << "\n" << log;
  // The ending is asynchronous after kill -9 (workers see their lifeline close, then the adapters' guardians
  // theirs): give it time on a loaded machine.
  auto left = marked(mark);
  for (int i = 0; i < 150 && !left.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    left = marked(mark);
  }
  EXPECT_TRUE(left.empty()) << left.size() << " process(es) outlived attn-fuzz:" << names(left) << "\n" << log;
  for (const auto& [p, comm] : left) kill(p, SIGKILL);
  EXPECT_EQ(adapter_logs(tmp), 0) << "adapter stderr logs left in " << tmp;
}

INSTANTIATE_TEST_SUITE_P(Signals, AdapterCampaignEnd, ::testing::Values(0, SIGINT, SIGTERM, SIGKILL),
                         [](const auto& info) { return std::string(info.param ? sigabbrev_np(info.param) : "MaxTime"); });

// attn-check killed by SIGKILL in a launch of a hanging, spawning adapter: its processes go too.
TEST(AdapterProcesses, AttnCheckKilledLeavesNoAdapterProcess) {
  NEED_NUMPY();
  const std::string out = fresh("check-kill");
  const std::string mark = "ATTNFUZZ_TEST_MARK=" + out;
  const std::string cmd = "exec " + std::string(ATTN_CHECK) + " --adapter " + q(misbehaving("spawn-hang")) +
                          " --timeout 60 --no-reports --out " + out + " > " + out + ".log 2>&1";
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("ATTNFUZZ_TEST_MARK", out.c_str(), 1);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_GT(pid, 0);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < end && names(marked(mark)).find("(sleep)") == std::string::npos)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::seconds(1));
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  auto left = marked(mark);
  for (int i = 0; i < 100 && !left.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    left = marked(mark);
  }
  EXPECT_TRUE(left.empty()) << left.size() << " process(es) outlived attn-check:" << names(left);
  for (const auto& [p, comm] : left) kill(p, SIGKILL);
}

}  // namespace
