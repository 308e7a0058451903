// mps.h - attn-fuzz --mps: a private CUDA MPS control daemon for one campaign, so its GPU workers share one server.
#pragma once

#include <filesystem>
#include <string>
#include <sys/types.h>
#include <utility>
#include <vector>

namespace attnfuzz::fuzz {

// Without MPS every worker process has its own CUDA context and the GPU time-slices between them; a case is a
// few tiny copies and launches, so 16 workers got what 8 got (issue 17). Under MPS their kernels and copies run
// concurrently. The price: a fatal GPU fault of one client is delivered to every client of that GPU, and a
// spinning kernel can starve the others. So under --mps a crash or hang verdict is only a suspect: the worker
// leaves the input in work/mps-suspects and ends, and the parent re-runs it alone, outside MPS (worker.h).
class MpsDaemon {
 public:
  // Starts `nvidia-cuda-mps-control -f` (found on PATH) with its pipe and log directories under dir, and waits
  // until it accepts clients. Throws std::runtime_error with a one-line reason when it cannot.
  explicit MpsDaemon(const std::filesystem::path& dir, double wait_s = 15);
  ~MpsDaemon();  // stop()
  MpsDaemon(const MpsDaemon&) = delete;
  MpsDaemon& operator=(const MpsDaemon&) = delete;
  // What a client process needs in its environment.
  std::vector<std::pair<std::string, std::string>> client_env() const;
  // "quit" through the control pipe; what is left of the daemon and its server after grace_s is killed.
  void stop(double grace_s = 10);

 private:
  std::filesystem::path pipe_dir_, log_dir_;
  pid_t pid_ = -1;
};

}  // namespace attnfuzz::fuzz
