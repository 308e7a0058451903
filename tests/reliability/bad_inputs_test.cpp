// bad_inputs_test.cpp - every bad input of issue 12 as a table (argv -> exit code + message fragment), run
// against the real attn-check / attn-fuzz binaries as subprocesses, each under a timeout.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attnfuzz/corpus.h"

namespace fs = std::filesystem;
using namespace attnfuzz;

namespace {

const fs::path kTmp = fs::path(TEST_TMP);

struct Outcome {
  int code = -1;  // exit status; -2: killed by the test's timeout; -3: killed by a signal
  int signal = 0;
  std::string out;  // stdout and stderr
  double seconds = 0;
};

// Runs binary with argv (no shell: '' stays an empty argument) in its own process group; kills the
// group after timeout_s.
Outcome run(const std::string& binary, const std::vector<std::string>& args, double timeout_s,
            const std::vector<std::pair<std::string, std::string>>& env = {}) {
  static int n = 0;
  fs::create_directories(kTmp / "logs");
  const fs::path log =
      kTmp / "logs" / ("log-" + std::to_string(getpid()) + "-" + std::to_string(n++) + ".txt");
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    const int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv{const_cast<char*>(binary.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  setpgid(pid, pid);
  Outcome o;
  int st = 0;
  for (;;) {
    const pid_t r = waitpid(pid, &st, WNOHANG);
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r == pid) {
      o.code = WIFEXITED(st) ? WEXITSTATUS(st) : -3;
      o.signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
      break;
    }
    if (o.seconds > timeout_s) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      o.code = -2;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(-pid, SIGKILL);  // nothing of the group may outlive the case (attn-fuzz workers)
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  o.out = ss.str();
  return o;
}

// ---- input files the table refers to (made once) ----

// Per process: ctest may run the table's cases in parallel processes.
const fs::path& input_dir() {
  static const fs::path d = kTmp / ("inputs-" + std::to_string(getpid()));
  return d;
}

std::string write_text(const std::string& name, const std::string& text) {
  const fs::path p = input_dir() / name;
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

CorpusFile small_case_file() {
  CorpusFile f;
  f.tool.name = "bad_inputs_test";
  f.tool.version = "1";
  f.the_case = make_case(make_problem(1, 1, 1, 4, 5, 8, 8), 3);
  return f;
}

// An NPY v1 file whose header says `shape` (a Python tuple text) and dtype '<f4', with `data_bytes` zeros.
std::string write_npy(const std::string& name, const std::string& shape, size_t data_bytes) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(dict.size() & 0xff);
  bytes += static_cast<char>(dict.size() >> 8);
  bytes += dict;
  bytes += std::string(data_bytes, '\0');
  return write_text(name, bytes);
}

struct Inputs {
  std::string good_case, overlap_case, lse_overlap_case, big_file, fifo, good_and_bad_dir, empty_dir, neg_npy,
      huge_npy, product_npy, npy_dir, zero_sidecar_dir;
  // issue 27
  std::string fwd_npy_dir, grads_without_do_dir, tunable_9_case, tunable_past_declared_case, seq_q_disagrees_case,
      strides_beside_sequences_case, dtype_alias_case;
};

// A varlen case file (packed q and k/v, two sequences) as the tools write it.
std::string varlen_case_text() {
  CorpusFile f = small_case_file();
  Case& c = f.the_case;
  c.problem.q_layout = c.problem.kv_layout = AF_SEQ_PACKED;
  c.problem.batch = 2;
  c.seqs.q = {3, 5};
  c.seqs.k = {4, 6};
  EXPECT_EQ(set_sequence_fields(c), "");
  return to_corpus_text(f);
}
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from << " not in\n" << text;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

const Inputs& inputs() {
  static const Inputs in = [] {
    Inputs i;
    fs::remove_all(input_dir());
    fs::create_directories(input_dir());
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(input_dir(), ec);
    });
    i.good_case = write_text("good.case", to_corpus_text(small_case_file()));
    CorpusFile overlap = small_case_file();
    overlap.the_case.problem.o_stride[0] = 0;  // o strides [0, 1, 0]: every (s, h) writes the same row
    overlap.the_case.problem.o_stride[1] = 1;
    overlap.the_case.problem.o_stride[2] = 0;
    i.overlap_case = write_text("overlap.case", to_corpus_text(overlap));
    CorpusFile lse = small_case_file();
    lse.the_case.problem.lse_stride[2] = 0;  // every query row's LSE at one address
    i.lse_overlap_case = write_text("lse-overlap.case", to_corpus_text(lse));
    // 300 MB without a newline (sparse: costs no disk, and must cost no memory to refuse).
    i.big_file = (input_dir() / "big.case").string();
    {
      std::ofstream(i.big_file) << "x";
      fs::resize_file(i.big_file, 300u << 20);
    }
    i.fifo = (input_dir() / "fifo.case").string();
    mkfifo(i.fifo.c_str(), 0644);
    i.good_and_bad_dir = (input_dir() / "mixed").string();
    fs::create_directories(i.good_and_bad_dir);
    fs::copy_file(i.good_case, fs::path(i.good_and_bad_dir) / "a-good.case");
    std::ofstream(fs::path(i.good_and_bad_dir) / "b-foreign.case") << "hello\n";
    fs::copy_file(i.good_case, fs::path(i.good_and_bad_dir) / "c-good.case");
    fs::copy_file(i.overlap_case, fs::path(i.good_and_bad_dir) / "d-overlap.case");
    i.empty_dir = (input_dir() / "empty").string();
    fs::create_directories(i.empty_dir);
    i.neg_npy = write_npy("neg.npy", "(1, -3, 1, 4)", 0);
    i.huge_npy = write_npy("huge.npy", "(1, 99999999999999999999, 1, 4)", 0);
    i.product_npy = write_npy("product.npy", "(65536, 65536, 2, 4)", 0);
    i.npy_dir = (input_dir() / "npydir").string();
    fs::create_directories(i.npy_dir);
    i.zero_sidecar_dir = (input_dir() / "zero-sidecar").string();
    fs::create_directories(i.zero_sidecar_dir);
    const std::string one = write_npy("one.npy", "(1, 1, 1, 1)", 4);
    for (const char* t : {"q.npy", "k.npy", "v.npy", "o.npy"})
      fs::copy_file(one, fs::path(i.zero_sidecar_dir) / t);
    fs::create_symlink("/dev/zero", fs::path(i.zero_sidecar_dir) / "case.json");
    // issue 27 item 6: a forward-only NPY directory (zeros: the outputs are right), and one with dq/dk/dv but no do.
    i.fwd_npy_dir = (input_dir() / "fwd-npy").string();
    i.grads_without_do_dir = (input_dir() / "grads-without-do").string();
    for (const std::string& d : {i.fwd_npy_dir, i.grads_without_do_dir}) {
      fs::create_directories(d);
      for (const char* t : {"q.npy", "k.npy", "v.npy", "o.npy"}) fs::copy_file(one, fs::path(d) / t);
    }
    for (const char* t : {"dq.npy", "dk.npy", "dv.npy"}) fs::copy_file(one, fs::path(i.grads_without_do_dir) / t);
    // items 5 and 11: tunables split-kv does not accept (num_splits = 9) or does not declare (a second one).
    CorpusFile t9 = small_case_file();
    t9.the_case.problem.tunables[0] = 9;
    i.tunable_9_case = write_text("tunable-9.case", to_corpus_text(t9));
    CorpusFile t2 = small_case_file();
    t2.the_case.problem.tunables[1] = 2;
    i.tunable_past_declared_case = write_text("tunable-past.case", to_corpus_text(t2));
    // item 11: new fields that disagree with the sequences, or aliases the file format does not name.
    const std::string varlen = varlen_case_text();
    i.seq_q_disagrees_case = write_text("seq-q.case", replaced(varlen, "\"seq_q\": 5", "\"seq_q\": 9"));
    i.strides_beside_sequences_case = write_text(
        "strides.case", replaced(varlen, "\"dtype\": \"f32\",",
                                 "\"dtype\": \"f32\", \"strides\": {\"q\": [1, 1, 1], \"k\": [1, 1, 1], "
                                 "\"v\": [1, 1, 1], \"o\": [1, 1, 1], \"lse\": [1, 1, 1]},"));
    i.dtype_alias_case =
        write_text("dtype-alias.case", replaced(to_corpus_text(small_case_file()), "\"dtype\": \"f32\"", "\"dtype\": \"fp8\""));
    return i;
  }();
  return in;
}

// ---- the table ----

enum class Tool { kCheck, kFuzz, kProps };
struct BadInput {
  const char* name;  // test name
  Tool tool;
  std::vector<std::string> args;  // "@NAME" is replaced by the input file NAME of Inputs
  int code;                       // expected exit status
  std::vector<std::string> says;  // fragments the output must contain
  double timeout_s = 60;
  std::vector<std::pair<std::string, std::string>> env = {};  // set in the tool's environment
};

std::string subst(const std::string& a) {
  const Inputs& in = inputs();
  const std::pair<const char*, const std::string*> files[] = {
      {"@good", &in.good_case},
      {"@overlap", &in.overlap_case},
      {"@lse_overlap", &in.lse_overlap_case},
      {"@big", &in.big_file},
      {"@fifo", &in.fifo},
      {"@mixed", &in.good_and_bad_dir},
      {"@empty", &in.empty_dir},
      {"@neg_npy", &in.neg_npy},
      {"@huge_npy", &in.huge_npy},
      {"@product_npy", &in.product_npy},
      {"@npy_dir", &in.npy_dir},
      {"@zero_sidecar", &in.zero_sidecar_dir},
      {"@fwd_npy", &in.fwd_npy_dir},
      {"@grads_without_do", &in.grads_without_do_dir},
      {"@tunable_9", &in.tunable_9_case},
      {"@tunable_past", &in.tunable_past_declared_case},
      {"@seq_q_disagrees", &in.seq_q_disagrees_case},
      {"@strides_beside_sequences", &in.strides_beside_sequences_case},
      {"@dtype_alias", &in.dtype_alias_case},
  };
  for (auto [key, val] : files)
    if (a == key) return *val;
  return a;
}

using V = std::vector<std::string>;
const Tool C = Tool::kCheck, F = Tool::kFuzz, P = Tool::kProps;

const BadInput kTable[] = {
    // --- checking nothing ---
    {"kernel_empty", C, {"--kernel", ""}, 2, {"--kernel", "empty"}},
    {"kernel_comma", C, {"--kernel", ","}, 2, {"--kernel", "empty name"}},
    {"kernel_double_comma", C, {"--kernel", "online-row,,naive"}, 2, {"--kernel", "empty name"}},
    {"fuzz_kernel_comma", F, {"--kernel", ",", "--max-time", "5"}, 2, {"--kernel", "empty name"}},
    {"fuzz_kernel_empty", F, {"--kernel", "", "--max-time", "5"}, 2, {"--kernel", "empty"}},
    {"fuzz_worker_true",
     F,
     {"--worker", "/bin/true", "--max-time", "4", "--workers", "1", "--no-seeds"},
     2,
     {"no case was checked"},
     120},
    // --- out-of-range values: the case ---
    {"sk_negative", C, {"--sk", "-1"}, 2, {"--sk", "not in range 0 to"}},
    {"dv_zero", C, {"--dv", "0"}, 2, {"--dv", "not in range 1 to"}},
    {"kv_heads_zero", C, {"--kv-heads", "0"}, 2, {"--kv-heads", "not in range 1 to"}},
    {"mask_window_minus_one", C, {"--mask", "window:-1,2"}, 2, {"--mask", "inf"}},
    {"mask_unknown", C, {"--mask", "diagonal"}, 2, {"--mask", "causal-tl"}},
    {"batch_zero", C, {"--batch", "0"}, 2, {"--batch", "not in range 1 to"}},
    {"heads_zero", C, {"--heads", "0"}, 2, {"--heads", "not in range 1 to"}},
    {"sq_zero", C, {"--sq", "0"}, 2, {"--sq", "not in range 1 to"}},
    {"sq_huge", C, {"--sq", "99999999999"}, 2, {"--sq", "not in range 1 to 2147483648"}},
    {"sq_not_a_number", C, {"--sq", "7x"}, 2, {"--sq", "not an integer"}},
    {"d_zero", C, {"--d", "0"}, 2, {"--d", "not in range 1 to"}},
    {"scale_nan", C, {"--scale", "nan"}, 2, {"--scale", "finite"}},
    {"scale_inf", C, {"--scale", "inf"}, 2, {"--scale", "finite"}},
    {"scale_text", C, {"--scale", "abc"}, 2, {"--scale", "finite"}},
    {"dtype_unknown", C, {"--dtype", "f8"}, 2, {"--dtype", "f32"}},
    {"dist_unknown", C, {"--dist", "weird"}, 2, {"--dist"}},
    {"special_unknown", C, {"--special", "nan@x"}, 2, {"--special"}},
    {"seed_negative", C, {"--seed", "-1"}, 2, {"--seed", "18446744073709551615"}},
    {"repeat_zero", C, {"--repeat", "0"}, 2, {"--repeat", "not in range 1 to 1000000"}},
    {"heads_not_multiple", C, {"--heads", "3", "--kv-heads", "2"}, 2, {"multiple"}},
    // --- out-of-range values: common options ---
    {"backend_unknown", C, {"--backend", "tpu"}, 2, {"--backend", "{cpu,nvidia,amd,auto}"}},
    {"plugin_missing", C, {"--plugin", "/nonexistent/lib.so"}, 2, {"--plugin", "no such file"}},
    {"order_unknown", C, {"--order", "sideways"}, 2, {"--order", "{forward,reverse,shuffle}"}},
    {"order_seed_negative", C, {"--order-seed", "-1"}, 2, {"--order-seed", "[0, 18446744073709551615]"}},
    {"workers_negative", C, {"--workers", "-1"}, 2, {"--workers", "not in range 0 to 1024"}},
    {"workers_huge", C, {"--workers", "5000"}, 2, {"--workers", "not in range 0 to 1024"}},
    {"warp_size_16", C, {"--warp-size", "16"}, 2, {"--warp-size", "{32,64}"}},
    {"timeout_zero", C, {"--timeout", "0"}, 2, {"--timeout", "(0, 86400]"}},
    {"timeout_negative", C, {"--timeout", "-1"}, 2, {"--timeout", "(0, 86400]"}},
    {"timeout_nan", C, {"--timeout", "nan"}, 2, {"--timeout", "finite"}},
    {"oracle_rows_negative", C, {"--oracle-rows", "-1"}, 2, {"--oracle-rows", "not in range 0 to"}},
    {"mp_bits_low", C, {"--mp-bits", "99"}, 2, {"--mp-bits", "not in range 100 to 4096"}},
    {"mp_bits_high", C, {"--mp-bits", "5000"}, 2, {"--mp-bits", "not in range 100 to 4096"}},
    {"out_empty", C, {"--out", ""}, 2, {"--out", "empty"}},
    {"reruns_negative", C, {"--reruns", "-1"}, 2, {"--reruns", "not in range 0 to 1000"}},
    {"tsan_binary_without_tsan", C, {"--tsan-binary", "/bin/true"}, 2, {"--tsan-binary", "requires --tsan"}},
    {"tsan_plugin_without_tsan", C, {"--tsan-plugin", "@good"}, 2, {"--tsan-plugin", "requires --tsan"}},
    {"tsan_with_no_classify", C, {"--tsan", "--no-classify"}, 2, {"--tsan", "--no-classify"}},
    {"unknown_flag", C, {"--no-such-flag"}, 2, {"--no-such-flag"}},
    // --- NPY options ---
    {"layout_unknown", C, {"--npy", "@npy_dir", "--layout", "hsbd"}, 2, {"--layout", "{bshd,bhsd}"}},
    {"compute_dtype_unknown", C, {"--npy", "@npy_dir", "--compute-dtype", "fp64"}, 2, {"--compute-dtype"}},
    {"npy_dir_missing", C, {"--npy", "/nonexistent/dir"}, 2, {"--npy", "Directory does not exist"}},
    {"npy_emit_empty", C, {"--npy-emit", ""}, 2, {"--npy-emit", "empty"}},
    // --- contradictory or incomplete combinations ---
    {"qkv_without_o", C, {"--q", "@neg_npy", "--k", "@neg_npy", "--v", "@neg_npy"}, 2, {"requires --o"}},
    {"o_without_qkv", C, {"--o", "@neg_npy"}, 2, {"--o", "requires --q"}},
    {"lse_without_o", C, {"--lse", "@neg_npy"}, 2, {"--lse", "requires --o"}},
    {"npy_with_sweep", C, {"--npy", "@npy_dir", "--sweep"}, 2, {"--npy", "excludes", "--sweep"}},
    {"npy_with_q", C, {"--npy", "@npy_dir", "--q", "@neg_npy"}, 2, {"excludes"}},
    {"npy_with_sq", C, {"--npy", "@npy_dir", "--sq", "5"}, 2, {"excludes", "--sq"}},
    {"npy_meta_alone", C, {"--npy-meta", "@good"}, 2, {"--npy-meta needs --npy"}},
    {"layout_alone", C, {"--layout", "bshd"}, 2, {"--layout needs"}},
    {"npy_emit_with_npy", C, {"--npy-emit", "x", "--npy", "@npy_dir"}, 2, {"excludes"}},
    {"sweep_with_replay", C, {"--sweep", "--replay", "@good"}, 2, {"--sweep", "excludes", "--replay"}},
    {"sweep_with_sq", C, {"--sweep", "--sq", "5"}, 2, {"--sweep", "excludes", "--sq"}},
    {"replay_with_seed", C, {"--replay", "@good", "--seed", "4"}, 2, {"--replay", "excludes", "--seed"}},
    {"fuzz_seeds_missing",
     F,
     {"--seeds", "/nonexistent", "--max-time", "5"},
     2,
     {"--seeds", "Directory does not exist"}},
    {"fuzz_seeds_with_no_seeds", F, {"--seeds", "@empty", "--no-seeds"}, 2, {"excludes"}},
    {"fuzz_minimize_with_max_time",
     F,
     {"--minimize", "@good", "--max-time", "5"},
     2,
     {"--minimize", "excludes"}},
    {"fuzz_minimize_time_alone", F, {"--minimize-time", "5"}, 2, {"--minimize-time", "requires --minimize"}},
    {"fuzz_no_isolate_vs_isolate",
     F,
     {"--no-isolate", "--isolate", "always"},
     2,
     {"--no-isolate", "--isolate"}},
    // --- attn-fuzz out-of-range values ---
    {"fuzz_max_time_negative", F, {"--max-time", "-5"}, 2, {"--max-time", "[0, "}},
    {"fuzz_max_time_nan", F, {"--max-time", "nan"}, 2, {"--max-time", "finite"}},
    {"fuzz_max_time_inf", F, {"--max-time", "inf"}, 2, {"--max-time", "finite"}},
    {"fuzz_workers_negative", F, {"--workers", "-1"}, 2, {"--workers", "not in range 0 to 1024"}},
    {"fuzz_gpus_negative", F, {"--gpus", "-1"}, 2, {"--gpus", "not in range 0 to 64"}},
    {"fuzz_progress_zero", F, {"--progress", "0"}, 2, {"--progress", "[0.1, 86400]"}},
    {"fuzz_max_seq_zero", F, {"--max-seq", "0"}, 2, {"--max-seq", "not in range 1 to 65536"}},
    {"fuzz_max_d_zero", F, {"--max-d", "0"}, 2, {"--max-d", "not in range 1 to 65536"}},
    {"fuzz_fuzzer_arg_not_a_flag", F, {"--fuzzer-arg", "seed=1"}, 2, {"--fuzzer-arg", "-NAME=VALUE"}},
    {"fuzz_isolate_unknown", F, {"--isolate", "sometimes"}, 2, {"--isolate", "{auto,always,never}"}},
    {"fuzz_worker_missing", F, {"--worker", "/nonexistent/worker"}, 2, {"--worker", "no such"}},
    {"fuzz_minimize_missing", F, {"--minimize", "/nonexistent.case"}, 2, {"--minimize", "no such file"}},
    {"fuzz_minimize_time_zero", F, {"--minimize", "@good", "--minimize-time", "0"}, 2, {"--minimize-time"}},
    {"fuzz_corpus_empty", F, {"--corpus", ""}, 2, {"--corpus", "empty"}},
    {"fuzz_timeout_nan", F, {"--timeout", "nan"}, 2, {"--timeout", "finite"}},
    // --- files: corrupt, unbounded, not regular ---
    {"replay_overlapping_o_strides",
     C,
     {"--replay", "@overlap"},
     2,
     {"overlap.case", "o strides [0, 1, 0] overlap"}},
    {"replay_overlapping_lse_strides", C, {"--replay", "@lse_overlap"}, 2, {"lse strides", "overlap"}},
    {"replay_dev_zero", C, {"--replay", "/dev/zero"}, 2, {"/dev/zero", "not a regular file"}, 30},
    {"replay_fifo", C, {"--replay", "@fifo"}, 2, {"fifo.case", "not a regular file"}, 30},
    {"replay_300mb_without_newline", C, {"--replay", "@big"}, 2, {"big.case", "more than the limit"}, 30},
    {"replay_missing", C, {"--replay", "/nonexistent/file.case"}, 2, {"/nonexistent/file.case"}},
    {"replay_empty_dir", C, {"--replay", "@empty"}, 2, {"no .case files"}},
    {"replay_dir_good_and_bad",
     C,
     {"--replay", "@mixed", "--kernel", "online-row"},
     2,
     {"b-foreign.case", "d-overlap.case", "2 replay input(s) were bad", "2 checks in"}},
    {"npy_negative_dimension",
     C,
     {"--q", "@neg_npy", "--k", "@neg_npy", "--v", "@neg_npy", "--o", "@neg_npy"},
     2,
     {"neg.npy", "dimension 1 is -3", ">= 0"}},
    {"npy_absurd_dimension",
     C,
     {"--q", "@huge_npy", "--k", "@huge_npy", "--v", "@huge_npy", "--o", "@huge_npy"},
     2,
     {"huge.npy", "dimension 1 is 99999999999999999999", "limit of 2147483648"}},
    {"npy_absurd_product",
     C,
     {"--q", "@product_npy", "--k", "@product_npy", "--v", "@product_npy", "--o", "@product_npy"},
     2,
     {"product.npy", "more than the limit of 2147483648 elements"}},
    {"npy_q_is_a_device",
     C,
     {"--q", "/dev/zero", "--k", "@neg_npy", "--v", "@neg_npy", "--o", "@neg_npy"},
     2,
     {"--q", "not a regular file"}},
    {"npy_sidecar_is_dev_zero", C, {"--npy", "@zero_sidecar"}, 2, {"case.json", "not a regular file"}, 30},
    // --- issue 27 (hardening round 3) ---
    // item 3: a case larger than the memory limit is refused before anything is allocated
    {"paged_spare_pages_beyond_memory",
     C,
     {"--seq-layout", "paged", "--sq", "1", "--seqused-k", "33", "--spare-pages", "1048576", "--kernel",
      "paged-decode"},
     2,
     {"GiB of memory", "limit of 8.0 GiB", "ATTNFUZZ_MEMORY_LIMIT_MB", "--spare-pages"},
     60,
     {{"ATTNFUZZ_MEMORY_LIMIT_MB", "8192"}}},
    // item 4: attn-props's options: ranges, one line with its prefix, nothing checked is not a pass
    {"props_n_negative", P, {"-n", "-1"}, 2, {"not in range 1 to 1000000"}},
    {"props_n_zero", P, {"-n", "0"}, 2, {"not in range 1 to 1000000"}},
    {"props_unknown_flag", P, {"--no-such-flag"}, 2, {"--no-such-flag"}},
    {"props_not_a_number", P, {"-n", "many"}, 2, {"not an integer"}},
    {"props_seed_negative", P, {"--seed", "-1"}, 2, {"--seed", "18446744073709551615"}},
    {"props_out_is_a_file", P, {"-o", "/etc/passwd"}, 2, {"/etc/passwd", "not a directory"}},
    {"props_table_is_a_dir", P, {"--table", "/tmp"}, 2, {"--table", "is a directory"}},
    {"props_unknown_property", P, {"-p", "oracle,nonsense"}, 2, {"unknown property 'nonsense'"}},
    {"props_bwd_without_backward_kernel",
     P,
     {"--pass", "bwd", "-k", "online-row", "-n", "1"},
     2,
     {"nothing checked", "backward"}},
    // item 5 / 11: a file's tunables the kernel does not accept or declare are refused, not run as the default
    {"replay_tunable_not_accepted", C, {"--replay", "@tunable_9", "--kernel", "split-kv"}, 2, {"tunable-9.case", "tunables[0] = 9", "accepts 8, 1, 2"}},
    {"replay_tunable_not_declared", C, {"--replay", "@tunable_past", "--kernel", "split-kv"}, 2, {"tunables[1] = 2", "declares 1 tunable"}},
    // item 6: NPY gradients: incomplete, or asked for and absent
    {"npy_grads_without_do", C, {"--npy", "@grads_without_do"}, 2, {"incomplete backward files", "without do.npy"}},
    {"npy_pass_bwd_without_grads", C, {"--npy", "@fwd_npy", "--pass", "bwd"}, 2, {"--pass bwd", "no gradients"}},
    // item 9: a selection that supports nothing checks nothing: exit 2 with a line saying so
    {"sweep_bwd_on_forward_only_kernel",
     C,
     {"--pass", "bwd", "--sweep", "--kernel", "online-row", "--no-reports"},
     2,
     {"nothing checked", "no selected kernel supports"},
     120},
    // item 10: contradicting case flags are refused, not resolved silently
    {"descale_five_values",
     C,
     {"--dtype", "fp8-e4m3", "--descale", "1,1,1,1,2", "--sq", "2", "--d", "8"},
     2,
     {"--descale", "more than 4 values"}},
    {"descale_empty_item", C, {"--dtype", "fp8-e4m3", "--descale", "1,,1"}, 2, {"--descale", "Q,K,V[,O]"}},
    {"seqlens_q_with_sq", C, {"--seq-layout", "varlen", "--seqlens-q", "3,4", "--sq", "100"}, 2, {"--sq does not apply"}},
    {"seqlens_q_with_batch", C, {"--seq-layout", "varlen", "--seqlens-q", "3,4", "--batch", "5"}, 2, {"--batch does not apply"}},
    {"paged_with_sk", C, {"--seq-layout", "paged", "--seqused-k", "5", "--sq", "1", "--sk", "9"}, 2, {"--sk does not apply"}},
    {"page_order_on_dense", C, {"--page-order", "7"}, 2, {"--page-order applies to --seq-layout paged"}},
    {"spare_pages_on_dense", C, {"--spare-pages", "2"}, 2, {"--spare-pages applies to --seq-layout paged"}},
    {"page_size_on_varlen", C, {"--seq-layout", "varlen", "--seqlens-q", "3", "--page-size", "32"}, 2, {"--page-size applies"}},
    {"tunable_twice", C, {"--kernel", "split-kv", "--tunable", "num_splits=3", "--tunable", "num_splits=4"}, 2, {"num_splits is given twice"}},
    {"seqlens_empty_item", C, {"--seq-layout", "varlen", "--seqlens-q", "3,,4"}, 2, {"--seqlens-q", "lengths"}},
    // item 11: case files with the new fields that disagree are corrupt
    {"replay_seq_q_disagrees", C, {"--replay", "@seq_q_disagrees"}, 2, {"seq-q.case", "seq_q = 9 disagrees"}},
    {"replay_strides_beside_sequences", C, {"--replay", "@strides_beside_sequences"}, 2, {"strides.case", "strides given beside"}},
    {"replay_dtype_alias", C, {"--replay", "@dtype_alias"}, 2, {"dtype-alias.case", "problem.dtype 'fp8' is unknown"}},
    // item 15: a seed is decimal or 0x hex, nothing else (and no octal: CLI11 reads 010 as 8)
    {"seed_hex_junk", C, {"--seed", "0xZZ"}, 2, {"--seed", "decimal or 0x hex"}},
    {"seed_hex_overflow", C, {"--seed", "0x10000000000000000"}, 2, {"--seed", "18446744073709551615"}},
    {"sq_leading_zero", C, {"--sq", "010"}, 2, {"--sq", "not an integer"}},
    // item 18: --tunable NAME says the real default
    {"tunable_unknown_says_default", C, {"--kernel", "split-kv", "--tunable", "foo"}, 2, {"num_splits (default 8; accepts 8, 1, 2"}},
};

void PrintTo(const BadInput& b, std::ostream* os) { *os << b.name; }

class BadInputs : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadInputs, RefusedWithExitCodeAndOneClearMessage) {
  const BadInput& b = GetParam();
  std::vector<std::string> args;
  const fs::path out = kTmp / "out" / b.name;
  fs::remove_all(out);
  if (b.tool == Tool::kProps && std::string(ATTN_PROPS).empty()) GTEST_SKIP() << "attn-props is not built";
  if (b.tool != Tool::kProps) args = {"--out", out.string()};  // attn-props: its -o is one of the inputs
  if (b.tool == Tool::kCheck) args.insert(args.end(), {"--backend", "cpu"});
  for (const auto& a : b.args) args.push_back(subst(a));
  const Outcome o = run(b.tool == Tool::kCheck ? ATTN_CHECK : b.tool == Tool::kFuzz ? ATTN_FUZZ : ATTN_PROPS, args,
                        b.timeout_s, b.env);
  std::string cmd = b.tool == Tool::kCheck ? "attn-check" : b.tool == Tool::kFuzz ? "attn-fuzz" : "attn-props";
  for (const auto& a : args) cmd += " '" + a + "'";
  ASSERT_NE(o.code, -2) << cmd << "\ndid not end within " << b.timeout_s << " s\n" << o.out;
  EXPECT_EQ(o.code, b.code) << cmd << "\n(signal " << o.signal << ")\n" << o.out;
  for (const auto& s : b.says)
    EXPECT_NE(o.out.find(s), std::string::npos) << cmd << "\nshould say '" << s << "'\n" << o.out;
  // One clear line: the tool's own prefix, no CLI11 "Run with --help" second line, no exception dump.
  EXPECT_NE(o.out.find(cmd.substr(0, cmd.find(' ')) + ": "), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("Run with --help"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("terminate called"), std::string::npos) << o.out;
}

INSTANTIATE_TEST_SUITE_P(Table, BadInputs, ::testing::ValuesIn(kTable),
                         [](const ::testing::TestParamInfo<BadInput>& i) {
                           return std::string(i.param.name);
                         });

// The good replay files of a mixed directory are still checked and pass (their output says so) even though
// the run ends with 2; a directory of only good files ends with 0.
TEST(BadInputsReplay, GoodFilesAloneExitZero) {
  const Inputs& in = inputs();
  const fs::path dir = input_dir() / "only-good";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(in.good_case, dir / "a.case");
  const Outcome o = run(ATTN_CHECK,
                        {"--out", (kTmp / "out" / "only-good").string(), "--backend", "cpu", "--replay",
                         dir.string(), "--kernel", "online-row"},
                        60);
  EXPECT_EQ(o.code, 0) << o.out;
  EXPECT_NE(o.out.find("all passed"), std::string::npos) << o.out;
}

}  // namespace

namespace {

std::string file_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Issue 27 item 15: a seed pasted from a report (seed=0x...) is taken, and is the same seed as its decimal.
TEST(GoodInputs, HexSeedsAreTakenWhereverASeedIs) {
  std::string reports[2];
  const char* seeds[2] = {"0xda8422cf30d8db53", "15745748470467189587"};
  for (int i = 0; i < 2; ++i) {
    const fs::path out = kTmp / "out" / ("hex-seed-" + std::to_string(i));
    fs::remove_all(out);
    const Outcome o = run(ATTN_CHECK,
                          {"--out", out.string(), "--backend", "cpu", "--kernel", "online-row", "--sq", "3", "--d",
                           "8", "--seed", seeds[i], "--order-seed", "0x2a", "--quiet"},
                          60);
    ASSERT_EQ(o.code, 0) << seeds[i] << "\n" << o.out;
    reports[i] = file_text(out / "report.json");
    EXPECT_NE(reports[i].find("0xda8422cf30d8db53"), std::string::npos) << reports[i];
  }
  if (std::string(ATTN_PROPS).empty()) return;
  const Outcome p = run(ATTN_PROPS, {"--seed", "0x10", "-n", "2", "-p", "oracle", "-k", "online-row", "-q",
                                     "-o", (kTmp / "out" / "props-hex").string()},
                        120);
  EXPECT_EQ(p.code, 0) << p.out;
}

// Issue 27 item 18: --list shows the Dv limit beside D (online-row: any D, Dv <= 256), not "any" for a kernel
// that refuses D = Dv = 100000.
TEST(GoodInputs, ListShowsTheDvLimit) {
  const Outcome l = run(ATTN_CHECK, {"--out", (kTmp / "out" / "list").string(), "--backend", "cpu", "--list"}, 60);
  ASSERT_EQ(l.code, 0) << l.out;
  const size_t row = l.out.find("\nonline-row ");
  ASSERT_NE(row, std::string::npos) << l.out;
  EXPECT_NE(l.out.substr(row, l.out.find('\n', row + 1) - row).find(" any/256 "), std::string::npos) << l.out;
}

}  // namespace
