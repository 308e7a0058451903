// guardian.h - start a command so that neither it nor anything it starts outlives the starting process.
//
// spawn_guarded() forks a guardian process (no exec: it runs async-signal-safe code only) that is a child
// subreaper (PR_SET_CHILD_SUBREAPER) in a process group of its own, and starts `sh -c COMMAND` under it in
// another group. The guardian watches a pipe whose only write end the caller holds (close-on-exec, so no
// program the caller runs inherits it): when that pipe closes (the caller closed it, exited, or was killed,
// even by SIGKILL) or the command's shell ends, the guardian kills the command's process group and then
// every descendant left (orphans are reparented to the guardian, whatever group or session they moved to),
// reaps them, and exits with the shell's status (the same exit code, or killed by the same signal), so the
// caller's waitpid() on the guardian reads the command's end as if the shell were its child.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace attnfuzz {

struct GuardedChild {
  pid_t pid = -1;    // the guardian: waitpid() it; its status is the command's
  int lifeline = -1;  // write end of the watched pipe: close it to end the command and all it started
};

// stdin_fd / stdout_fd / stderr_fd become the command's 0 / 1 / 2 (-1: inherited). `env`: "NAME=VALUE"
// entries set on top of the caller's environment. Returns pid -1 with errno set when fork or pipe fail.
GuardedChild spawn_guarded(const std::string& command, const std::vector<std::string>& env, int stdin_fd,
                           int stdout_fd, int stderr_fd);

// Closes the lifeline and waits for the guardian (up to `wait_s`, then SIGKILL of the guardian, whose
// command then dies by PR_SET_PDEATHSIG); returns the guardian's wait status, or -1 when it was reaped before.
int end_guarded(GuardedChild& c, double wait_s = 5);

}  // namespace attnfuzz
