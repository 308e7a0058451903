// time_to_detect.cpp - benchmark: seconds an attn-fuzz campaign (empty corpus, one worker) takes to find each
// planted bug.
//
// For every planted kernel and three libFuzzer seeds, runs the attn-fuzz binary on that kernel alone
// (--workers 1 --no-seeds, a fresh --out, default shapes and thread order) and watches <out>/failures/ for
// the first saved failure and the first one of the expected class (the class the campaign's classification
// gave is the file name's prefix). The expected class per kernel is read from kernels/planted/README.md's
// table (its "class" column), the table tests/check/planted_classify_test.cpp also follows. Prints name=value
// lines: per kernel the median over the seeds (a run that never got there counts as the cap, printed as
// ">CAP"). Usage: time_to_detect [--cap S] [--full] [--seeds N] [--kernel NAME] [--attn-fuzz PATH] [--plugin
// SO]
//                       [--table README.md]
// Default cap 6 s a run (about 4 minutes for 12 kernels x 3 seeds when every bug is slow; most are found in
// the first second); --full: cap 300 s.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

#ifndef PLANTED_README
#define PLANTED_README "kernels/planted/README.md"
#endif

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t`"), e = s.find_last_not_of(" \t`");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

struct Expected {
  std::string cls;    // the class's first word: "mask (fully masked row not 0)" is mask
  std::string dtype;  // the dtype the bug lives in ("online-row, f16" in the varies column), "" = f32
};

// kernel -> expected class and dtype, from the README's bug table rows "| `planted-x` | bug | varies | exposing |
// quiet | class | checker today |" (a "\|" inside a cell is a literal bar, not a column).
std::map<std::string, Expected> expected_classes(const std::string& path) {
  std::ifstream f(path);
  std::map<std::string, Expected> out;
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("| `planted-", 0) != 0) continue;
    for (size_t at; (at = line.find("\\|")) != std::string::npos;) line.replace(at, 2, "/");
    std::vector<std::string> cols;
    std::stringstream ss(line.substr(1));
    for (std::string c; std::getline(ss, c, '|');) cols.push_back(trim(c));
    if (cols.size() < 6) continue;
    Expected e;
    e.cls = cols[5].substr(0, cols[5].find(' '));
    for (const char* dt : {"bf16", "f16", "fp8-e4m3", "fp8-e5m2"})
      if (cols[2].find(std::string(", ") + dt) != std::string::npos) {
        e.dtype = dt;
        break;
      }
    out[cols[0]] = e;
  }
  return out;
}

struct Run {
  double first = -1, right = -1;  // seconds; -1 = not within the cap
};

// One campaign on one kernel; stops it as soon as a failure of the expected class is saved.
Run campaign(const std::string& bin, const std::string& plugin, const std::string& kernel, const Expected& want,
             int seed, double cap, const fs::path& out) {
  const std::string& cls = want.cls;
  fs::remove_all(out);
  fs::create_directories(out);
  const std::string log = (out.parent_path() / (out.filename().string() + ".log")).string();
  std::vector<std::string> args = {bin,
                                         "--kernel",
                                         kernel,
                                         "--plugin",
                                         plugin,
                                         "--workers",
                                         "1",
                                         "--no-seeds",
                                         "--max-time",
                                         std::to_string(static_cast<int>(cap) + 1),
                                         "--progress",
                                         "1000",
                                         "--fuzzer-arg",
                                         "-seed=" + std::to_string(seed),
                                         "--out",
                                         out.string()};
  if (!want.dtype.empty()) args.insert(args.end(), {"--dtype", want.dtype});  // a low-precision bug's own dtype
  const auto t0 = Clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    if (FILE* l = std::fopen(log.c_str(), "w")) {
      dup2(fileno(l), 1);
      dup2(fileno(l), 2);
    }
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  Run r;
  const fs::path failures = out / "failures";
  int status = 0;
  bool done = false;
  for (;;) {
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(failures, ec)) {
      if (e.path().extension() != ".case") continue;
      if (r.first < 0) r.first = t;
      if (r.right < 0 && e.path().filename().string().rfind(cls + "-", 0) == 0) r.right = t;
    }
    if (r.right >= 0 || t > cap) break;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      done = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!done) {
    kill(-pid, SIGKILL);  // the whole group: attn-fuzz, libFuzzer's fork-mode parent and its job
    waitpid(pid, &status, 0);
  }
  return r;
}

double median(std::vector<double> v, double cap) {
  for (double& x : v)
    if (x < 0) x = cap * 1000;  // not found: above any found time
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string fmt(double x, double cap) {
  char b[32];
  if (x > cap)
    std::snprintf(b, sizeof b, ">%g", cap);
  else
    std::snprintf(b, sizeof b, "%.2f", x);
  return b;
}

int usage(const std::string& why) {
  std::fprintf(stderr, "time_to_detect: %s\n", why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec).parent_path();
  std::string bin = (self / "../bin/attn-fuzz").string(),
              plugin = (self / "../lib/libattnfuzz_planted_cpu.so").string();
  std::string table = PLANTED_README, only;
  double cap = 6;
  int seeds = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--full") {
      cap = 300;
      continue;
    }
    if (i + 1 >= argc) return usage(a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--cap")
      cap = std::atof(v.c_str());
    else if (a == "--seeds")
      seeds = std::atoi(v.c_str());
    else if (a == "--kernel")
      only = v;
    else if (a == "--attn-fuzz")
      bin = v;
    else if (a == "--plugin")
      plugin = v;
    else if (a == "--table")
      table = v;
    else
      return usage("unknown argument " + a);
  }
  if (!(cap > 0) || seeds < 1) return usage("--cap > 0 and --seeds >= 1");
  if (!fs::exists(bin)) return usage("no attn-fuzz at " + bin + " (--attn-fuzz PATH)");
  if (!fs::exists(plugin)) return usage("no planted plug-in at " + plugin + " (--plugin SO)");
  const auto expected = expected_classes(table);
  if (expected.empty()) return usage("no planted-kernel rows in " + table + " (--table README.md)");
  char tmpl[] = "/tmp/time_to_detect.XXXXXX";
  if (!mkdtemp(tmpl)) return usage("cannot create a temporary directory");
  const fs::path dir = tmpl;
  std::printf("cap_s=%g\nseeds=%d\n", cap, seeds);
  int found = 0, right = 0, kernels = 0;
  for (const auto& [kernel, want] : expected) {
    if (!only.empty() && kernel != only) continue;
    ++kernels;
    std::vector<double> first, good;
    std::string per_seed;
    for (int s = 1; s <= seeds; ++s) {
      const Run r = campaign(bin, plugin, kernel, want, s, cap, dir / (kernel + "-" + std::to_string(s)));
      first.push_back(r.first);
      good.push_back(r.right);
      per_seed += (s > 1 ? "," : "") + fmt(r.right < 0 ? cap * 1000 : r.right, cap);
    }
    const double mf = median(first, cap), mr = median(good, cap);
    found += mf <= cap;
    right += mr <= cap;
    std::printf("%s_first_failure_s=%s\n", kernel.c_str(), fmt(mf, cap).c_str());
    std::printf("%s_right_class_s=%s  (class %s; seeds %s)\n", kernel.c_str(), fmt(mr, cap).c_str(),
                want.cls.c_str(), per_seed.c_str());
    std::fflush(stdout);
  }
  std::printf("kernels=%d\nfound_within_cap=%d\nright_class_within_cap=%d\n", kernels, found, right);
  fs::remove_all(dir, ec);
  return 0;
}
