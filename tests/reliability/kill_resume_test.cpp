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

// Waits (at most 60 s) until the campaign is where the kill must find it: its workers running, bad-segfault
// launched forked after it killed a worker (isolate.txt) and bad-spin quarantined after its hang.
bool in_flight(const fs::path& out) {
  for (int i = 0; i < 600; ++i) {
    if (!campaign_processes(out).empty() &&
        read_text(out / "work" / "isolate.txt").find("bad-segfault") != std::string::npos &&
        read_text(out / "work" / "quarantine.txt").find("bad-spin") != std::string::npos)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
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
  const bool ready = in_flight(out);  // a fixed 15 s before (about 5 s on a loaded 2-core machine)
  if (!ready) kill(pid, SIGKILL);
  ASSERT_TRUE(ready) << "the campaign's workers did not start, or no kernel was isolated and quarantined in 60 s";
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
  // The fork-mode scratch directories of the run (tmpfs: RAM); a SIGKILL leaves them, the resume removes them.
  std::vector<std::string> scratch;
  {
    std::ifstream f(out / "work" / "fork-scratch.txt");
    for (std::string l; std::getline(f, l);) scratch.push_back(l);
  }
  EXPECT_FALSE(scratch.empty());
  // Resume: the lock is free, everything is read back (at the start), nothing is skipped.
  const Outcome again =
      run(std::string(ATTN_FUZZ) + " --out " + out.string() + " --plugin " + BAD_PLUGIN +
          " --kernel 'online-row,bad-spin,bad-segfault' --workers 1 --timeout 3 --max-time 5");
  EXPECT_TRUE(again.rc == 0 || again.rc == 1) << again.rc;
  EXPECT_EQ(again.out.find("skipping"), std::string::npos);
  EXPECT_EQ(unreadable_cases(out), 0);
  EXPECT_TRUE(wait_gone(out, 15).empty());
  for (const std::string& d : scratch) EXPECT_FALSE(fs::exists(d)) << d << " outlived its campaign";
}

// Holds OUT/campaign.lock like a campaign's process would (an inherited descriptor), with `owner` written in
// it as the attn-fuzz pid, for `secs` seconds; returns once the lock is held.
pid_t hold_lock(const fs::path& out, pid_t owner, int secs) {
  int ready[2];
  if (pipe(ready) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open((out / "campaign.lock").c_str(), O_RDWR | O_CREAT, 0644);
    if (fd < 0 || flock(fd, LOCK_EX) != 0) _exit(1);
    const std::string me = std::to_string(owner ? owner : getpid()) + "\n";
    (void)!ftruncate(fd, 0);
    (void)!pwrite(fd, me.data(), me.size(), 0);
    (void)!write(ready[1], "x", 1);
    sleep(secs);
    _exit(0);
  }
  close(ready[1]);
  char c;
  (void)!read(ready[0], &c, 1);
  close(ready[0]);
  return pid;
}

// A pid that surely names no process: a child that has exited and been reaped.
pid_t dead_pid() {
  const pid_t p = fork();
  if (p == 0) _exit(0);
  waitpid(p, nullptr, 0);
  return p;
}

// kill -9 of attn-fuzz, then a resume at once: the killed campaign's processes still hold OUT's lock while
// the kernel tears them down (seen under load: Signals/KillResume/KILL refused the resume). A resume waits
// for the processes of a campaign whose attn-fuzz is gone, then runs.
TEST(SignalsResumeLock, ResumeWaitsForTheEndingProcessesOfAKilledCampaign) {
  const fs::path out = fresh("lock-dying");
  const pid_t holder = hold_lock(out, dead_pid(), 3);
  ASSERT_GT(holder, 0);
  const Outcome o = run(std::string(ATTN_FUZZ) + " --out " + out.string() +
                        " --kernel online-row --workers 1 --no-seeds --max-time 4");
  waitpid(holder, nullptr, 0);
  EXPECT_EQ(o.rc, 0);
  EXPECT_NE(o.out.find("is gone; waiting"), std::string::npos);
  EXPECT_NE(read_text(out / "summary.md").find("cases"), std::string::npos);
}

// While the campaign's own attn-fuzz still holds the lock, a second campaign is refused at once, naming it.
TEST(SignalsResumeLock, LiveCampaignRefusedAtOnce) {
  const fs::path out = fresh("lock-live");
  const pid_t holder = hold_lock(out, 0, 30);
  ASSERT_GT(holder, 0);
  const Outcome o = run(std::string(ATTN_FUZZ) + " --out " + out.string() + " --kernel online-row --max-time 4");
  kill(holder, SIGKILL);
  waitpid(holder, nullptr, 0);
  EXPECT_EQ(o.rc, 2);
  EXPECT_NE(o.out.find("in use by another campaign (attn-fuzz pid " + std::to_string(holder)), std::string::npos);
  EXPECT_EQ(o.out.find("is gone; waiting"), std::string::npos);
}

// Issue 27 item 14: a campaign killed outright leaves the inputs its fork-mode jobs found since their last merge in
// libFuzzer's fork scratch (C<job>/ directories, listed in work/fork-scratch.txt). The resume used to delete
// them; now they go into work/inputs (fuzzed again, and turned into corpus files) before the scratch is removed.
TEST(SignalsResumeLock, ResumeKeepsTheInputsAKilledCampaignsJobsHadNotMerged) {
  const fs::path out = fresh("salvage");
  const fs::path scratch = fresh("salvage-tmp") / ("libFuzzerTemp.FuzzWithFork" + std::to_string(dead_pid()) + ".dir");
  fs::create_directories(scratch / "C7");
  fs::create_directories(out / "work");
  const std::string bytes = "\x01\x02\x03 an input a killed job found";
  std::ofstream(scratch / "C7" / "0123456789abcdef0123456789abcdef01234567", std::ios::binary) << bytes;
  std::ofstream(out / "work" / "fork-scratch.txt") << scratch.string() << "\n";
  const Outcome o = run(std::string(ATTN_FUZZ) + " --out " + out.string() +
                        " --kernel online-row --workers 1 --no-seeds --max-time 4");
  EXPECT_EQ(o.rc, 0);
  EXPECT_FALSE(fs::exists(scratch)) << "the killed campaign's scratch was not removed";
  EXPECT_EQ(read_text(out / "work" / "inputs" / "0123456789abcdef0123456789abcdef01234567"), bytes);
}

INSTANTIATE_TEST_SUITE_P(Signals, KillResume, ::testing::Values(SIGINT, SIGTERM, SIGKILL),
                         [](const auto& info) { return std::string(sigabbrev_np(info.param)); });

}  // namespace
}  // namespace attnfuzz::reliability
