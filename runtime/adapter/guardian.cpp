// guardian.cpp - see guardian.h. Everything after fork() in the child is async-signal-safe (the caller may
// be multi-threaded): raw system calls, no allocation, no stdio.
#include "runtime/adapter/guardian.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

extern char** environ;

namespace attnfuzz {
namespace {

struct LinuxDirent64 {
  ino64_t d_ino;
  off64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[];
};

bool is_number(const char* s) {
  if (!*s) return false;
  for (; *s; ++s)
    if (*s < '0' || *s > '9') return false;
  return true;
}

long to_long(const char* s) {
  long v = 0;
  for (; *s >= '0' && *s <= '9'; ++s) v = v * 10 + (*s - '0');
  return v;
}

void nap_ms(long ms) {
  timespec t{ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

// Calls f(name) for every entry of the directory `path` (getdents64: no allocation).
template <class F>
void each_entry(const char* path, F f) {
  const int d = ::open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0) return;
  alignas(8) char buf[8192];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, d, buf, sizeof buf);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      auto* e = reinterpret_cast<LinuxDirent64*>(buf + off);
      f(e->d_name);
      off += e->d_reclen;
    }
  }
  ::close(d);
}

// The parent pid in /proc/PID/stat ("pid (comm) state ppid ..."; comm may hold spaces and parentheses).
long parent_of(const char* pid) {
  char path[64] = "/proc/";
  std::strncat(path, pid, 20);
  std::strcat(path, "/stat");
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return -1;
  buf[n] = 0;
  char* close = std::strrchr(buf, ')');
  if (!close || close + 4 >= buf + n) return -1;
  return to_long(close + 4);  // ") S ppid"
}

// Kills every process whose parent is this one; returns how many it signalled.
int kill_children() {
  const long me = ::getpid();
  int n = 0;
  each_entry("/proc", [&](const char* name) {
    if (is_number(name) && parent_of(name) == me) {
      ::kill(static_cast<pid_t>(to_long(name)), SIGKILL);
      ++n;
    }
  });
  return n;
}

void default_signals() {
  for (int s = 1; s < NSIG; ++s)
    if (s != SIGKILL && s != SIGSTOP) ::signal(s, SIG_DFL);
  sigset_t all;
  sigemptyset(&all);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);
}

[[noreturn]] void guardian(int life, int in, int out, int err, const char* const* argv, char* const* envp) {
  const pid_t me = ::getpid();
  default_signals();
  // A terminal's signals are for attn-fuzz (which stops its adapters itself), not for this watch.
  for (int s : {SIGINT, SIGQUIT, SIGHUP, SIGTSTP, SIGTTIN, SIGTTOU}) ::signal(s, SIG_IGN);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  // Close what the caller marked close-on-exec (its other pipes, other guardians' lifelines): this process
  // never execs, and holding them would keep other pipes from ever reading EOF.
  int close_fds[1024];
  for (bool more = true; more;) {
    int n = 0;
    more = false;
    each_entry("/proc/self/fd", [&](const char* name) {
      if (!is_number(name)) return;
      const int fd = static_cast<int>(to_long(name));
      if (fd <= 2 || fd == life || fd == in || fd == out || fd == err) return;
      const int fl = ::fcntl(fd, F_GETFD);
      if (fl < 0 || !(fl & FD_CLOEXEC)) return;
      if (n < 1024) close_fds[n++] = fd;
      else more = true;
    });
    for (int i = 0; i < n; ++i) ::close(close_fds[i]);
  }
  const pid_t cmd = ::fork();
  if (cmd < 0) ::_exit(127);
  if (cmd == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the guardian itself killed: the shell goes too
    if (::getppid() != me) ::_exit(127);
    default_signals();
    if (in >= 0) ::dup2(in, 0);
    if (out >= 0) ::dup2(out, 1);
    if (err >= 0) ::dup2(err, 2);
    ::execve("/bin/sh", const_cast<char* const*>(argv), envp);
    ::_exit(127);
  }
  ::setpgid(cmd, cmd);
  for (int fd : {in, out, err})
    if (fd > 2) ::close(fd);
  // The caller's stdin / stdout / stderr are not held here (a reader of the caller's output sees its end when
  // the caller ends, not when this watch does).
  if (const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC); null >= 0) {
    for (int fd = 0; fd <= 2; ++fd) ::dup2(null, fd);
    if (null > 2) ::close(null);
  }
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, cmd, 0));
  int status = 0;
  bool ended = false;  // the shell ended by itself (its status is relayed)
  for (;;) {
    pollfd p[2] = {{life, POLLIN, 0}, {pidfd, POLLIN, 0}};
    const int r = ::poll(p, pidfd >= 0 ? 2 : 1, pidfd >= 0 ? 1000 : 20);
    if (r < 0 && errno != EINTR) break;
    char c;
    if (r > 0 && (p[0].revents & (POLLHUP | POLLERR | POLLNVAL) || ((p[0].revents & POLLIN) && ::read(life, &c, 1) <= 0)))
      break;  // the caller is gone, or wants the command ended
    pid_t w;
    while ((w = ::waitpid(-1, &status, WNOHANG)) > 0)
      if (w == cmd) ended = true;
    if (ended) break;
    if (w < 0 && errno == ECHILD) break;
  }
  // Everything goes: the command's group at once, then whatever is left, level by level (killing a child
  // reparents its children here), until there is no child to wait for.
  ::kill(-cmd, SIGKILL);
  if (!ended) ::kill(cmd, SIGKILL);
  for (int i = 0; i < 2000; ++i) {
    int st = 0;
    pid_t w;
    while ((w = ::waitpid(-1, &st, WNOHANG)) > 0)
      if (w == cmd) {
        if (!ended) status = st;
        ended = true;
      }
    if (w < 0 && errno == ECHILD) break;
    kill_children();
    nap_ms(i < 20 ? 1 : 5);
  }
  if (WIFSIGNALED(status) && ended) {
    const int sig = WTERMSIG(status);
    rlimit none{0, 0};
    ::setrlimit(RLIMIT_CORE, &none);
    ::prctl(PR_SET_DUMPABLE, 0);  // no core of this process (a core_pattern pipe ignores RLIMIT_CORE)
    ::signal(sig, SIG_DFL);
    ::kill(me, sig);
    ::_exit(128 + sig);
  }
  ::_exit(ended && WIFEXITED(status) ? WEXITSTATUS(status) : 0);
}

}  // namespace

GuardedChild spawn_guarded(const std::string& command, const std::vector<std::string>& env, int stdin_fd,
                           int stdout_fd, int stderr_fd) {
  // Everything the child needs is built here: after fork it may not allocate.
  std::vector<std::string> vars;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    bool replaced = false;
    for (const std::string& v : env)
      if (eq && v.compare(0, static_cast<size_t>(eq - *e) + 1, *e, static_cast<size_t>(eq - *e) + 1) == 0)
        replaced = true;
    if (!replaced) vars.emplace_back(*e);
  }
  for (const std::string& v : env) vars.push_back(v);
  std::vector<char*> envp;
  for (std::string& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::string sh = "sh", dash_c = "-c", cmd = command;
  char* argv[] = {sh.data(), dash_c.data(), cmd.data(), nullptr};

  GuardedChild c;
  int life[2];
  if (::pipe2(life, O_CLOEXEC) != 0) return c;
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(life[0]);
    ::close(life[1]);
    errno = e;
    return c;
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::close(life[1]);
    guardian(life[0], stdin_fd, stdout_fd, stderr_fd, argv, envp.data());
  }
  ::setpgid(pid, pid);  // (also done by the child: whichever runs first)
  ::close(life[0]);
  c.pid = pid;
  c.lifeline = life[1];
  return c;
}

int end_guarded(GuardedChild& c, double wait_s) {
  if (c.lifeline >= 0) ::close(c.lifeline);
  c.lifeline = -1;
  if (c.pid <= 0) return -1;
  int st = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  pid_t r = 0;
  while ((r = ::waitpid(c.pid, &st, WNOHANG)) == 0 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (r == 0) {
    ::kill(c.pid, SIGKILL);
    r = ::waitpid(c.pid, &st, 0);
  }
  c.pid = -1;
  return r > 0 ? st : -1;
}

}  // namespace attnfuzz
