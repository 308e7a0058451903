// adapter.h - the adapter backend of the device layer: an external process that runs kernels
// (adapters/PROTOCOL.md).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstring>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "attnfuzz/device.h"

namespace attnfuzz {

// Version of adapters/PROTOCOL.md this tool speaks (the hello messages carry it).
inline constexpr int kAdapterProtocolVersion = 1;

// One kernel as its adapter declared it.
struct AdapterKernel {
  std::string name, family, description;
  uint32_t dtypes = 0, masks = 0;
  int64_t max_head_dim = 0, max_head_dim_v = 0, head_dim_multiple = 1;
  bool gqa = true, dv_ne_d = true, lse = false, empty_keys = true, dynamic_check = false;
  bool backward = false;  // it takes backward runs ("backward": true)
  bool repro = false;     // it writes bug-report scripts ("repro": true; PROTOCOL.md "Bug reports")
  // Every new shape costs it a compilation ("recompiles_per_shape": true; PROTOCOL.md): attn-fuzz keeps a pool of
  // its compiled shapes (fuzz/shape_pool.h).
  bool recompiles_per_shape = false;
  // "data_variants": the variants (of sink, softcap, alibi, bias) its compiled code takes as data: the shape pool
  // leaves them out of a compiled shape (fuzz/shape_pool.h).
  uint32_t data_variants = 0;
  uint32_t variants = 0;  // "variants": ["mask-dense", "mask-bits", "block-sparse"] (custom masks; issue 28)
  uint32_t features = 0;  // "features": ["q-packed", "kv-packed", "seqused-k", "layout-variants"]: AF_FEATURE_*
  int32_t compute_model = AF_COMPUTE_UNFUSED;  // "compute_model": "fused" | "unfused" (default: unfused)
  // "score_add_in_dtype": true: in f16 / bf16 it takes bias + ALiBi as one term in the storage type (SDPA's float
  // attn_mask); AF_KERNEL_SCORE_ADD_IN_DTYPE.
  bool score_add_in_dtype = false;
  // "tunables": [{"name", "role": "kv_splits" | "other", "values": [default, ...], "description"}], at most
  // AF_MAX_TUNABLES: the integer knobs the tool may set per run ("problem"."tunables": {name: value}).
  struct Tunable {
    std::string name, description;
    int32_t role = AF_TUNABLE_OTHER;
    std::vector<int32_t> values;
  };
  std::vector<Tunable> tunables;
};

// Opened by open_device() when DeviceOptions::adapter_command is set. Starting it runs the handshake and
// registers the declared kernels in Registry::global() under Backend::kAdapter (throws DeviceError with a
// clear sentence when the command does not start or does not speak the protocol).
class AdapterDevice final : public Device {
 public:
  explicit AdapterDevice(const DeviceOptions& o);
  ~AdapterDevice() override;
  Backend backend() const override { return Backend::kAdapter; }
  std::string name() const override;
  void* alloc(size_t bytes) override;
  void free(void* p) override;
  void to_device(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void to_host(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void synchronize() override {}
  LaunchResult launch(const af_kernel& k, const af_problem& p, const af_buffers& b) override;
  DeviceCapabilities capabilities() const override { return {false, false}; }

  // Asks the adapter whether `kernel` runs p (kernels that declared "check": true). Empty = yes or no
  // answer (a broken adapter shows in the launch that follows).
  std::string remote_check(const std::string& kernel, const af_problem& p);
  // Times the child was started (1 + restarts).
  int starts() const { return starts_; }
  const std::vector<AdapterKernel>& declared() const { return declared_; }

  // A bug report (PROTOCOL.md "Bug reports"; attn-check --bug-report): the next launch of a kernel that
  // declared "repro" also asks its adapter to write dir/stem.py and dir/stem.npz from that very run, with
  // these f64 tensors (expected_* and bound_*: the oracle's values and per-element bounds) and comment lines
  // on top.
  struct ReproRequest {
    std::string dir, stem = "repro";
    std::vector<std::string> comment;
    struct Tensor {
      std::string name;
      std::vector<int64_t> shape;
      std::vector<double> data;
    };
    std::vector<Tensor> tensors;
    // A malformed case (docs/semantics.md "Malformed metadata"): its kind ("cu-k-decreasing"), the defect in words,
    // and whether a right answer exists (then `tensors` hold the well-formed reading's expected values and bounds;
    // else none: the script's contract is to raise).
    struct Malformed {
      std::string kind, defect;
      bool right_answer = false;
    };
    std::optional<Malformed> malformed;
  };
  void request_repro(ReproRequest r) { repro_ = std::move(r), repro_reply_ = {}; }
  // What the adapter answered to that request: the files it wrote, or why it wrote none.
  struct ReproReply {
    std::vector<std::string> files;
    std::string error;
  };
  const ReproReply& repro_reply() const { return repro_reply_; }

 private:
  using Json = nlohmann::ordered_json;
  using Clock = std::chrono::steady_clock;
  enum class Io { kOk, kEof, kTimeout, kBad };
  struct Piece {
    const void* data;
    size_t bytes;
  };
  std::string start();  // spawn (under a guardian) + hello; empty or why not
  void stop();          // end the adapter and every process it started, reap
  void register_kernels();
  bool compiles_per_shape(const std::string& kernel) const;  // its adapter declared "recompiles_per_shape"
  // A call's timeout: --timeout, or the longer of it and --compile-timeout for a call that compiles.
  double call_timeout_s(bool compiles) const;
  static std::vector<AdapterKernel> parse_kernels(const Json& list);
  static Json problem_json(const af_problem& p, const std::string& kernel);  // with the kernel's tunables
  // One tensor of a reply: where its elements go (strided like the problem's buffers).
  struct Expected {
    const char* name;
    int32_t dtype;
    int64_t n[4];   // [n0, n1, n2, n3] as sent; the last stride is 1
    int64_t st[3];  // element strides of n0, n1, n2 in dst
    void* dst;
    int rank = 4;   // the wire shape is the last `rank` of n (dsinks: [Hq])
  };
  // Sends a run request (header tensors + payload pieces) and stores the reply's tensors; the launch verdict.
  // secs: the launch's timeout; first_compile: it is a JIT kernel's first call at this problem (--compile-timeout).
  LaunchResult exchange(Json req, const std::vector<Piece>& payload, const std::vector<Expected>& want,
                        Clock::time_point t0, double secs, bool first_compile);
  Io send(const Json& header, const std::vector<Piece>& payload, Clock::time_point deadline);
  Io recv(Json& header, std::vector<unsigned char>& payload, Clock::time_point deadline,
          size_t max_payload = size_t{1} << 20);
  Io write_all(const void* data, size_t n, Clock::time_point deadline);
  Io read_all(void* data, size_t n, Clock::time_point deadline);
  std::string io_trouble(Io r);
  std::string exit_text();
  std::string stderr_tail();

  std::string command_, adapter_name_, bad_;
  off_t log_offset_ = 0;
  pid_t pid_ = -1;   // the adapter's guardian (its wait status is the adapter's)
  int life_ = -1;    // the guardian's lifeline (closing it ends the adapter)
  int log_fd_ = -1;  // the adapter's stderr log (an unlinked temporary file)
  int to_ = -1, from_ = -1, starts_ = 0;
  int64_t next_id_ = 0;
  std::vector<AdapterKernel> declared_;
  // The (kernel, pass, problem) runs of recompiles_per_shape kernels the current adapter process answered: the
  // problems it has compiled. Their next calls get --timeout, a new one --compile-timeout; cleared by stop().
  std::set<std::string> compiled_;
  std::map<void*, size_t> sizes_;
  std::optional<ReproRequest> repro_;  // for the next launch (request_repro)
  ReproReply repro_reply_;
};

}  // namespace attnfuzz
