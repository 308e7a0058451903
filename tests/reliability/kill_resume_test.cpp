// kill_resume_test.cpp - SIGINT / SIGTERM / SIGKILL of a campaign, then resume: no process left behind, OUT
// intact and readable, the lock released; a second campaign on a locked OUT is refused with exit 2.
#include <gtest/gtest.h>

#include "tests/reliability/reliability_util.h"

namespace attnfuzz::reliability {
namespace {

// Starts attn-fuzz directly (no shell between: the signal reaches attn-fuzz itself).
pid_t start(const fs::path& out, const std::string& extra) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open((out.string() + ".log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    const std::string cmd = std::string("exec ") + ATTN_FUZZ + " --out " + out.string() + " " + extra;
    execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
    _exit(127);
  }
  return pid;
}

// Every .case file under OUT reads (failures and the corpus).
int unreadable_cases(const fs::path& out) {
  int bad = 0;
  for (const auto& e : fs::recursive_directory_iterator(out))
    if (e.path().extension() == ".case" && e.path().string().find("/work/") == std::string::npos) {
      try {
        read_corpus_file(e.path());
      } catch (const CorpusError& err) {
        ADD_FAILURE() << err.what();
        ++bad;
      }
    }
  return bad;
}

class KillResume : public ::testing::TestWithParam<int> {};

TEST_P(KillResume, NothingLeftBehindAndOutResumes) {
  const int sig = GetParam();
  const fs::path out = fresh(std::string("kill-") + sigabbrev_np(sig));
  // A healthy kernel, a spinning one (isolated launches in flight) and a crashing one (dead workers).
  const std::string args =
      std::string("--plugin ") + BAD_PLUGIN +
      " --kernel 'online-row,bad-spin,bad-segfault' --workers 2 --timeout 3 --max-time 0";
  const pid_t pid = start(out, args);
  std::this_thread::sleep_for(std::chrono::seconds(15));
  ASSERT_FALSE(campaign_processes(out).empty()) << "the campaign's workers did not start";
  // A second campaign on the same OUT is refused while this one runs.
  const Outcome second =
      run(std::string(ATTN_FUZZ) + " --out " + out.string() + " --kernel online-row --max-time 5");
  EXPECT_EQ(second.rc, 2);
  EXPECT_NE(second.out.find("in use by another campaign"), std::string::npos);
  kill(pid, sig);
  int st = 0;
  waitpid(pid, &st, 0);
  std::printf("%s\n", read_text(out.string() + ".log").c_str());
  if (sig == SIGKILL) {
    EXPECT_TRUE(WIFSIGNALED(st));
  } else {
    ASSERT_TRUE(WIFEXITED(st));
    EXPECT_TRUE(WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 1) << WEXITSTATUS(st);
    EXPECT_NE(read_text(out / "summary.md").find("(interrupted)"), std::string::npos);
  }
  const std::vector<pid_t> left = wait_gone(out, 15);
  EXPECT_TRUE(left.empty()) << left.size() << " process(es) outlived attn-fuzz, e.g. pid " << left.front();
  for (pid_t p : left) kill(p, SIGKILL);
  EXPECT_EQ(unreadable_cases(out), 0);
  // Resume: the lock is free, everything is read back, nothing is skipped.
  const Outcome again =
      run(std::string(ATTN_FUZZ) + " --out " + out.string() + " --plugin " + BAD_PLUGIN +
          " --kernel 'online-row,bad-spin,bad-segfault' --workers 1 --timeout 3 --max-time 10");
  EXPECT_TRUE(again.rc == 0 || again.rc == 1) << again.rc;
  EXPECT_EQ(again.out.find("skipping"), std::string::npos);
  EXPECT_EQ(unreadable_cases(out), 0);
  EXPECT_TRUE(wait_gone(out, 15).empty());
}

INSTANTIATE_TEST_SUITE_P(Signals, KillResume, ::testing::Values(SIGINT, SIGTERM, SIGKILL),
                         [](const auto& info) { return std::string(sigabbrev_np(info.param)); });

}  // namespace
}  // namespace attnfuzz::reliability
