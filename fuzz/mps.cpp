// mps.cpp - attn-fuzz --mps: starts, waits for and stops a private CUDA MPS control daemon (nvidia-cuda-mps-control).
#include "fuzz/mps.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>

namespace attnfuzz::fuzz {
namespace fs = std::filesystem;

namespace {

constexpr const char* kControl = "nvidia-cuda-mps-control";

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Starts the control program with the pipe / log directories set; in_fd becomes its stdin (-1: /dev/null).
// Its own process group, killed with attn-fuzz (PR_SET_PDEATHSIG); no descriptor of ours is inherited (the
// campaign lock must not outlive the campaign in a daemon).
pid_t start_control(const std::vector<std::string>& args, const fs::path& pipe_dir, const fs::path& log_dir,
                    const fs::path& out, int in_fd) {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) {
    if (pid > 0) ::setpgid(pid, pid);
    return pid;
  }
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);
  const int in = in_fd >= 0 ? in_fd : ::open("/dev/null", O_RDONLY);
  const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (in >= 0) ::dup2(in, 0);
  if (o >= 0) {
    ::dup2(o, 1);
    ::dup2(o, 2);
  }
  for (int fd = 3; fd < 1024; ++fd) ::close(fd);
  ::setenv("CUDA_MPS_PIPE_DIRECTORY", pipe_dir.c_str(), 1);
  ::setenv("CUDA_MPS_LOG_DIRECTORY", log_dir.c_str(), 1);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  std::fprintf(stderr, "cannot run %s: %s\n", argv[0], std::strerror(errno));
  ::_exit(127);
}

// Waits up to s seconds for pid; true when it ended (reaped).
bool wait_for(pid_t pid, double s, int* status = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    int st = 0;
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) {
      if (status) *status = st;
      return true;
    }
    if (since(t0) >= s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string last_line(const fs::path& p) {
  std::ifstream f(p);
  std::string line, last;
  while (std::getline(f, line))
    if (!line.empty()) last = line;
  return last;
}

// The MPS processes (control daemon, server) started with our pipe directory: their environment names it.
std::vector<pid_t> mps_processes(const fs::path& pipe_dir) {
  std::vector<pid_t> found;
  const std::string mark = "CUDA_MPS_PIPE_DIRECTORY=" + pipe_dir.string();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string n = e.path().filename().string();
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string comm;
    std::getline(std::ifstream(e.path() / "comm"), comm);
    if (comm.rfind("nvidia-cuda-mps", 0) != 0) continue;
    std::ifstream env(e.path() / "environ", std::ios::binary);
    for (std::string v; std::getline(env, v, '\0');)
      if (v == mark) {
        found.push_back(static_cast<pid_t>(std::stol(n)));
        break;
      }
  }
  return found;
}

}  // namespace

MpsDaemon::MpsDaemon(const fs::path& dir, double wait_s) : pipe_dir_(dir / "pipe"), log_dir_(dir / "log") {
  std::error_code ec;
  fs::create_directories(pipe_dir_, ec);
  fs::create_directories(log_dir_, ec);
  const fs::path out = dir / "control.out";
  pid_ = start_control({kControl, "-f"}, pipe_dir_, log_dir_, out, -1);
  if (pid_ < 0) throw std::runtime_error(std::string("--mps: cannot fork: ") + std::strerror(errno));
  const auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(pipe_dir_ / "control", ec)) {
    int st = 0;
    if (wait_for(pid_, 0, &st)) {
      pid_ = -1;
      std::string why = last_line(out);
      if (why.empty()) why = last_line(log_dir_ / "control.log");
      if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
        why = std::string(kControl) + " is not on PATH (it comes with the NVIDIA driver)";
      throw std::runtime_error("--mps: the MPS control daemon ended at start" + (why.empty() ? "" : ": " + why));
    }
    if (since(t0) > wait_s) {
      stop(2);
      throw std::runtime_error("--mps: the MPS control daemon did not open " + (pipe_dir_ / "control").string() +
                               " within " + std::to_string(static_cast<int>(wait_s)) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

MpsDaemon::~MpsDaemon() { stop(); }

std::vector<std::pair<std::string, std::string>> MpsDaemon::client_env() const {
  return {{"CUDA_MPS_PIPE_DIRECTORY", pipe_dir_.string()}, {"CUDA_MPS_LOG_DIRECTORY", log_dir_.string()}};
}

void MpsDaemon::stop(double grace_s) {
  if (pid_ < 0) return;
  int in[2];
  if (::pipe(in) == 0) {
    const pid_t q = start_control({kControl}, pipe_dir_, log_dir_, pipe_dir_.parent_path() / "control.out", in[0]);
    ::close(in[0]);
    (void)!::write(in[1], "quit\n", 5);
    ::close(in[1]);
    if (q > 0 && !wait_for(q, grace_s / 2)) {
      ::kill(-q, SIGKILL);
      wait_for(q, 1);
    }
  }
  // "quit" waits for the server to end; a server with a client left (or stuck recovering from a fault) may not.
  if (!wait_for(pid_, grace_s / 2)) {
    ::kill(-pid_, SIGKILL);
    wait_for(pid_, 2);
  }
  for (pid_t p : mps_processes(pipe_dir_)) ::kill(p, SIGKILL);  // a server that outlived its daemon
  pid_ = -1;
}

}  // namespace attnfuzz::fuzz
