// mps_test.cpp - attn-fuzz --mps without a GPU: the private daemon's start and stop (a stand-in control program),
// and the worker's suspect rule (a crash under MPS is not judged; re-run alone it is, and quarantines the kernel).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "fuzz/codec.h"
#include "fuzz/mps.h"
#include "fuzz/worker.h"

namespace attnfuzz::fuzz {
namespace {

namespace fs = std::filesystem;

fs::path fresh(const std::string& name) {
  const fs::path d = fs::path(TEST_TMP) / name;
  std::error_code ec;
  fs::remove_all(d, ec);
  fs::create_directories(d, ec);
  return d;
}

// A stand-in nvidia-cuda-mps-control: "-f" opens $CUDA_MPS_PIPE_DIRECTORY/control and runs until a client
// sends "quit" (or forever, with ignore_quit); it records its pid.
fs::path fake_control(const fs::path& dir, bool ignore_quit) {
  const fs::path bin = dir / "bin";
  fs::create_directories(bin);
  const fs::path exe = bin / "nvidia-cuda-mps-control";
  std::ofstream(exe) << "#!/bin/sh\n"
                        "P=\"$CUDA_MPS_PIPE_DIRECTORY\"\n"
                        "if [ \"$1\" = -f ]; then\n"
                        "  echo $$ > \"$P/../daemon.pid\"; touch \"$P/control\"\n"
                        "  while [ ! -e \"$P/quit\" ]; do sleep 0.05; done\n"
                     << (ignore_quit ? "  while :; do sleep 1; done\n" : "") <<
                        "  exit 0\n"
                        "fi\n"
                        "read cmd; [ \"$cmd\" = quit ] && touch \"$P/quit\"\n";
  fs::permissions(exe, fs::perms::owner_all);
  return bin;
}

struct PathGuard {
  std::string old;
  explicit PathGuard(const std::string& front) {
    const char* p = std::getenv("PATH");
    old = p ? p : "";
    ::setenv("PATH", (front + (old.empty() ? "" : ":" + old)).c_str(), 1);
  }
  ~PathGuard() { ::setenv("PATH", old.c_str(), 1); }
};

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

pid_t read_pid(const fs::path& f) {
  std::ifstream in(f);
  long p = 0;
  in >> p;
  return static_cast<pid_t>(p);
}

TEST(Mps, DaemonStartsForClientsAndStopsOnQuit) {
  const fs::path d = fresh("daemon");
  PathGuard path(fake_control(d, false).string());
  pid_t pid = 0;
  {
    MpsDaemon m(d / "mps");
    const auto env = m.client_env();
    ASSERT_EQ(env.size(), 2u);
    EXPECT_EQ(env[0].first, "CUDA_MPS_PIPE_DIRECTORY");
    EXPECT_EQ(env[0].second, (d / "mps" / "pipe").string());
    EXPECT_TRUE(fs::exists(d / "mps" / "pipe" / "control"));
    pid = read_pid(d / "mps" / "daemon.pid");
    ASSERT_GT(pid, 0);
    EXPECT_TRUE(alive(pid));
  }  // the destructor sends quit
  EXPECT_TRUE(fs::exists(d / "mps" / "pipe" / "quit"));  // it was asked, not killed
  EXPECT_FALSE(alive(pid));
}

TEST(Mps, DaemonThatIgnoresQuitIsKilled) {
  const fs::path d = fresh("stubborn");
  PathGuard path(fake_control(d, true).string());
  MpsDaemon m(d / "mps");
  const pid_t pid = read_pid(d / "mps" / "daemon.pid");
  ASSERT_GT(pid, 0);
  const auto t0 = std::chrono::steady_clock::now();
  m.stop(1);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_FALSE(alive(pid));
}

TEST(Mps, MissingControlProgramIsOneClearReason) {
  const fs::path d = fresh("missing");
  const char* old = std::getenv("PATH");
  const std::string keep = old ? old : "";
  ::setenv("PATH", (d / "nothing-here").c_str(), 1);
  try {
    MpsDaemon m(d / "mps", 5);
    ADD_FAILURE() << "started without nvidia-cuda-mps-control";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("nvidia-cuda-mps-control is not on PATH"), std::string::npos) << e.what();
  }
  ::setenv("PATH", keep.c_str(), 1);
}

// The worker side, on the cpu backend (the rule is about verdicts, not the device): a crash under MPS is left
// for a re-run alone; the re-run judges it, saves it and quarantines the kernel.
TEST(Mps, CrashUnderMpsIsASuspectAndItsRerunJudgesIt) {
  const fs::path d = fresh("worker");
  WorkerConfig cfg;
  cfg.kernels = "bad-segfault";
  cfg.backend = "cpu";
  cfg.plugins = {BAD_PLUGIN};
  cfg.isolate = "always";  // the segfault is a verdict of a forked launch, not this process's death
  cfg.reports = false;
  cfg.out = d.string();
  cfg.mps = true;
  FuzzInput in;
  in.the_case.problem = make_problem(1, 1, 1, 8, 8, 16, 16);
  {
    Worker w(cfg);
    const Worker::Outcome o = w.run(in);
    ASSERT_NE(o.kernel, nullptr);
    EXPECT_EQ(o.result.failure, FailureClass::kCrash);
    EXPECT_TRUE(o.suspect);
    const std::vector<uint8_t> bytes = encode(in, cfg.limits);
    save_mps_suspect(cfg, bytes.data(), bytes.size());
  }
  EXPECT_TRUE(!fs::exists(d / "failures") || fs::is_empty(d / "failures")) << "a suspect is not a failure";
  size_t suspects = 0;
  for (const auto& e : fs::directory_iterator(d / "work" / "mps-suspects")) suspects += e.is_regular_file();
  EXPECT_EQ(suspects, 1u);

  cfg.mps = false;  // what kMpsRecheckEnv makes of the configuration
  cfg.mps_recheck = true;
  cfg.plugins.clear();  // already loaded into this process
  {
    Worker w(cfg);
    const Worker::Outcome o = w.run(in);
    EXPECT_FALSE(o.suspect);
    EXPECT_EQ(o.result.failure, FailureClass::kCrash);
    EXPECT_FALSE(o.saved.empty());
  }
  std::ifstream q(d / "work" / "quarantine.txt");
  std::string line;
  std::getline(q, line);
  EXPECT_EQ(line, "bad-segfault");
}

}  // namespace
}  // namespace attnfuzz::fuzz
