// adapter_device.cpp - the adapter backend: kernels of an external process (adapters/PROTOCOL.md) as a
// device.
//
// --adapter CMD starts CMD (through /bin/sh -c) as a persistent child. At start-up it declares its kernels
// and what each supports; they join the registry as entries of the adapter backend (af_kernel tables
// filled from the handshake, dispatched by name). Memory is host memory. A launch sends the in-bounds
// elements of q, k, v (per the problem's strides, as contiguous [B, S, H, D], the stored elements of the
// problem's dtype: f32, f16, bf16, fp8) and writes the O (and f32 LSE) it receives into the output buffers at
// the problem's strides, still stored elements: the runner decodes them as for built-in kernels. A backward
// launch (kernels that declared "backward") also sends O, LSE and dO and receives dQ, dK, dV. A child that
// crashes, hangs or breaks the protocol costs one launch (crash / hang / launch-error) and is restarted for
// the next one.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "attnfuzz/problem.h"
#include "attnfuzz/registry.h"
#include "runtime/adapter/adapter.h"
#include "runtime/adapter/guardian.h"

namespace attnfuzz {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxHeaderBytes = 1 << 20;
constexpr size_t kMaxAdapterKernels = 64;
// The variants whose values protocol 1 carries (PROTOCOL.md "Variants"; dropout: "Dropout", the exported mask).
constexpr uint32_t kCarriedVariants =
    kScoreVariants | kMaskVariants | AF_VARIANT_HEAD_DESCALE | AF_VARIANT_DROPOUT | AF_VARIANT_KV_SHARED;
// The keep mask's and the sequence arrays' element types on the wire (not problem dtypes).
constexpr int32_t kWireU8 = -1;
constexpr int32_t kWireI32 = -2;
// The sequence layouts protocol 1 carries (PROTOCOL.md "Sequence layouts"): packed q, packed K/V, a used KV length;
// and "layout-variants": the kernel's sinks / softcap / ALiBi apply on them (their tensors travel as for dense runs).
constexpr uint32_t kCarriedFeatures =
    AF_FEATURE_Q_PACKED | AF_FEATURE_KV_PACKED | AF_FEATURE_SEQUSED_K | AF_FEATURE_LAYOUT_VARIANTS;

// ---- what the handshake declared, per kernel (process-wide: registry entries point at it) ----------
struct KernelSpec {
  std::string name, family, description;
  uint32_t dtypes = AF_SUPPORTS_F32, masks = AF_SUPPORTS_ALL_MASKS;
  int64_t max_head_dim = 0, max_head_dim_v = 0, head_dim_multiple = 1;
  bool gqa = true, dv_ne_d = true, lse = false, empty_keys = true, dynamic_check = false, backward = false;
  int32_t compute_model = AF_COMPUTE_UNFUSED;
  bool score_add_in_dtype = false;
  uint32_t variants = 0, features = 0;
  std::vector<AdapterKernel::Tunable> tunables;
  std::vector<af_tunable> table;  // the af_kernel view of `tunables` (names point into it)
};
std::mutex g_mu;
std::deque<KernelSpec> g_specs;        // slot -> spec; stable addresses (af_kernel.name points here)
std::map<std::string, size_t> g_slot;  // name -> slot
AdapterDevice* g_active = nullptr;     // the open adapter device (for kernels that ask it per problem)

int check_slot(size_t slot, const af_problem* p, char* why, size_t why_len) {
  KernelSpec s;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    s = g_specs[slot];
  }
  std::string reason;
  if (!s.gqa && p->heads_q != p->heads_kv)
    reason = "the adapter kernel does not support Hq != Hkv (GQA/MQA)";
  else if (s.head_dim_multiple > 1 &&
           (p->head_dim % s.head_dim_multiple || p->head_dim_v % s.head_dim_multiple))
    reason = "the adapter kernel needs D and Dv to be multiples of " + std::to_string(s.head_dim_multiple);
  else if (!s.empty_keys && p->seq_k == 0)
    reason = "the adapter kernel does not accept Sk = 0";
  else if (s.dynamic_check && g_active)
    reason = g_active->remote_check(s.name, *p);
  if (reason.empty()) return 0;
  if (why && why_len) std::snprintf(why, why_len, "%s", reason.c_str());
  return 1;
}
template <size_t I>
int check_trampoline(const af_problem* p, char* why, size_t n) {
  return check_slot(I, p, why, n);
}
template <size_t... I>
constexpr auto make_checks(std::index_sequence<I...>) {
  return std::array<int (*)(const af_problem*, char*, size_t), sizeof...(I)>{&check_trampoline<I>...};
}
const auto kChecks = make_checks(std::make_index_sequence<kMaxAdapterKernels>{});

// Never called: the adapter device dispatches by kernel name (the registry wants a launch function). The
// runner launches a backward pass through the table's launch_bwd, so its address tells the passes apart.
int launch_elsewhere(const af_problem*, const af_buffers*, void*) { return -1; }
int launch_bwd_elsewhere(const af_problem*, const af_buffers*, void*) { return -1; }

// dtype names on the wire (PROTOCOL.md): f32, f16, bf16, fp8_e4m3, fp8_e5m2.
std::string wire_dtype(int32_t dtype) {
  if (dtype == kWireU8) return "u8";
  if (dtype == kWireI32) return "i32";
  std::string s = dtype_name(dtype);
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}
std::optional<int32_t> parse_wire_dtype(std::string s) {
  for (char& c : s)
    if (c == '_') c = '-';
  return parse_dtype(s);
}

uint32_t feature_bit(const std::string& f) {
  if (f == "q-packed") return AF_FEATURE_Q_PACKED;
  if (f == "kv-packed") return AF_FEATURE_KV_PACKED;
  if (f == "seqused-k") return AF_FEATURE_SEQUSED_K;
  if (f == "layout-variants") return AF_FEATURE_LAYOUT_VARIANTS;
  return 0;
}

uint32_t mask_bit(const std::string& m) {
  if (m == "none") return AF_SUPPORTS_MASK_NONE;
  if (m == "causal-tl") return AF_SUPPORTS_CAUSAL_TL;
  if (m == "causal-br") return AF_SUPPORTS_CAUSAL_BR;
  if (m == "window-tl") return AF_SUPPORTS_WINDOW_TL;
  if (m == "window-br") return AF_SUPPORTS_WINDOW_BR;
  return 0;
}

std::string signal_text(int sig) {
  const char* d = sigabbrev_np(sig);
  return "signal " + std::to_string(sig) + (d ? std::string(" (SIG") + d + ")" : "");
}

std::string quote(const std::string& s) { return "'" + s + "'"; }

}  // namespace

// ---- the child process and its pipes -----------------------------------------------------------------

AdapterDevice::AdapterDevice(const DeviceOptions& o) : Device(o), command_(o.adapter_command) {
  if (command_.empty()) throw DeviceError("the adapter backend needs --adapter CMD");
  ::signal(SIGPIPE, SIG_IGN);  // a dead child is seen as EPIPE, not a signal that ends the tool
  std::string err = start();
  if (!err.empty()) {
    stop();
    throw DeviceError("adapter " + quote(command_) + ": " + err);
  }
  register_kernels();
  std::lock_guard<std::mutex> lk(g_mu);
  g_active = this;
}

AdapterDevice::~AdapterDevice() {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_active == this) g_active = nullptr;
  }
  if (pid_ > 0 && to_ >= 0) {  // a polite goodbye, then the group goes
    Json bye = {{"type", "bye"}};
    send(bye, {}, Clock::now() + std::chrono::milliseconds(200));
  }
  stop();
  for (auto& [p, n] : sizes_) std::free(p);
  if (log_fd_ >= 0) ::close(log_fd_);
}

std::string AdapterDevice::name() const {
  return "adapter " + quote(command_) + " (" + (adapter_name_.empty() ? "?" : adapter_name_) + ", protocol " +
         std::to_string(kAdapterProtocolVersion) +
         "; host memory: no guard zones, canaries, thread orders or sanitizers)";
}

void* AdapterDevice::alloc(size_t bytes) {
  void* p = std::malloc(std::max<size_t>(bytes, 1));
  if (!p) throw DeviceError("adapter backend: cannot allocate " + std::to_string(bytes) + " bytes");
  sizes_[p] = bytes;
  return p;
}
void AdapterDevice::free(void* p) {
  if (sizes_.erase(p)) std::free(p);
}

std::string AdapterDevice::start() {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return std::string("pipe: ") + std::strerror(errno);
  if (pipe2(out, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(in[0]);
    ::close(in[1]);
    return std::string("pipe: ") + std::strerror(e);
  }
  if (log_fd_ < 0) {  // the stderr log: unlinked at once, so no ending of this process leaves it behind
    const char* tmp = std::getenv("TMPDIR");
    std::string t = std::string(tmp && *tmp ? tmp : "/tmp") + "/attnfuzz-adapter-XXXXXX";
    std::vector<char> buf(t.begin(), t.end());
    buf.push_back(0);
    log_fd_ = mkostemp(buf.data(), O_CLOEXEC | O_APPEND);
    if (log_fd_ < 0) {
      const int e = errno;
      for (int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
      return std::string("cannot create its stderr log: ") + std::strerror(e);
    }
    ::unlink(buf.data());
  } else {
    (void)!::ftruncate(log_fd_, 0);
  }
  log_offset_ = 0;
  // The adapter runs under a guardian (runtime/adapter/guardian.h): when this process closes the lifeline,
  // exits or is killed (even by SIGKILL), the adapter and everything it started are killed.
  const GuardedChild c =
      spawn_guarded(command_, {"ATTNFUZZ_ADAPTER_PROTOCOL=" + std::to_string(kAdapterProtocolVersion)}, in[0],
                    out[1], log_fd_);
  const int fork_errno = errno;
  ::close(in[0]);
  ::close(out[1]);
  if (c.pid < 0) {
    ::close(in[1]);
    ::close(out[0]);
    return std::string("fork: ") + std::strerror(fork_errno);
  }
  pid_ = c.pid;
  life_ = c.lifeline;
  to_ = in[1];
  from_ = out[0];
  ::fcntl(to_, F_SETFL, ::fcntl(to_, F_GETFL) | O_NONBLOCK);
  ::fcntl(from_, F_SETFL, ::fcntl(from_, F_GETFL) | O_NONBLOCK);
  ++starts_;
  // Handshake: generous timeout (importing torch takes seconds).
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(std::max(120.0, opts_.timeout_s)));
  Json hello = {
      {"type", "hello"}, {"protocol", kAdapterProtocolVersion}, {"tool", "attn-fuzz " ATTNFUZZ_VERSION}};
  if (Io r = send(hello, {}, deadline); r != Io::kOk)
    return "the adapter did not read its hello: " + io_trouble(r);
  Json h;
  std::vector<unsigned char> payload;
  if (Io r = recv(h, payload, deadline); r != Io::kOk) return "no hello from the adapter: " + io_trouble(r);
  if (h.value("type", "") != "hello") return "expected a hello message, got " + h.dump().substr(0, 200);
  const int v = h.value("protocol", -1);
  if (v != kAdapterProtocolVersion)
    return "the adapter speaks protocol " + std::to_string(v) + "; this attn-fuzz speaks " +
           std::to_string(kAdapterProtocolVersion);
  try {
    adapter_name_ = h.value("name", "adapter");
    declared_ = parse_kernels(h.at("kernels"));
  } catch (const std::exception& e) {
    return std::string("bad kernel declaration: ") + e.what();
  }
  return {};
}

void AdapterDevice::stop() {
  if (to_ >= 0) ::close(to_);
  if (from_ >= 0) ::close(from_);
  to_ = from_ = -1;
  GuardedChild c{pid_, life_};  // the guardian kills the adapter's processes, all of them, and ends
  end_guarded(c);
  pid_ = -1;
  life_ = -1;
  compiled_.clear();  // a new process compiles again
}

std::string AdapterDevice::exit_text() {
  if (pid_ <= 0) return "the adapter is not running";
  int st = 0;
  pid_t r = 0;
  for (int i = 0; i < 100 && (r = ::waitpid(pid_, &st, WNOHANG)) == 0; ++i) ::usleep(10000);
  if (r != pid_) return "the adapter closed its pipes";
  pid_ = -1;  // reaped
  if (WIFSIGNALED(st)) return "the adapter was killed by " + signal_text(WTERMSIG(st));
  const int code = WEXITSTATUS(st);
  std::string t = "the adapter exited with status " + std::to_string(code);
  if (code > 128 && code < 128 + 65) t += " (a shell reporting " + signal_text(code - 128) + ")";
  return t;
}

std::string AdapterDevice::stderr_tail() {
  std::string s;
  const int fd = log_fd_;
  if (fd < 0) return s;
  struct stat stt {};
  ::fstat(fd, &stt);
  const off_t from = std::max<off_t>(log_offset_, stt.st_size - 1500);
  if (stt.st_size > from) {
    s.resize(static_cast<size_t>(stt.st_size - from));
    const ssize_t n = ::pread(fd, s.data(), s.size(), from);
    s.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  if (s.empty()) return s;
  for (char& c : s)
    if (c == '\n') c = '|';
  return "; its stderr ends: " + s;
}

std::string AdapterDevice::io_trouble(Io r) {
  switch (r) {
    case Io::kOk:
      return "ok";
    case Io::kTimeout:
      return "no answer in time";
    case Io::kEof:
      return exit_text() + stderr_tail();
    case Io::kBad:
      return bad_;
  }
  return "?";
}

AdapterDevice::Io AdapterDevice::write_all(const void* data, size_t n, Clock::time_point deadline) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n) {
    const ssize_t w = ::write(to_, p, n);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN) return Io::kEof;  // EPIPE: the child is gone
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Io::kTimeout;
    pollfd pf{to_, POLLOUT, 0};
    ::poll(&pf, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
  }
  return Io::kOk;
}

AdapterDevice::Io AdapterDevice::read_all(void* data, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<unsigned char*>(data);
  while (n) {
    const ssize_t r = ::read(from_, p, n);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return Io::kEof;
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return Io::kEof;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Io::kTimeout;
    pollfd pf{from_, POLLIN, 0};
    ::poll(&pf, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
  }
  return Io::kOk;
}

AdapterDevice::Io AdapterDevice::send(const Json& header, const std::vector<Piece>& payload,
                                      Clock::time_point deadline) {
  if (to_ < 0) return Io::kEof;
  const std::string h = header.dump();
  const uint32_t n = static_cast<uint32_t>(h.size());
  const unsigned char len[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                                static_cast<unsigned char>(n >> 16), static_cast<unsigned char>(n >> 24)};
  if (Io r = write_all(len, 4, deadline); r != Io::kOk) return r;
  if (Io r = write_all(h.data(), h.size(), deadline); r != Io::kOk) return r;
  for (const Piece& pc : payload)
    if (Io r = write_all(pc.data, pc.bytes, deadline); r != Io::kOk) return r;
  return Io::kOk;
}

AdapterDevice::Io AdapterDevice::recv(Json& header, std::vector<unsigned char>& payload,
                                      Clock::time_point deadline, size_t max_payload) {
  if (from_ < 0) return Io::kEof;
  unsigned char len[4];
  if (Io r = read_all(len, 4, deadline); r != Io::kOk) return r;
  const uint32_t n = len[0] | (len[1] << 8) | (len[2] << 16) | (static_cast<uint32_t>(len[3]) << 24);
  if (n == 0 || n > kMaxHeaderBytes) {
    bad_ = "protocol error: header length " + std::to_string(n) + " (1 to " +
           std::to_string(kMaxHeaderBytes) + " bytes; did the adapter print to stdout?)";
    return Io::kBad;
  }
  std::string h(n, '\0');
  if (Io r = read_all(h.data(), n, deadline); r != Io::kOk) {
    if (r == Io::kEof) {
      bad_ = "protocol error: truncated header (" + exit_text() + ")" + stderr_tail();
      return Io::kBad;
    }
    return r;
  }
  try {
    header = Json::parse(h);
  } catch (const std::exception&) {
    bad_ = "protocol error: the header is not JSON: " + h.substr(0, 120);
    return Io::kBad;
  }
  if (!header.is_object()) {
    bad_ = "protocol error: the header is not a JSON object";
    return Io::kBad;
  }
  int64_t bytes = 0;
  try {
    bytes = header.value("payload_bytes", int64_t{0});
  } catch (const std::exception&) {
    bad_ = "protocol error: payload_bytes is not an integer";
    return Io::kBad;
  }
  if (bytes < 0 || static_cast<uint64_t>(bytes) > max_payload) {
    bad_ = "protocol error: payload_bytes " + std::to_string(bytes) + " (expected at most " +
           std::to_string(max_payload) + ")";
    return Io::kBad;
  }
  payload.resize(static_cast<size_t>(bytes));
  if (Io r = read_all(payload.data(), payload.size(), deadline); r != Io::kOk) {
    if (r == Io::kEof) {
      bad_ = "protocol error: truncated payload (" + std::to_string(bytes) + " bytes announced; " +
             exit_text() + ")" + stderr_tail();
      return Io::kBad;
    }
    return r;
  }
  return Io::kOk;
}

// ---- kernels ---------------------------------------------------------------------------------------

namespace {
// A kernel's "tunables" (AdapterKernel::Tunable); throws with a sentence naming the kernel.
std::vector<AdapterKernel::Tunable> parse_tunables(const std::string& kernel, const Json& list) {
  auto bad = [&](const std::string& what) {
    return std::runtime_error("kernel " + kernel + ": tunables: " + what);
  };
  if (!list.is_array()) throw bad("an array of {name, role, values, description}");
  if (list.size() > AF_MAX_TUNABLES) throw bad("at most " + std::to_string(AF_MAX_TUNABLES));
  std::vector<AdapterKernel::Tunable> out;
  for (const Json& t : list) {
    if (!t.is_object() || !t.contains("name") || !t.at("name").is_string())
      throw bad("each needs a \"name\"");
    AdapterKernel::Tunable x;
    x.name = t.at("name").get<std::string>();
    if (x.name.empty() ||
        x.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") !=
            std::string::npos)
      throw bad("name '" + x.name + "' (letters, digits, '-' and '_')");
    for (const auto& e : out)
      if (e.name == x.name) throw bad("'" + x.name + "' is declared twice");
    x.description = t.value("description", std::string());
    const std::string role = t.value("role", std::string("other"));
    if (role == "kv_splits")
      x.role = AF_TUNABLE_KV_SPLITS;
    else if (role != "other")
      throw bad("'" + x.name + "': role is \"kv_splits\" or \"other\", not \"" + role + "\"");
    const Json v = t.value("values", Json());
    if (!v.is_array() || v.empty() || v.size() > AF_MAX_TUNABLE_VALUES)
      throw bad("'" + x.name + "': values is an array of 1.." + std::to_string(AF_MAX_TUNABLE_VALUES) +
                " integers >= 1, the default first");
    for (const Json& e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < 1 || e.get<int64_t>() > INT32_MAX)
        throw bad("'" + x.name + "': value " + e.dump() + " (integers >= 1)");
      x.values.push_back(static_cast<int32_t>(e.get<int64_t>()));
    }
    out.push_back(std::move(x));
  }
  return out;
}

// af_tunable entries over spec's tunables (their strings stay in spec).
void build_tunable_table(KernelSpec& spec) {
  spec.table.clear();
  for (const auto& t : spec.tunables) {
    af_tunable a{};
    a.name = t.name.c_str();
    a.description = t.description.c_str();
    a.role = t.role;
    a.n_values = static_cast<int32_t>(t.values.size());
    std::copy(t.values.begin(), t.values.end(), a.values);
    spec.table.push_back(a);
  }
}
}  // namespace

std::vector<AdapterKernel> AdapterDevice::parse_kernels(const Json& list) {
  if (!list.is_array() || list.empty()) throw std::runtime_error("'kernels' must be a non-empty array");
  if (list.size() > kMaxAdapterKernels)
    throw std::runtime_error("at most " + std::to_string(kMaxAdapterKernels) + " kernels per adapter");
  std::vector<AdapterKernel> out;
  for (const Json& k : list) {
    AdapterKernel a;
    a.name = k.at("name").get<std::string>();
    if (a.name.empty() || a.name.find_first_of(" \t\n,*?[]'\"") != std::string::npos)
      throw std::runtime_error("kernel name '" + a.name + "' (no spaces, commas, quotes or glob characters)");
    for (const AdapterKernel& earlier : out)
      if (earlier.name == a.name) throw std::runtime_error("kernel name '" + a.name + "' is declared twice");
    a.family = k.value("family", std::string("adapter"));
    a.description = k.value("description", std::string());
    a.dtypes = 0;
    for (const Json& d : k.value("dtypes", Json::array({"f32"}))) {
      auto dt = parse_wire_dtype(d.get<std::string>());
      if (!dt) throw std::runtime_error("kernel " + a.name + ": unknown dtype " + d.dump());
      a.dtypes |= 1u << *dt;
    }
    a.masks = 0;
    for (const Json& m :
         k.value("masks", Json::array({"none", "causal-tl", "causal-br", "window-tl", "window-br"}))) {
      const uint32_t bit = mask_bit(m.get<std::string>());
      if (!bit)
        throw std::runtime_error("kernel " + a.name + ": unknown mask " + m.dump() +
                                 " (none, causal-tl, causal-br, window-tl, window-br)");
      a.masks |= bit;
    }
    if (!a.masks) throw std::runtime_error("kernel " + a.name + ": supports no mask");
    a.gqa = k.value("gqa", true);
    a.dv_ne_d = k.value("dv_ne_d", true);
    a.lse = k.value("lse", false);
    a.empty_keys = k.value("empty_keys", true);
    a.dynamic_check = k.value("check", false);
    a.backward = k.value("backward", false);
    a.repro = k.value("repro", false);
    a.recompiles_per_shape = k.value("recompiles_per_shape", false);
    // The variants it applies (issue 28): the score variants and the custom masks, whose values the protocol
    // carries (PROTOCOL.md "Variants").
    for (const Json& v : k.value("variants", Json::array())) {
      uint32_t bit = 0;
      if (!v.is_string() || !parse_variant_names(v.get<std::string>(), bit).empty() || (bit & ~kCarriedVariants))
        throw std::runtime_error("kernel " + a.name + ": variants takes " + variant_names(kCarriedVariants) +
                                 " (any of them), not " + v.dump());
      a.variants |= bit;
    }
    for (const Json& v : k.value("data_variants", Json::array())) {
      uint32_t bit = 0;
      if (!v.is_string() || !parse_variant_names(v.get<std::string>(), bit).empty() || (bit & ~kScoreVariants) ||
          !(bit & a.variants))
        throw std::runtime_error("kernel " + a.name + ": data_variants takes those of its variants among " +
                                 variant_names(kScoreVariants) + ", not " + v.dump());
      a.data_variants |= bit;
    }
    // How its f16 / bf16 path computes (the bound follows it): "fused" (scores and softmax statistics in
    // fp32, P rounded before P.V: FlashAttention-style) or "unfused" (scores rounded to the storage type:
    // math-style, the default, whose bound is the wider one).
    const Json cm = k.value("compute_model", Json("unfused"));
    if (cm == "fused")
      a.compute_model = AF_COMPUTE_FUSED;
    else if (cm == "unfused")
      a.compute_model = AF_COMPUTE_UNFUSED;
    else
      throw std::runtime_error("kernel " + a.name + ": compute_model is \"fused\" or \"unfused\", not " +
                               cm.dump());
    a.score_add_in_dtype = k.value("score_add_in_dtype", false);
    // The dtypes its backward takes (optional; default f32 only, as before the key existed): the ABI's
    // AF_SUPPORTS_BWD bits beside the forward dtypes. f32, f16 and bf16 (the gradient oracle's dtypes).
    if (a.backward && k.contains("backward_dtypes")) {
      for (const Json& d : k.at("backward_dtypes")) {
        const auto dt = parse_wire_dtype(d.is_string() ? d.get<std::string>() : std::string());
        if (!dt || (*dt != AF_DTYPE_F32 && *dt != AF_DTYPE_F16 && *dt != AF_DTYPE_BF16))
          throw std::runtime_error("kernel " + a.name + ": backward_dtypes takes f32, f16, bf16, not " +
                                   d.dump());
        if (!(a.dtypes & (1u << *dt)))
          throw std::runtime_error("kernel " + a.name + ": backward dtype " + d.get<std::string>() +
                                   " is not one of its dtypes");
        if (*dt != AF_DTYPE_F32) a.dtypes |= AF_SUPPORTS_BWD(*dt);
      }
    }
    a.tunables = parse_tunables(a.name, k.value("tunables", Json::array()));
    // The sequence layouts it takes (PROTOCOL.md "Sequence layouts"); absent: dense batches only.
    for (const Json& f : k.value("features", Json::array())) {
      const uint32_t bit = feature_bit(f.is_string() ? f.get<std::string>() : std::string());
      if (!bit)
        throw std::runtime_error("kernel " + a.name +
                                 ": features takes q-packed, kv-packed, seqused-k, layout-variants, not " + f.dump());
      a.features |= bit;
    }
    a.max_head_dim = k.value("max_head_dim", int64_t{0});
    a.max_head_dim_v = k.value("max_head_dim_v", int64_t{0});
    a.head_dim_multiple = k.value("head_dim_multiple", int64_t{1});
    for (const auto& [key, v] : {std::pair<const char*, int64_t>{"max_head_dim", a.max_head_dim},
                                 {"max_head_dim_v", a.max_head_dim_v}})
      if (v < 0)
        throw std::runtime_error("kernel " + a.name + ": " + key + " " + std::to_string(v) +
                                 " (>= 0; 0 = no limit)");
    if (a.head_dim_multiple < 1)
      throw std::runtime_error("kernel " + a.name + ": head_dim_multiple " +
                               std::to_string(a.head_dim_multiple) + " (>= 1)");
    out.push_back(std::move(a));
  }
  return out;
}

void AdapterDevice::register_kernels() {
  Registry& reg = Registry::global();
  const std::string origin = "adapter " + quote(command_);
  std::vector<af_kernel> fresh;
  std::lock_guard<std::mutex> lk(g_mu);
  for (const AdapterKernel& a : declared_) {
    KernelSpec s;
    s.name = a.name;
    s.family = "adapter/" + a.family;
    s.description = a.description;
    s.dtypes = a.dtypes;  // protocol 1 carries every dtype of the ABI
    s.masks = a.masks;
    s.max_head_dim = a.max_head_dim;
    s.max_head_dim_v = a.max_head_dim_v;
    s.head_dim_multiple = a.head_dim_multiple;
    s.gqa = a.gqa;
    s.dv_ne_d = a.dv_ne_d;
    s.lse = a.lse;
    s.empty_keys = a.empty_keys;
    s.dynamic_check = a.dynamic_check;
    s.backward = a.backward;
    s.compute_model = a.compute_model;
    s.score_add_in_dtype = a.score_add_in_dtype;
    s.variants = a.variants;
    s.features = a.features & kCarriedFeatures;
    s.tunables = a.tunables;
    auto it = g_slot.find(a.name);
    if (it != g_slot.end()) {  // re-opened in this process (a restart, a second device): same entry
      KernelSpec& old = g_specs[it->second];
      // The registry's af_kernel points at the first declaration's tunable table: it stays (a re-open that
      // declares other tunables is refused, as the registry could not follow).
      if (old.table.size() != s.tunables.size())
        throw DeviceError("adapter kernel " + a.name + " re-declared with other tunables in one process");
      s.tunables = old.tunables;
      s.table = std::move(old.table);
      // The registry's af_kernel points at this entry's name, family and description too: they keep the first
      // declaration's strings (moving the new ones in freed a name longer than the short-string buffer under the
      // registry: garbage kernel names after a re-open, seen with torch_sdpa's kernels on the H200).
      std::string name, family, description;
      name.swap(old.name), family.swap(old.family), description.swap(old.description);
      old = std::move(s);
      old.name.swap(name), old.family.swap(family), old.description.swap(description);
      continue;
    }
    if (g_specs.size() >= kMaxAdapterKernels) throw DeviceError("too many adapter kernels in one process");
    g_slot[a.name] = g_specs.size();
    g_specs.push_back(s);
    KernelSpec& st = g_specs.back();
    build_tunable_table(st);
    af_kernel k{};
    k.name = st.name.c_str();
    k.family = st.family.c_str();
    k.description = st.description.c_str();
    k.dtypes = st.dtypes ? st.dtypes : 0x80000000u;  // nothing the tool can send: every case unsupported
    k.masks = st.masks;
    k.max_head_dim = st.max_head_dim;
    k.max_head_dim_v = st.max_head_dim_v;
    k.writes_lse = st.lse ? 1 : 0;
    k.needs_dv_eq_d = st.dv_ne_d ? 0 : 1;
    k.check_support = kChecks[g_specs.size() - 1];
    k.launch = launch_elsewhere;
    k.launch_bwd = st.backward ? launch_bwd_elsewhere : nullptr;  // the case model says which passes apply
    k.compute_model = st.compute_model;
    k.flags = st.score_add_in_dtype ? AF_KERNEL_SCORE_ADD_IN_DTYPE : 0;
    k.variants = st.variants;
    k.features = st.features;
    k.dropout_rngs = (st.variants & AF_VARIANT_DROPOUT) ? 1u << AF_DROPOUT_RNG_EXPORTED : 0;  // it sends its mask
    k.n_tunables = static_cast<int32_t>(st.table.size());
    k.tunables = st.table.empty() ? nullptr : st.table.data();
    fresh.push_back(k);
  }
  try {
    reg.add(Backend::kAdapter, fresh.data(), fresh.size(), origin);
  } catch (const std::exception& e) {
    throw DeviceError(e.what());
  }
}

Json AdapterDevice::problem_json(const af_problem& p, const std::string& kernel) {
  Json j;
  j["batch"] = p.batch;
  j["heads_q"] = p.heads_q;
  j["heads_kv"] = p.heads_kv;
  j["seq_q"] = p.seq_q;
  j["seq_k"] = p.seq_k;
  j["head_dim"] = p.head_dim;
  j["head_dim_v"] = p.head_dim_v;
  j["scale"] = static_cast<double>(p.scale);  // exact: every float is a double
  j["dtype"] = wire_dtype(p.dtype);
  j["mask"] = mask_to_string(p);
  j["mask_kind"] = p.mask_kind == AF_MASK_NONE ? "none" : p.mask_kind == AF_MASK_CAUSAL ? "causal" : "window";
  j["mask_align"] = p.mask_align == AF_ALIGN_BOTTOM_RIGHT ? "bottom-right" : "top-left";
  j["window_left"] = window_left(p);  // after normalising causal / none; -1 = unbounded
  j["window_right"] = window_right(p);
  j["diagonal_offset"] = mask_offset(p);
  // fp8: real q/k/v = stored * descale, stored O = fp8(O * o_scale); 1 for every other dtype. Exact as
  // doubles.
  j["q_descale"] = static_cast<double>(p.q_descale);
  j["k_descale"] = static_cast<double>(p.k_descale);
  j["v_descale"] = static_cast<double>(p.v_descale);
  j["o_scale"] = static_cast<double>(p.o_scale);
  j["pass"] = p.pass == AF_PASS_BACKWARD ? "bwd" : "fwd";  // of the launch, or of the check asked for
  if (p.q_layout != AF_SEQ_DENSE || p.kv_layout != AF_SEQ_DENSE || p.kv_capacity > 0) {  // "Sequence layouts"
    j["q_layout"] = p.q_layout == AF_SEQ_PACKED ? "packed" : "dense";
    j["kv_layout"] = p.kv_layout == AF_SEQ_PACKED ? "packed" : p.kv_layout == AF_SEQ_PAGED ? "paged" : "dense";
    j["total_q"] = p.total_q;
    j["total_k"] = p.total_k;
    j["kv_capacity"] = p.kv_capacity;
  }
  if (p.variants) {  // variants (issue 28): their tensors follow the run's others (PROTOCOL.md "Variants")
    Json v = Json::array();
    for (uint32_t bit = 1; bit <= AF_VARIANTS_KNOWN; bit <<= 1)
      if (p.variants & bit) v.push_back(variant_name(bit));
    j["variants"] = std::move(v);
    if (p.variants & AF_VARIANT_SOFTCAP) j["softcap"] = static_cast<double>(p.softcap);
    if (p.variants & AF_VARIANT_DROPOUT) {  // the kernel draws its own mask and sends it back (PROTOCOL.md "Dropout")
      j["dropout_p"] = static_cast<double>(p.dropout_p);
      j["dropout_seed"] = p.dropout_seed;
      j["dropout_offset"] = p.dropout_offset;
    }
    if (p.variants & AF_VARIANT_BLOCK_SPARSE) j["block_size"] = {p.block_q, p.block_k};
  }
  {  // the kernel's declared tunables, by name (0 in the problem = the default, values[0])
    std::lock_guard<std::mutex> lk(g_mu);
    const auto it = g_slot.find(kernel);
    if (it != g_slot.end() && !g_specs[it->second].tunables.empty()) {
      Json t = Json::object();
      const auto& decl = g_specs[it->second].tunables;
      for (size_t i = 0; i < decl.size(); ++i)
        t[decl[i].name] = p.tunables[i] > 0 ? p.tunables[i] : decl[i].values.front();
      j["tunables"] = std::move(t);
    }
  }
  return j;
}

bool AdapterDevice::compiles_per_shape(const std::string& kernel) const {
  return std::any_of(declared_.begin(), declared_.end(),
                     [&](const AdapterKernel& a) { return a.name == kernel && a.recompiles_per_shape; });
}

double AdapterDevice::call_timeout_s(bool compiles) const {
  return compiles ? std::max(opts_.timeout_s, opts_.compile_timeout_s) : opts_.timeout_s;
}

std::string AdapterDevice::remote_check(const std::string& kernel, const af_problem& p) {
  if (pid_ <= 0 && !start().empty()) return {};  // the launch will say what is wrong
  // An adapter may probe the library on zeros to answer (PROTOCOL.md "check"): for a kernel that compiles per shape
  // that probe compiles, so it gets --compile-timeout as a first run does.
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                           call_timeout_s(compiles_per_shape(kernel))));
  Json req = {
      {"type", "check"}, {"id", ++next_id_}, {"kernel", kernel}, {"problem", problem_json(p, kernel)}};
  Json h;
  std::vector<unsigned char> payload;
  if (send(req, {}, deadline) != Io::kOk || recv(h, payload, deadline, 0) != Io::kOk) {
    stop();  // the next launch restarts it and reports what happens then
    return {};
  }
  if (h.value("type", "") != "check" || !h.contains("supported")) {
    stop();
    return {};
  }
  if (h.value("supported", true)) return {};
  std::string why = h.value("reason", std::string("refused by the adapter"));
  return why.empty() ? "refused by the adapter" : why;
}

// ---- launch ----------------------------------------------------------------------------------------

namespace {
// Bytes of one stored element of the dtypes protocol 1 carries (f32, f16, bf16, fp8); 0 = not carried.
size_t carried_bytes(int32_t dtype) {
  switch (dtype) {
    case AF_DTYPE_F32:
    case kWireI32:
      return 4;
    case AF_DTYPE_F16:
    case AF_DTYPE_BF16:
      return 2;
    case AF_DTYPE_FP8_E4M3:
    case AF_DTYPE_FP8_E5M2:
    case kWireU8:
      return 1;
    default:
      return 0;
  }
}
// The in-bounds elements of a strided [n0, n1, n2, n3] tensor (last stride 1), as contiguous bytes.
std::vector<unsigned char> gather(const void* base, size_t eb, const int64_t* st, int64_t n0, int64_t n1,
                                  int64_t n2, int64_t n3) {
  std::vector<unsigned char> out(static_cast<size_t>(n0 * n1 * n2 * n3) * eb);
  const auto* src = static_cast<const unsigned char*>(base);
  unsigned char* d = out.data();
  const size_t row = static_cast<size_t>(n3) * eb;
  for (int64_t a = 0; a < n0; ++a)
    for (int64_t b = 0; b < n1; ++b)
      for (int64_t c = 0; c < n2; ++c, d += row)
        if (row) std::memcpy(d, src + static_cast<size_t>(a * st[0] + b * st[1] + c * st[2]) * eb, row);
  return out;
}
// Calls f(element offset) for every element of a [n0, n1, n2, n3] tensor with element strides st, in order (a
// stride may be 0: the bias's broadcast dimensions).
template <class F>
void for_each_strided(const int64_t* st, const std::vector<int64_t>& n, F f) {
  for (int64_t a = 0; a < n[0]; ++a)
    for (int64_t b = 0; b < n[1]; ++b)
      for (int64_t c = 0; c < n[2]; ++c)
        for (int64_t d = 0; d < n[3]; ++d) f(a * st[0] + b * st[1] + c * st[2] + d * st[3]);
}
std::string shape_text(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}
}  // namespace

LaunchResult AdapterDevice::launch(const af_kernel& k, const af_problem& p, const af_buffers& b) {
  const auto t0 = Clock::now();
  const bool backward = k.launch == launch_bwd_elsewhere;  // the runner hands us the kernel's launch_bwd
  const size_t eb = carried_bytes(p.dtype);
  if (!eb) {
    LaunchResult res;
    res.status = LaunchStatus::kLaunchError;
    res.message = std::string("adapter backend: dtype ") + dtype_name(p.dtype) +
                  " is not carried by protocol 1 (f32, f16, bf16, fp8-e4m3, fp8-e5m2)";
    return res;
  }
  const int64_t B = p.batch, Hq = p.heads_q, Hk = p.heads_kv, Sq = p.seq_q, Sk = p.seq_k, D = p.head_dim,
                Dv = p.head_dim_v;
  const std::string wire = wire_dtype(p.dtype);
  auto desc = [&](const char* name, const std::string& dt, std::vector<int64_t> shape) {
    return Json{{"name", name}, {"dtype", dt}, {"shape", shape}};
  };
  if (p.kv_layout == AF_SEQ_PAGED) {  // no kernel can declare it (kCarriedFeatures): said, not sent
    LaunchResult res;
    res.status = LaunchStatus::kLaunchError;
    res.message = "adapter backend: paged K/V is not carried by protocol 1";
    return res;
  }
  // q, k, v in the problem's dtype (the stored elements, bit for bit), as contiguous [B, S, H, D], or [total, H, D]
  // when packed (PROTOCOL.md "Sequence layouts": row cu_seqlens[b] + t is token t of sequence b).
  const bool q_packed = p.q_layout == AF_SEQ_PACKED, kv_packed = p.kv_layout == AF_SEQ_PACKED;
  std::vector<std::vector<unsigned char>> blobs;
  Json tensors = Json::array();
  auto add_seq = [&](const char* name, const void* base, const int64_t* st, bool packed, int64_t total, int64_t S,
                     int64_t H, int64_t d) {
    const int64_t row[3] = {0, st[1], st[2]};
    blobs.push_back(packed ? gather(base, eb, row, 1, total, H, d) : gather(base, eb, st, B, S, H, d));
    tensors.push_back(packed ? desc(name, wire, {total, H, d}) : desc(name, wire, {B, S, H, d}));
  };
  add_seq("q", b.q, p.q_stride, q_packed, p.total_q, Sq, Hq, D);
  add_seq("k", b.k, p.k_stride, kv_packed, p.total_k, Sk, Hk, D);
  if (!kv_shared(p))  // kv-shared (MLA's latent): no v, the adapter takes V as the view k[..., :Dv] (PROTOCOL.md)
    add_seq("v", b.v, p.v_stride, kv_packed, p.total_k, Sk, Hk, Dv);
  auto add_i32 = [&](const char* name, const int32_t* a, int64_t n) {  // cu_seqlens_q / _k [B + 1], seqused_k [B]
    if (!a) return;
    const int64_t st[3] = {0, 0, 0};
    blobs.push_back(gather(a, 4, st, 1, 1, 1, n));
    tensors.push_back(desc(name, "i32", {n}));
  };
  if (q_packed) add_i32("cu_seqlens_q", b.cu_seqlens_q, B + 1);
  if (kv_packed) add_i32("cu_seqlens_k", b.cu_seqlens_k, B + 1);
  add_i32("seqused_k", b.seqused_k, B);
  std::vector<Expected> want;
  const bool want_lse = !backward && k.writes_lse && b.lse;
  std::vector<float> lse_rows;  // packed q: the reply's [B, Hq, max Sq] LSE, whose rows past a sequence stay canaries
  if (backward) {  // + the forward it is given (O in the dtype, LSE f32) and dO; dQ, dK, dV come back
    const int64_t one[3] = {p.lse_stride[0], p.lse_stride[1], p.lse_stride[2]};
    blobs.push_back(gather(b.o, eb, p.o_stride, B, Sq, Hq, Dv));
    blobs.push_back(gather(b.lse, 4, one, B, Hq, Sq, 1));
    blobs.push_back(gather(b.dout, eb, p.do_stride, B, Sq, Hq, Dv));
    tensors.push_back(desc("o", wire, {B, Sq, Hq, Dv}));
    tensors.push_back(desc("lse", "f32", {B, Hq, Sq}));
    tensors.push_back(desc("do", wire, {B, Sq, Hq, Dv}));
    want.push_back({"dq", p.dtype, {B, Sq, Hq, D}, {p.dq_stride[0], p.dq_stride[1], p.dq_stride[2]}, b.dq});
    want.push_back({"dk", p.dtype, {B, Sk, Hk, D}, {p.dk_stride[0], p.dk_stride[1], p.dk_stride[2]}, b.dk});
    want.push_back({"dv", p.dtype, {B, Sk, Hk, Dv}, {p.dv_stride[0], p.dv_stride[1], p.dv_stride[2]}, b.dv});
  } else if (q_packed) {  // O [total_q, Hq, Dv] like q; LSE scattered per sequence after the exchange
    want.push_back({"o", p.dtype, {1, p.total_q, Hq, Dv}, {0, p.o_stride[1], p.o_stride[2]}, b.o, 3});
    if (want_lse) {
      lse_rows.assign(static_cast<size_t>(B * Hq * Sq), 0.0f);
      want.push_back({"lse", AF_DTYPE_F32, {B, Hq, Sq, 1}, {Hq * Sq, Sq, 1}, lse_rows.data()});
    }
  } else {
    want.push_back({"o", p.dtype, {B, Sq, Hq, Dv}, {p.o_stride[0], p.o_stride[1], p.o_stride[2]}, b.o});
    if (want_lse)
      want.push_back(
          {"lse", AF_DTYPE_F32, {B, Hq, Sq, 1}, {p.lse_stride[0], p.lse_stride[1], p.lse_stride[2]}, b.lse});
  }
  // Custom masks: contiguous copies [B|1, Hq|1, rows|1, row bytes] (u8; a broadcast dimension has size 1).
  auto add_mask = [&](const char* name, const uint8_t* m, const int64_t* st, int64_t rows, int64_t row) {
    const int64_t nb = st[0] ? B : 1, nh = st[1] ? Hq : 1, ni = st[2] ? rows : std::min<int64_t>(rows, 1);
    blobs.push_back(gather(m, 1, st, nb, nh, ni, row));
    tensors.push_back(desc(name, "u8", {nb, nh, ni, row}));
  };
  if (p.variants & (AF_VARIANT_MASK_DENSE | AF_VARIANT_MASK_BITS))
    add_mask("custom_mask", b.custom_mask, p.mask_stride, Sq, custom_mask_row_bytes(p));
  if (p.variants & AF_VARIANT_BLOCK_SPARSE)
    add_mask("block_mask", b.block_mask, p.block_mask_stride, query_blocks(p), key_blocks(p));
  // Per-head fp8 descales: f32 [B|1, Hq] (q) and [B|1, Hkv] (k, v), batch size 1 when broadcast over the
  // batch.
  if (p.variants & AF_VARIANT_HEAD_DESCALE) {
    const int64_t nb = p.descale_stride[0] ? B : 1, st[3] = {p.descale_stride[0], p.descale_stride[1], 0};
    for (const auto& [name, d, heads] :
         {std::tuple{"q_descale", b.q_descale_h, Hq}, std::tuple{"k_descale", b.k_descale_h, Hk},
          std::tuple{"v_descale", b.v_descale_h, Hk}}) {
      blobs.push_back(gather(d, 4, st, nb, heads, 1, 1));
      tensors.push_back(desc(name, "f32", {nb, heads}));
    }
  }
  // Score variants: sinks and ALiBi slopes f32 [Hq]; the bias f32 [B|1, Hq|1, Sq|1, Sk|1] (a broadcast dimension
  // has size 1); backward: d sinks [Hq] and d bias in the bias's shape come back with dQ, dK, dV.
  auto add_f32 = [&](const char* name, const float* x, const int64_t* st, std::vector<int64_t> n, size_t rank) {
    std::vector<unsigned char> out(static_cast<size_t>(n[0] * n[1] * n[2] * n[3]) * 4);
    auto* d = reinterpret_cast<float*>(out.data());
    for_each_strided(st, n, [&](int64_t e) { *d++ = x[e]; });
    blobs.push_back(std::move(out));
    tensors.push_back(desc(name, "f32", std::vector<int64_t>(n.end() - static_cast<std::ptrdiff_t>(rank), n.end())));
  };
  const int64_t head[4] = {0, 0, 0, 1};
  if (p.variants & AF_VARIANT_SINK) add_f32("sinks", b.sinks, head, {1, 1, 1, Hq}, 1);
  if (p.variants & AF_VARIANT_ALIBI) add_f32("alibi_slopes", b.alibi_slopes, head, {1, 1, 1, Hq}, 1);
  const std::vector<int64_t> bias_n = {p.bias_stride[0] ? B : 1, p.bias_stride[1] ? Hq : 1,
                                       p.bias_stride[2] ? Sq : 1, p.bias_stride[3] ? Sk : 1};
  if ((p.variants & AF_VARIANT_BIAS) && bias_elements(p) > 0) add_f32("bias", b.bias, p.bias_stride, bias_n, 4);
  // Dropout: the keep mask the kernel used, u8 [B, Hq, Sq, Sk] (1 kept, 0 dropped), into buffers.dropout_mask.
  if ((p.variants & AF_VARIANT_DROPOUT) && (b.dropout_mask || B * Hq * Sq * Sk == 0))  // empty: no buffer, 0 bytes
    want.push_back({"dropout_mask", kWireU8, {B, Hq, Sq, Sk},
                    {p.dropout_mask_stride[0], p.dropout_mask_stride[1], p.dropout_mask_stride[2]}, b.dropout_mask});
  std::vector<float> dbias;  // the reply's contiguous d bias, scattered into buffers.dbias after the exchange
  if (backward && (p.variants & AF_VARIANT_SINK) && b.dsinks)
    want.push_back({"dsinks", AF_DTYPE_F32, {1, 1, 1, Hq}, {0, 0, 0}, b.dsinks, 1});
  if (backward && (p.variants & AF_VARIANT_BIAS) && b.dbias && bias_elements(p) > 0) {
    dbias.assign(static_cast<size_t>(bias_n[0] * bias_n[1] * bias_n[2] * bias_n[3]), 0.0f);
    want.push_back({"dbias", AF_DTYPE_F32, {bias_n[0], bias_n[1], bias_n[2], bias_n[3]},
                    {bias_n[1] * bias_n[2] * bias_n[3], bias_n[2] * bias_n[3], bias_n[3]}, dbias.data()});
  }
  Json req;
  req["type"] = "run";
  req["id"] = 0;  // exchange() numbers it
  req["kernel"] = k.name;
  req["pass"] = backward ? "bwd" : "fwd";
  req["problem"] = problem_json(p, k.name);
  req["want_lse"] = want_lse;
  // A bug report: after the run's tensors, the expected values and bounds (f64) the adapter's script compares
  // with.
  std::vector<const ReproRequest::Tensor*> extra;
  if (repro_) {
    const auto it = std::find_if(declared_.begin(), declared_.end(),
                                 [&](const AdapterKernel& a) { return a.name == k.name; });
    if (it != declared_.end() && it->repro) {
      req["repro"] = {{"dir", repro_->dir}, {"stem", repro_->stem}, {"comment", repro_->comment}};
      if (const auto& m = repro_->malformed)
        req["repro"]["malformed"] = {{"kind", m->kind}, {"defect", m->defect}, {"right_answer", m->right_answer}};
      for (const auto& t : repro_->tensors) {
        tensors.push_back(desc(t.name.c_str(), "f64", t.shape));
        extra.push_back(&t);
      }
    } else {
      repro_reply_.error = "kernel " + std::string(k.name) +
                           " does not write bug-report scripts (its adapter " +
                           "declares no \"repro\": adapters/PROTOCOL.md \"Bug reports\")";
    }
  }
  req["tensors"] = std::move(tensors);
  size_t bytes = 0;
  std::vector<Piece> pieces;
  for (const auto& bl : blobs) {
    pieces.push_back({bl.data(), bl.size()});
    bytes += bl.size();
  }
  for (const auto* t : extra) {
    pieces.push_back({t->data.data(), t->data.size() * sizeof(double)});
    bytes += t->data.size() * sizeof(double);
  }
  req["payload_bytes"] = bytes;
  const bool asked = req.contains("repro");
  std::optional<ReproRequest> keep = std::move(repro_);  // the tensors stay alive through the exchange
  repro_.reset();                                        // one launch only
  // A kernel that compiles per problem (its adapter's "recompiles_per_shape") gets --compile-timeout for the first
  // call at a problem this adapter process has not answered: under load a compilation outlasts --timeout, and a
  // correct kernel must not be called a hang for it.
  const bool jit = compiles_per_shape(k.name);
  const std::string problem_key = std::string(k.name) + " " + req["pass"].get<std::string>() + " " +
                                  req["problem"].dump();
  const double secs = call_timeout_s(jit && !compiled_.count(problem_key));
  LaunchResult res = exchange(std::move(req), pieces, want, t0, secs, secs > opts_.timeout_s);
  if (jit && res.status == LaunchStatus::kOk) compiled_.insert(problem_key);
  if (asked && repro_reply_.files.empty() && repro_reply_.error.empty())
    repro_reply_.error = res.status == LaunchStatus::kOk ? "the adapter's result carried no \"repro\" answer"
                                                         : "the run did not complete: " + res.message;
  if (!lse_rows.empty() && res.status == LaunchStatus::kOk)  // rows t < Sq_b of each sequence; the rest untouched
    for (int64_t bb = 0; bb < B; ++bb) {
      // Sq_b from the array as sent: a malformed cu_seqlens_q (docs/semantics.md "Malformed metadata") may name a
      // negative or a too long sequence, so the rows stay within the reply's [0, max Sq).
      const int64_t rows = std::clamp<int64_t>(int64_t{b.cu_seqlens_q[bb + 1]} - b.cu_seqlens_q[bb], 0, Sq);
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t t = 0; t < rows; ++t)
          b.lse[bb * p.lse_stride[0] + h * p.lse_stride[1] + t * p.lse_stride[2]] = lse_rows[(bb * Hq + h) * Sq + t];
    }
  if (!dbias.empty() && res.status == LaunchStatus::kOk) {
    const float* d = dbias.data();
    for_each_strided(p.bias_stride, bias_n, [&](int64_t e) { b.dbias[e] = *d++; });
  }
  return res;
}

LaunchResult AdapterDevice::exchange(Json req, const std::vector<Piece>& payload_out,
                                     const std::vector<Expected>& want, Clock::time_point t0, double secs,
                                     bool first_compile) {
  LaunchResult res;
  auto done = [&](LaunchStatus st, std::string msg, bool restart) {
    if (restart) stop();
    res.status = st;
    res.message = std::move(msg);
    res.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    return res;
  };
  if (pid_ <= 0) {
    if (std::string err = start(); !err.empty())
      return done(LaunchStatus::kLaunchError, "the adapter could not be restarted: " + err, true);
  }
  {  // a log that grows without bound is cut (the child appends)
    struct stat st {};
    if (log_fd_ >= 0 && ::fstat(log_fd_, &st) == 0) {
      if (st.st_size > (1 << 20)) (void)!::ftruncate(log_fd_, 0);
      log_offset_ = st.st_size > (1 << 20) ? 0 : st.st_size;
    }
  }
  req["id"] = ++next_id_;
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(secs));
  char within[32];  // "30 s", not std::to_string's "30.000000 s"
  std::snprintf(within, sizeof within, "%g", secs);
  const std::string timeout_text =
      std::string("no answer within ") + within + " s" +
      (first_compile ? ", its first call at this problem (the kernel compiles per shape: --compile-timeout)" : "") +
      " (the adapter was killed)";
  if (Io r = send(req, payload_out, deadline); r != Io::kOk) {
    if (r == Io::kTimeout) return done(LaunchStatus::kHang, timeout_text, true);
    return done(LaunchStatus::kCrash, io_trouble(r), true);
  }
  // Room for 4-byte elements whatever the dtype, so a reply in the wrong dtype is named as such (below).
  size_t expect = 0;
  for (const Expected& w : want) expect += static_cast<size_t>(w.n[0] * w.n[1] * w.n[2] * w.n[3]) * 4;
  Json h;
  std::vector<unsigned char> payload;
  if (Io r = recv(h, payload, deadline, expect); r != Io::kOk) {
    if (r == Io::kTimeout) return done(LaunchStatus::kHang, timeout_text, true);
    if (r == Io::kBad) return done(LaunchStatus::kLaunchError, "adapter " + bad_, true);
    return done(LaunchStatus::kCrash, io_trouble(r), true);
  }
  // The reply: a result with the wanted tensors, or an error the adapter caught (stream still in sync).
  std::string bad;
  auto take_repro = [&] {  // a bug report's answer (PROTOCOL.md "Bug reports"), in a result or an error
    if (!h.contains("repro") || !h["repro"].is_object()) return;
    repro_reply_.files = h["repro"].value("files", std::vector<std::string>{});
    repro_reply_.error = h["repro"].value("error", std::string());
  };
  const std::string type = h.value("type", std::string());
  try {
    if (h.value("id", int64_t{-1}) != next_id_) {
      bad = "reply id " + h.value("id", Json()).dump() + " for request " + std::to_string(next_id_);
    } else if (type == "error") {
      take_repro();  // a bug report of a run that raised: its script raises as the library did
      return done(LaunchStatus::kLaunchError,
                  "the adapter raised: " + h.value("message", std::string("(no message)")), false);
    } else if (type != "result") {
      bad = "expected a result, got type '" + type + "'";
    } else {
      take_repro();
      const Json& ts = h.at("tensors");
      if (!ts.is_array()) throw std::runtime_error("'tensors' is not an array");
      size_t off = 0;
      std::vector<bool> got(want.size(), false);
      for (const Json& t : ts) {
        const std::string name = t.at("name").get<std::string>(), dt = t.at("dtype").get<std::string>();
        const std::vector<int64_t> shape = t.at("shape").get<std::vector<int64_t>>();
        size_t i = 0;
        while (i < want.size() && name != want[i].name) ++i;
        if (i == want.size() || got[i]) throw std::runtime_error("unexpected tensor '" + name + "'");
        const Expected& w = want[i];
        std::vector<int64_t> ws(w.n + 4 - w.rank, w.n + 4);                // the last `rank` dimensions
        if (ws.back() == 1 && name == std::string("lse")) ws.pop_back();  // LSE travels as [B, Hq, Sq]
        if (dt != wire_dtype(w.dtype))
          throw std::runtime_error("tensor " + name + " has dtype " + dt + ", expected " +
                                   wire_dtype(w.dtype));
        if (shape != ws)
          throw std::runtime_error("tensor " + name + " has shape " + shape_text(shape) + ", expected " +
                                   shape_text(ws));
        const size_t eb = carried_bytes(w.dtype), row = static_cast<size_t>(w.n[3]) * eb;
        const size_t bytes = static_cast<size_t>(w.n[0] * w.n[1] * w.n[2]) * row;
        if (off + bytes > payload.size()) throw std::runtime_error("payload shorter than its tensors");
        const unsigned char* src = payload.data() + off;
        auto* dst = static_cast<unsigned char*>(w.dst);
        for (int64_t a = 0; a < w.n[0]; ++a)
          for (int64_t bb = 0; bb < w.n[1]; ++bb)
            for (int64_t c = 0; c < w.n[2]; ++c, src += row)
              if (row)
                std::memcpy(dst + static_cast<size_t>(a * w.st[0] + bb * w.st[1] + c * w.st[2]) * eb, src,
                            row);
        got[i] = true;
        off += bytes;
      }
      for (size_t i = 0; i < want.size(); ++i)
        if (!got[i])
          throw std::runtime_error(std::string("no tensor '") + want[i].name + "'" +
                                   (want[i].name == std::string("lse") ? " (the kernel declared lse)" : ""));
      if (off != payload.size()) throw std::runtime_error("payload_bytes does not match the tensors");
    }
  } catch (const std::exception& e) {
    bad = e.what();
  }
  if (!bad.empty()) return done(LaunchStatus::kLaunchError, "adapter protocol error: " + bad, true);
  return done(LaunchStatus::kOk, "", false);
}

std::unique_ptr<Device> make_adapter_device(const DeviceOptions& o) {
  return std::make_unique<AdapterDevice>(o);
}

}  // namespace attnfuzz
