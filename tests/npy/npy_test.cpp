// npy_test.cpp - attn-check --npy / --npy-emit: round trip against a registered cpu kernel, classes, layouts,
// fp16 / bf16 storage, malformed files (exit 2 with one clear line).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "attnfuzz/corpus.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "check/runner.h"
#include "npy/external.h"
#include "npy/npy_io.h"
#include "oracle/lowp.h"
#include "oracle/reference_fp32.h"

namespace fs = std::filesystem;
using namespace attnfuzz;
using namespace attnfuzz::npy;

namespace {

struct Result {
  int code;
  std::string out;
};

Result run(const std::string& args) {
  static int n = 0;
  const fs::path dir = fs::path(TEST_TMP);
  fs::create_directories(dir);
  const fs::path log = dir / ("log-" + std::to_string(getpid()) + "-" + std::to_string(n++) + ".txt");
  const std::string cmd = std::string(ATTN_CHECK) + " --backend cpu --out " + (dir / "reports").string() +
                          " " + args + " > " + log.string() + " 2>&1";
  const int st = std::system(cmd.c_str());
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, ss.str()};
}
bool has(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }
std::string fresh(const std::string& name) {
  const fs::path d = fs::path(TEST_TMP) / name;
  fs::remove_all(d);
  return d.string();
}

// Runs a registered cpu kernel on the inputs of one emitted variant directory and writes o.npy / lse.npy.
struct KernelRun {
  Problem p;
  LaunchOutcome out;
};
KernelRun compute_with_kernel(const fs::path& vd, const std::string& kernel) {
  Spec spec;
  read_sidecar(vd / "case.json", spec);
  Array q = read_array(vd / "q.npy"), k = read_array(vd / "k.npy"), v = read_array(vd / "v.npy");
  Problem p =
      make_problem(q.shape[0], q.shape[2], k.shape[2], q.shape[1], k.shape[1], q.shape[3], v.shape[3]);
  EXPECT_EQ(parse_mask(spec.mask, p), "");
  p.scale = *spec.scale;
  static auto dev = open_device("cpu", DeviceOptions{});
  const auto ks = Registry::global().select(Backend::kCpu, kernel);
  Tensors t;
  t.q = q.data, t.k = k.data, t.v = v.data;
  KernelRun r{p, launch_guarded(*dev, *ks.at(0), p, t, RunOptions{})};
  write_array(vd / "o.npy", {p.batch, p.seq_q, p.heads_q, p.head_dim_v}, r.out.o.data());
  if (!r.out.lse.empty()) write_array(vd / "lse.npy", {p.batch, p.heads_q, p.seq_q}, r.out.lse.data());
  return r;
}

const char* kCaseFlags = "--sq 13 --sk 21 --d 24 --heads 2 --kv-heads 1 --batch 2 --mask causal-br --seed 3";

TEST(Npy, RoundTripVerdictEqualsTheDirectVerdict) {
  const std::string dir = fresh("roundtrip");
  Result e = run("--npy-emit " + dir + " " + kCaseFlags);
  ASSERT_EQ(e.code, 0) << e.out;
  ASSERT_TRUE(fs::exists(fs::path(dir) / "manifest.json"));
  std::ifstream mf(fs::path(dir) / "manifest.json");
  const Json m = Json::parse(mf);
  const Case c = case_from_json(m["case"]);
  for (const auto& v : m["variants"])
    compute_with_kernel(fs::path(dir) / v["name"].get<std::string>(), "flash-bm16-bn32");

  // The direct verdict of the registered kernel on the same case.
  auto dev = open_device("cpu", DeviceOptions{});
  PreparedCase pc(c);
  const Judged direct =
      check_case(*dev, *Registry::global().select(Backend::kCpu, "flash-bm16-bn32").at(0), pc, RunOptions{});
  const External ext =
      load_external(files_in(fs::path(dir) / "base"), resolve_spec(fs::path(dir) / "base/case.json", {}));
  EXPECT_EQ(ext.q, pc.tensors().q);  // the emitted inputs are the case's values
  const Judged viaNpy = judge_external(ext, OracleOptions{});
  EXPECT_EQ(viaNpy.result.verdict, direct.result.verdict);
  EXPECT_EQ(viaNpy.result.failure, direct.result.failure);
  EXPECT_EQ(viaNpy.result.compared, direct.result.compared);
  EXPECT_EQ(viaNpy.result.max_ratio, direct.result.max_ratio);
  EXPECT_EQ(viaNpy.ratio_map.size(), direct.ratio_map.size());

  Result r = run("--npy " + dir);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "all passed")) << r.out;
  Result one = run("--npy " + dir + "/base");
  EXPECT_EQ(one.code, 0) << one.out;
  EXPECT_TRUE(has(one.out, "pass")) << one.out;
}

TEST(Npy, WrongOutputsAreCaughtAndClassified) {
  const std::string dir = fresh("wrong");
  ASSERT_EQ(run("--npy-emit " + dir + " " + kCaseFlags).code, 0);
  for (const char* v : {"base", "keys-max-first", "keys-max-last", "keys-reversed", "masked-nan-k",
                        "masked-inf-k", "masked-nan-v", "masked-inf-v", "rows-changed"})
    compute_with_kernel(fs::path(dir) / v, "online-row");
  // Precision: one element of base off by 1e-3.
  {
    Array o = read_array(fs::path(dir) / "base/o.npy");
    o.data[5] += 1e-3f;
    write_array(fs::path(dir) / "base/o.npy", o.shape, o.data.data());
    Result r = run("--npy " + dir + "/base");
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(has(r.out, "precision")) << r.out;
    EXPECT_TRUE(has(r.out, "cannot")) << r.out;  // says what one output cannot decide
    EXPECT_TRUE(has(r.out, "replay: attn-check --npy")) << r.out;
    compute_with_kernel(fs::path(dir) / "base", "online-row");
  }
  // Mask leak: a row that never sees the perturbed keys comes out NaN in one variant. K alone and V alone
  // are separate variants and their evidence names the path (scores vs P.V).
  for (const char* variant : {"masked-inf-k", "masked-nan-v"}) {
    Array o = read_array(fs::path(dir) / variant / "o.npy");
    o.data[0] = std::numeric_limits<float>::quiet_NaN();  // b=0, s=0, h=0, d=0: row 0 sees keys 0..8 only
    write_array(fs::path(dir) / variant / "o.npy", o.shape, o.data.data());
    Result r = run("--npy " + dir);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(has(r.out, "mask")) << r.out;
    EXPECT_TRUE(has(r.out, variant)) << r.out;
    const bool k = std::string(variant).back() == 'k';
    EXPECT_TRUE(has(r.out, k ? "masked K reached the scores" : "masked V reached P.V")) << r.out;
    EXPECT_FALSE(has(r.out, k ? "masked V reached P.V" : "masked K reached the scores")) << r.out;
    compute_with_kernel(fs::path(dir) / variant, "online-row");
  }
  // Order dependence with the rescale signature: wrong only when the max key comes last.
  {
    Array o = read_array(fs::path(dir) / "keys-max-last/o.npy");
    for (size_t i = 0; i < o.data.size(); i += 7) o.data[i] *= 1.01f;
    write_array(fs::path(dir) / "keys-max-last/o.npy", o.shape, o.data.data());
    Result r = run("--npy " + dir);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(has(r.out, "rescale")) << r.out;
  }
}

TEST(Npy, FullyMaskedRowsMustBeZero) {
  const std::string dir = fresh("masked-rows");
  ASSERT_EQ(run("--npy-emit " + dir + " --sq 9 --sk 5 --d 8 --mask causal-br").code, 0);
  compute_with_kernel(fs::path(dir) / "base", "flash-bm16-bn32");
  EXPECT_EQ(run("--npy " + dir + "/base").code, 0);
  Array o = read_array(fs::path(dir) / "base/o.npy");
  o.data[8 * 1 + 2] = 0.25f;  // row 1 has no visible key
  write_array(fs::path(dir) / "base/o.npy", o.shape, o.data.data());
  Result r = run("--npy " + dir + "/base");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "mask")) << r.out;
  EXPECT_TRUE(has(r.out, "fully masked")) << r.out;
}

TEST(Npy, OtherAlignmentIsNamed) {
  // A kernel that computed causal-tl where causal-br was asked for: explicit files, flags for the mask.
  const std::string dir = fresh("align");
  ASSERT_EQ(run("--npy-emit " + dir + " --sq 6 --sk 11 --d 8 --mask causal-tl").code, 0);
  compute_with_kernel(fs::path(dir) / "base", "materialized");
  const std::string b = dir + "/base/";
  Result r =
      run("--q " + b + "q.npy --k " + b + "k.npy --v " + b + "v.npy --o " + b + "o.npy --mask causal-br");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "mask")) << r.out;
  EXPECT_TRUE(has(r.out, "causal-tl")) << r.out;
}

TEST(Npy, BhsdLayoutAndShapeChecks) {
  const std::string dir = fresh("bhsd");
  ASSERT_EQ(run("--npy-emit " + dir + " --layout bhsd --sq 7 --sk 10 --d 6 --heads 3").code, 0);
  Array q = read_array(fs::path(dir) / "base/q.npy");
  EXPECT_EQ(q.shape, (std::vector<int64_t>{1, 3, 7, 6}));
  // Compute in bshd through the kernel, then store o as bhsd.
  Spec spec;
  read_sidecar(fs::path(dir) / "base/case.json", spec);
  EXPECT_EQ(spec.layout, Layout::kBHSD);
  Array k = read_array(fs::path(dir) / "base/k.npy"), v = read_array(fs::path(dir) / "base/v.npy");
  Problem p = make_problem(1, 3, 3, 7, 10, 6, 6);
  auto tr = [](const std::vector<float>& x, int64_t H, int64_t S, int64_t D) {  // bhsd -> bshd
    std::vector<float> y(x.size());
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t d = 0; d < D; ++d) y[(s * H + h) * D + d] = x[(h * S + s) * D + d];
    return y;
  };
  const auto qs = tr(q.data, 3, 7, 6), ks = tr(k.data, 3, 10, 6), vs = tr(v.data, 3, 10, 6);
  Fp32Result ref = reference_fp32(p, qs.data(), ks.data(), vs.data());
  std::vector<float> ob(ref.o.size());
  for (int64_t h = 0; h < 3; ++h)
    for (int64_t s = 0; s < 7; ++s)
      for (int64_t d = 0; d < 6; ++d) ob[(h * 7 + s) * 6 + d] = ref.o[(s * 3 + h) * 6 + d];
  write_array(fs::path(dir) / "base/o.npy", {1, 3, 7, 6}, ob.data());
  Result r = run("--npy " + dir + "/base");
  EXPECT_EQ(r.code, 0) << r.out;
  Result wrong = run("--npy " + dir + "/base --layout bshd");
  EXPECT_EQ(wrong.code, 2) << wrong.out;
  EXPECT_TRUE(has(wrong.out, "shape mismatch")) << wrong.out;
  EXPECT_TRUE(has(wrong.out, "--layout bhsd")) << wrong.out;
}

TEST(Npy, Fp16AndBf16Storage) {
  const std::string dir = fresh("fp16");
  ASSERT_EQ(run("--npy-emit " + dir +
                " --compute-dtype fp16 --sq 20 --sk 33 --d 16 --mask causal-br --dist extreme:30")
                .code,
            0);
  Array q = read_array(fs::path(dir) / "base/q.npy");
  EXPECT_EQ(q.stored, Stored::kF16);
  Array k = read_array(fs::path(dir) / "base/k.npy"), v = read_array(fs::path(dir) / "base/v.npy");
  Problem p = make_problem(1, 1, 1, 20, 33, 16, 16);
  parse_mask("causal-br", p);
  std::vector<float> o(20 * 16);
  float lse = 0;
  for (int64_t s = 0; s < 20; ++s)
    reference_lowp_row(p, q.data.data(), k.data.data(), v.data.data(), 0, 0, s, AF_DTYPE_F16,
                       LowpStyle::kFlash, &o[s * 16], &lse);
  write_array(fs::path(dir) / "base/o.npy", {1, 20, 1, 16}, o.data(), Stored::kF16);
  Result r = run("--npy " + dir + "/base");
  EXPECT_EQ(r.code, 0) << r.out;
  Result as32 = run("--npy " + dir + "/base --compute-dtype fp32");
  EXPECT_EQ(as32.code, 1) << as32.out;  // an fp16 result is not an fp32 kernel's result

  const std::string bdir = fresh("bf16raw");
  ASSERT_EQ(run("--npy-emit " + bdir + " --compute-dtype bf16 --bf16-raw --sq 5 --d 8").code, 0);
  Result no_flag = run("--npy " + bdir + "/base --o " + bdir + "/base/q.npy");
  EXPECT_EQ(no_flag.code, 2);
  Array qb = read_array(fs::path(bdir) / "base/q.npy", true);
  EXPECT_EQ(qb.stored, Stored::kBF16Raw);
  for (float f : qb.data) EXPECT_EQ(round_to_dtype(f, AF_DTYPE_BF16), f);
  Array kb = read_array(fs::path(bdir) / "base/k.npy", true),
        vb = read_array(fs::path(bdir) / "base/v.npy", true);
  Problem pb = make_problem(1, 1, 1, 5, 5, 8, 8);
  std::vector<float> ob(5 * 8);
  for (int64_t s = 0; s < 5; ++s)
    reference_lowp_row(pb, qb.data.data(), kb.data.data(), vb.data.data(), 0, 0, s, AF_DTYPE_BF16,
                       LowpStyle::kMath, &ob[s * 8], &lse);
  write_array(fs::path(bdir) / "base/o.npy", {1, 5, 1, 8}, ob.data(), Stored::kBF16Raw);
  Result missing = run("--npy " + bdir + "/base");
  EXPECT_EQ(missing.code, 0) << missing.out;  // the sidecar says bf16_raw
  fs::remove(fs::path(bdir) / "base/case.json");
  Result raw = run("--npy " + bdir + "/base");
  EXPECT_EQ(raw.code, 2) << raw.out;
  EXPECT_TRUE(has(raw.out, "--bf16-raw")) << raw.out;
  Result ok = run("--npy " + bdir + "/base --bf16-raw");
  EXPECT_EQ(ok.code, 0) << ok.out;
}

TEST(Npy, MalformedFilesGiveOneClearLineAndExitTwo) {
  const std::string dir = fresh("malformed");
  ASSERT_EQ(run("--npy-emit " + dir + " --sq 4 --d 8").code, 0);
  const fs::path b = fs::path(dir) / "base";
  compute_with_kernel(b, "flash-bm16-bn32");
  const std::string good = fs::path(dir) / "good.npy";
  fs::copy_file(b / "o.npy", good);
  auto expect_error = [&](const std::string& what, const std::string& file = "o.npy") {
    Result r = run("--npy " + b.string());
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(has(r.out, what)) << r.out;
    EXPECT_TRUE(has(r.out, file)) << r.out;
    EXPECT_LE(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  };
  {  // bad header
    std::ofstream f(b / "o.npy", std::ios::binary);
    f << "this is not an npy file at all, not even close";
  }
  expect_error("bad NPY header");
  {  // wrong dtype: int32
    std::ifstream in(good, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    bytes.replace(bytes.find("'<f4'"), 5, "'<i4'");
    std::ofstream f(b / "o.npy", std::ios::binary);
    f << bytes;
  }
  expect_error("unsupported dtype '<i4'");
  {  // truncated data
    std::ifstream in(good, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream f(b / "o.npy", std::ios::binary);
    f << bytes.substr(0, bytes.size() - 10);
  }
  expect_error("truncated data");
  {  // shape mismatch: Dv 8 -> 4 (and 2 rows per d): o [1, 4, 2, 4] against q [1, 4, 1, 8]
    std::vector<float> x(32, 0.0f);
    write_array(b / "o.npy", {1, 4, 2, 4}, x.data());
  }
  expect_error("shape mismatch", "o [1, 4, 2, 4]");
  Result nofile = run("--npy " + fs::path(dir).string() + "/nothing");
  EXPECT_EQ(nofile.code, 2) << nofile.out;
  EXPECT_TRUE(has(nofile.out, "Directory does not exist")) << nofile.out;
}

// Issue 27 item 13: format version 3 (version 2 with a UTF-8 header) reads like versions 1 and 2; unknown
// versions are still refused with the ones read.
TEST(Npy, Version3FilesRead) {
  const fs::path dir = fresh("v3");
  fs::create_directories(dir);
  const std::vector<float> x = {1.5f, -2.0f, 0.25f, 8.0f, 3.0f, -0.5f};
  write_array(dir / "v1.npy", {1, 3, 1, 2}, x.data());
  std::ifstream in(dir / "v1.npy", std::ios::binary);
  const std::string v1((std::istreambuf_iterator<char>(in)), {});
  ASSERT_EQ(v1[6], 1);
  const uint32_t len = static_cast<unsigned char>(v1[8]) | static_cast<unsigned char>(v1[9]) << 8;
  auto version = [&](char major) {
    std::string b = v1.substr(0, 6) + major + '\0';
    for (int i = 0; i < 4; ++i) b += static_cast<char>((len >> (8 * i)) & 0xff);
    return b + v1.substr(10);
  };
  for (char major : {2, 3}) {
    const fs::path f = dir / ("v" + std::to_string(major) + ".npy");
    std::ofstream(f, std::ios::binary) << version(major);
    const Array a = read_array(f);
    EXPECT_EQ(a.shape, (std::vector<int64_t>{1, 3, 1, 2})) << int(major);
    EXPECT_EQ(a.data, x) << int(major);
  }
  std::ofstream(dir / "v9.npy", std::ios::binary) << version(9);
  try {
    read_array(dir / "v9.npy");
    ADD_FAILURE() << "version 9 was read";
  } catch (const NpyError& e) {
    EXPECT_TRUE(has(e.what(), "version 9 is unknown (1, 2 or 3)")) << e.what();
  }
}

}  // namespace

// Score variants (issue 28): sinks.npy, alibi_slopes.npy, bias.npy (size-1 dimensions broadcast) and the sidecar's
// softcap describe the problem; the flash kernel's output of the same variant case passes, the output computed
// without the sink fails.
// q, k, v of a prepared dense case and flash-bm16-bn32's O and LSE on them, as DIR/{q,k,v,o,lse}.npy (bshd).
void write_flash_files(const fs::path& dir, PreparedCase& pc) {
  const Tensors& t = pc.tensors();
  auto dev = open_device("cpu", DeviceOptions{});
  const KernelEntry& k = *Registry::global().select(Backend::kCpu, "flash-bm16-bn32").at(0);
  const LaunchOutcome out = launch_guarded(*dev, k, pc.problem(), t, RunOptions{});
  const Problem& q = pc.problem();
  write_array(dir / "q.npy", {q.batch, q.seq_q, q.heads_q, q.head_dim}, t.q.data());
  write_array(dir / "k.npy", {q.batch, q.seq_k, q.heads_kv, q.head_dim}, t.k.data());
  write_array(dir / "v.npy", {q.batch, q.seq_k, q.heads_kv, q.head_dim_v}, t.v.data());
  write_array(dir / "o.npy", {q.batch, q.seq_q, q.heads_q, q.head_dim_v}, out.o.data());
  write_array(dir / "lse.npy", {q.batch, q.heads_q, q.seq_q}, out.lse.data());
}

TEST(Npy, ScoreVariantsFromFilesAndSidecar) {
  const fs::path dir = fresh("variants");
  fs::create_directories(dir);
  Problem p = make_problem(2, 2, 1, 9, 14, 16, 16);
  ASSERT_EQ(parse_mask("causal-br", p), "");
  Case c = make_case(p, 11);
  ASSERT_EQ(set_variants(c, AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI | AF_VARIANT_BIAS, 5.0f, "b"), "");
  PreparedCase pc(c);
  const Tensors& t = pc.tensors();
  const Problem& q = pc.problem();
  write_flash_files(dir, pc);
  write_array(dir / "sinks.npy", {q.heads_q}, t.sinks.data());
  write_array(dir / "alibi_slopes.npy", {q.heads_q}, t.alibi_slopes.data());
  write_array(dir / "bias.npy", {1, q.heads_q, q.seq_q, q.seq_k}, t.bias.data());
  {
    std::ofstream sc(dir / "case.json");
    sc << "{\"mask\": \"causal-br\", \"softcap\": 5}\n";
  }
  const External ext = load_external(files_in(dir), resolve_spec(dir / "case.json", {}));
  EXPECT_EQ(ext.problem.variants, static_cast<uint32_t>(AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI |
                                                        AF_VARIANT_BIAS));
  EXPECT_EQ(bias_broadcast(ext.problem), "b");
  const Judged j = judge_external(ext, OracleOptions{});
  EXPECT_EQ(j.result.verdict, Verdict::kPass) << j.result.reason;
  // Without sinks.npy the same output is judged against the sink-free exact result: it fails.
  fs::remove(dir / "sinks.npy");
  const Judged no_sink = judge_external(load_external(files_in(dir), resolve_spec(dir / "case.json", {})), OracleOptions{});
  EXPECT_EQ(no_sink.result.verdict, Verdict::kFail);
}

// MLA's shared K/V latent (issue 28 item 5): "kv_shared": true and no v.npy: V is k.npy's first Dv columns
// (Dv = o's last dimension); flash-bm16-bn32's output of the shared case passes; a v.npy beside it is
// refused; without kv_shared a v.npy of other values fails.
TEST(Npy, KvSharedFromTheSidecar) {
  const fs::path dir = fresh("kv_shared");
  fs::create_directories(dir);
  Case c = make_case(make_problem(2, 4, 2, 5, 19, 24, 16), 17);
  ASSERT_EQ(set_variants(c, AF_VARIANT_KV_SHARED), "");
  PreparedCase pc(c);
  write_flash_files(dir, pc);
  fs::remove(dir / "v.npy");
  std::ofstream(dir / "case.json") << "{\"kv_shared\": true}\n";
  const External ext = load_external(files_in(dir), resolve_spec(dir / "case.json", {}));
  EXPECT_TRUE(kv_shared(ext.problem));
  EXPECT_EQ(ext.problem.head_dim_v, 16);
  const Judged j = judge_external(ext, OracleOptions{});
  EXPECT_EQ(j.result.verdict, Verdict::kPass) << j.result.reason;
  const std::vector<float> zeros(static_cast<size_t>(2 * 19 * 2 * 16), 0.5f);
  write_array(dir / "v.npy", {2, 19, 2, 16}, zeros.data());
  EXPECT_THROW(load_external(files_in(dir), resolve_spec(dir / "case.json", {})), NpyError);
  std::ofstream(dir / "case.json") << "{}\n";
  EXPECT_EQ(judge_external(load_external(files_in(dir), resolve_spec(dir / "case.json", {})), OracleOptions{})
                .result.verdict,
            Verdict::kFail);
}

// Per-head fp8 descales (issue 28 item 6): q_descale.npy [Hq], k_descale.npy / v_descale.npy [B, Hkv] with an
// fp8 compute dtype in case.json; flash-bm16-bn32's fp8 output passes, the per-tensor problem (all descales
// 1) fails; one file alone or a descale that is not exact is refused.
TEST(Npy, HeadDescalesFromFiles) {
  const fs::path dir = fresh("head_descale");
  fs::create_directories(dir);
  Problem p = make_problem(2, 4, 2, 9, 14, 16, 16);
  p.dtype = AF_DTYPE_FP8_E4M3;
  Case c = make_case(p, 13);
  ASSERT_EQ(set_variants(c, AF_VARIANT_HEAD_DESCALE), "");
  set_descale_strides(c.problem, true);
  PreparedCase pc(c);
  const Tensors& t = pc.tensors();
  const Problem& q = pc.problem();
  write_array(dir / "q_descale.npy", {q.heads_q}, t.q_descale_h.data());  // batch 0's row for every batch
  std::vector<float> kd, vd;
  for (int64_t b = 0; b < q.batch; ++b)
    for (int64_t h = 0; h < q.heads_kv; ++h)
      kd.push_back(t.k_descale_h[descale_h_index(q, b, h)]),
          vd.push_back(t.v_descale_h[descale_h_index(q, b, h)]);
  write_array(dir / "k_descale.npy", {q.batch, q.heads_kv}, kd.data());
  write_array(dir / "v_descale.npy", {q.batch, q.heads_kv}, vd.data());
  std::ofstream(dir / "case.json") << "{\"compute_dtype\": \"fp8-e4m3\"}\n";
  // q_descale.npy holds batch 0's row for every batch: the flash output of the case whose batch 1 row is
  // batch 0's.
  PreparedCase same = [&] {
    Case c2 = c;
    c2.variants.q_descale_h.assign(t.q_descale_h.begin(), t.q_descale_h.end());
    for (int64_t h = 0; h < q.heads_q; ++h)
      c2.variants.q_descale_h[descale_h_index(q, 1, h)] = t.q_descale_h[h];
    c2.variants.k_descale_h = t.k_descale_h, c2.variants.v_descale_h = t.v_descale_h;
    return PreparedCase(c2);
  }();
  write_flash_files(dir, same);
  const External ext = load_external(files_in(dir), resolve_spec(dir / "case.json", {}));
  EXPECT_EQ(ext.problem.variants, static_cast<uint32_t>(AF_VARIANT_HEAD_DESCALE));
  EXPECT_EQ(ext.problem.descale_stride[0], q.heads_q);
  for (int64_t b = 0; b < q.batch; ++b)
    for (int64_t h = 0; h < q.heads_kv; ++h)  // the entries read (between the rows: 1)
      EXPECT_EQ(ext.k_descale_h[descale_h_index(q, b, h)], t.k_descale_h[descale_h_index(q, b, h)]);
  const Judged j = judge_external(ext, OracleOptions{});
  EXPECT_EQ(j.result.verdict, Verdict::kPass) << j.result.reason;
  // Every descale 1 (the per-tensor problem): the same output fails.
  const std::vector<float> ones(8, 1.0f);
  write_array(dir / "q_descale.npy", {q.heads_q}, ones.data());
  write_array(dir / "k_descale.npy", {q.batch, q.heads_kv}, ones.data());
  write_array(dir / "v_descale.npy", {q.batch, q.heads_kv}, ones.data());
  EXPECT_EQ(judge_external(load_external(files_in(dir), resolve_spec(dir / "case.json", {})), OracleOptions{})
                .result.verdict,
            Verdict::kFail);
  const std::vector<float> bad{1.0f, 0x1.00001p0f, 1.0f, 1.0f};
  write_array(dir / "q_descale.npy", {q.heads_q}, bad.data());
  EXPECT_THROW(load_external(files_in(dir), resolve_spec(dir / "case.json", {})), NpyError);
  fs::remove(dir / "v_descale.npy");
  EXPECT_THROW(files_in(dir), NpyError);
}

// Custom masks (issue 28 item 4): mask.npy ([B|1, Hq|1, Sq|1, Sk], non-zero = visible) and block_mask.npy with the
// sidecar's block_size make a mask problem; the flash output passes it and fails the problem without block_mask.npy.
TEST(Npy, CustomMasksFromFiles) {
  const fs::path dir = fresh("masks");
  fs::create_directories(dir);
  Problem p = make_problem(2, 2, 1, 9, 14, 16, 16);
  ASSERT_EQ(parse_mask("causal-br", p), "");
  Case c = make_case(p, 12);
  ASSERT_EQ(set_mask_variants(c, AF_VARIANT_MASK_DENSE | AF_VARIANT_BLOCK_SPARSE, "random:0.6", "mixed", "b", 4, 8), "");
  PreparedCase pc(c);
  const Tensors& t = pc.tensors();
  const Problem& q = pc.problem();
  write_flash_files(dir, pc);
  const std::vector<float> mask(t.custom_mask.begin(), t.custom_mask.end()), blocks(t.block_mask.begin(), t.block_mask.end());
  write_array(dir / "mask.npy", {1, q.heads_q, q.seq_q, q.seq_k}, mask.data());
  write_array(dir / "block_mask.npy", {1, q.heads_q, query_blocks(q), key_blocks(q)}, blocks.data());
  {
    std::ofstream sc(dir / "case.json");
    sc << "{\"mask\": \"causal-br\", \"block_size\": [4, 8]}\n";
  }
  const External ext = load_external(files_in(dir), resolve_spec(dir / "case.json", {}));
  EXPECT_EQ(ext.problem.variants, static_cast<uint32_t>(AF_VARIANT_MASK_DENSE | AF_VARIANT_BLOCK_SPARSE));
  EXPECT_EQ(mask_broadcast(ext.problem), "b");
  EXPECT_EQ(judge_external(ext, OracleOptions{}).result.verdict, Verdict::kPass);
  fs::remove(dir / "block_mask.npy");
  EXPECT_EQ(judge_external(load_external(files_in(dir), resolve_spec(dir / "case.json", {})), OracleOptions{})
                .result.verdict,
            Verdict::kFail);
  write_array(dir / "block_mask.npy", {1, q.heads_q, 2, 2}, blocks.data());  // wrong block count: one sentence
  EXPECT_THROW(load_external(files_in(dir), resolve_spec(dir / "case.json", {})), NpyError);
}
