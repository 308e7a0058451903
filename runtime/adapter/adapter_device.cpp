// adapter_device.cpp - the adapter backend: kernels of an external process (adapters/PROTOCOL.md) as a
// device.
//
// --adapter CMD starts CMD (through /bin/sh -c) as a persistent child. At start-up it declares its kernels
// and what each supports; they join the registry as entries of the adapter backend (af_kernel tables
// filled from the handshake, dispatched by name). Memory is host memory. A launch sends the in-bounds
// elements of q, k, v (per the problem's strides, as contiguous [B, S, H, D]) and writes the O (and LSE)
// it receives into the output buffers at the problem's strides. A child that crashes, hangs or breaks the
// protocol costs one launch (crash / hang / launch-error) and is restarted for the next one.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "attnfuzz/problem.h"
#include "attnfuzz/registry.h"
#include "runtime/adapter/adapter.h"

namespace attnfuzz {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxHeaderBytes = 1 << 20;
constexpr size_t kMaxAdapterKernels = 64;

// ---- what the handshake declared, per kernel (process-wide: registry entries point at it) ----------
struct KernelSpec {
  std::string name, family, description;
  uint32_t dtypes = AF_SUPPORTS_F32, masks = AF_SUPPORTS_ALL_MASKS;
  int64_t max_head_dim = 0, max_head_dim_v = 0, head_dim_multiple = 1;
  bool gqa = true, dv_ne_d = true, lse = false, empty_keys = true, dynamic_check = false;
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

// Never called: the adapter device dispatches by kernel name (the registry wants a launch function).
int launch_elsewhere(const af_problem*, const af_buffers*, void*) { return -1; }

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
  if (!log_path_.empty()) ::unlink(log_path_.c_str());
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
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
    return std::string("pipe: ") + std::strerror(errno);
  if (log_path_.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string t = std::string(tmp && *tmp ? tmp : "/tmp") + "/attnfuzz-adapter-XXXXXX";
    std::vector<char> buf(t.begin(), t.end());
    buf.push_back(0);
    const int fd = mkstemp(buf.data());
    if (fd < 0) return std::string("cannot create its stderr log: ") + std::strerror(errno);
    ::close(fd);
    log_path_ = buf.data();
  }
  const int log = ::open(log_path_.c_str(), O_WRONLY | O_TRUNC | O_APPEND | O_CLOEXEC);
  log_offset_ = 0;
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return std::string("fork: ") + std::strerror(errno);
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) _exit(127);
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    if (log >= 0) ::dup2(log, 2);
    ::setenv("ATTNFUZZ_ADAPTER_PROTOCOL", std::to_string(kAdapterProtocolVersion).c_str(), 1);
    ::signal(SIGPIPE, SIG_DFL);
    ::execl("/bin/sh", "sh", "-c", command_.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ::setpgid(pid, pid);  // (also done by the child: whichever runs first)
  if (log >= 0) ::close(log);
  ::close(in[0]);
  ::close(out[1]);
  pid_ = pid;
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
  if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
  }
  pid_ = -1;
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
  const int fd = ::open(log_path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return s;
  struct stat stt {};
  ::fstat(fd, &stt);
  const off_t from = std::max<off_t>(log_offset_, stt.st_size - 1500);
  if (stt.st_size > from) {
    s.resize(static_cast<size_t>(stt.st_size - from));
    const ssize_t n = ::pread(fd, s.data(), s.size(), from);
    s.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  ::close(fd);
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
    a.family = k.value("family", std::string("adapter"));
    a.description = k.value("description", std::string());
    a.dtypes = 0;
    for (const Json& d : k.value("dtypes", Json::array({"f32"}))) {
      auto dt = parse_dtype(d.get<std::string>());
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
    a.max_head_dim = k.value("max_head_dim", int64_t{0});
    a.max_head_dim_v = k.value("max_head_dim_v", int64_t{0});
    a.head_dim_multiple = std::max<int64_t>(1, k.value("head_dim_multiple", int64_t{1}));
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
    // Until the low-precision issue lands, the tool's buffers hold fp32 only (case.h's Tensors).
    s.dtypes = a.dtypes & AF_SUPPORTS_F32;
    s.masks = a.masks;
    s.max_head_dim = a.max_head_dim;
    s.max_head_dim_v = a.max_head_dim_v;
    s.head_dim_multiple = a.head_dim_multiple;
    s.gqa = a.gqa;
    s.dv_ne_d = a.dv_ne_d;
    s.lse = a.lse;
    s.empty_keys = a.empty_keys;
    s.dynamic_check = a.dynamic_check;
    auto it = g_slot.find(a.name);
    if (it != g_slot.end()) {  // re-opened in this process (a restart, a second device): same entry
      g_specs[it->second] = s;
      continue;
    }
    if (g_specs.size() >= kMaxAdapterKernels) throw DeviceError("too many adapter kernels in one process");
    g_slot[a.name] = g_specs.size();
    g_specs.push_back(s);
    const KernelSpec& st = g_specs.back();
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
    fresh.push_back(k);
  }
  try {
    reg.add(Backend::kAdapter, fresh.data(), fresh.size(), origin);
  } catch (const std::exception& e) {
    throw DeviceError(e.what());
  }
}

Json AdapterDevice::problem_json(const af_problem& p) {
  Json j;
  j["batch"] = p.batch;
  j["heads_q"] = p.heads_q;
  j["heads_kv"] = p.heads_kv;
  j["seq_q"] = p.seq_q;
  j["seq_k"] = p.seq_k;
  j["head_dim"] = p.head_dim;
  j["head_dim_v"] = p.head_dim_v;
  j["scale"] = static_cast<double>(p.scale);  // exact: every float is a double
  j["dtype"] = dtype_name(p.dtype);
  j["mask"] = mask_to_string(p);
  j["mask_kind"] = p.mask_kind == AF_MASK_NONE ? "none" : p.mask_kind == AF_MASK_CAUSAL ? "causal" : "window";
  j["mask_align"] = p.mask_align == AF_ALIGN_BOTTOM_RIGHT ? "bottom-right" : "top-left";
  j["window_left"] = window_left(p);  // after normalising causal / none; -1 = unbounded
  j["window_right"] = window_right(p);
  j["diagonal_offset"] = mask_offset(p);
  return j;
}

std::string AdapterDevice::remote_check(const std::string& kernel, const af_problem& p) {
  if (pid_ <= 0 && !start().empty()) return {};  // the launch will say what is wrong
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(opts_.timeout_s));
  Json req = {{"type", "check"}, {"id", ++next_id_}, {"kernel", kernel}, {"problem", problem_json(p)}};
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

LaunchResult AdapterDevice::launch(const af_kernel& k, const af_problem& p, const af_buffers& b) {
  LaunchResult res;
  const auto t0 = Clock::now();
  auto done = [&](LaunchStatus st, std::string msg, bool restart) {
    if (restart) stop();
    res.status = st;
    res.message = std::move(msg);
    res.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    return res;
  };
  if (p.dtype != AF_DTYPE_F32)
    return done(
        LaunchStatus::kLaunchError,
        std::string("adapter backend: dtype ") + dtype_name(p.dtype) + " is not carried yet (fp32 only)",
        false);
  if (pid_ <= 0) {
    if (std::string err = start(); !err.empty())
      return done(LaunchStatus::kLaunchError, "the adapter could not be restarted: " + err, true);
  }
  {  // a log that grows without bound is cut (the child appends)
    struct stat st {};
    if (::stat(log_path_.c_str(), &st) == 0) {
      if (st.st_size > (1 << 20)) ::truncate(log_path_.c_str(), 0);
      log_offset_ = st.st_size > (1 << 20) ? 0 : st.st_size;
    }
  }
  const int64_t B = p.batch, Hq = p.heads_q, Hk = p.heads_kv, Sq = p.seq_q, Sk = p.seq_k, D = p.head_dim,
                Dv = p.head_dim_v;
  // Gather the in-bounds input elements as contiguous [B, S, H, D].
  std::vector<float> q(static_cast<size_t>(B * Sq * Hq * D)), kk(static_cast<size_t>(B * Sk * Hk * D)),
      v(static_cast<size_t>(B * Sk * Hk * Dv));
  const auto* qs = static_cast<const float*>(b.q);
  const auto* ks = static_cast<const float*>(b.k);
  const auto* vs = static_cast<const float*>(b.v);
  size_t n = 0;
  for (int64_t bi = 0; bi < B; ++bi)
    for (int64_t s = 0; s < Sq; ++s)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t d = 0; d < D; ++d) q[n++] = qs[q_index(p, bi, s, h, d)];
  n = 0;
  for (int64_t bi = 0; bi < B; ++bi)
    for (int64_t s = 0; s < Sk; ++s)
      for (int64_t h = 0; h < Hk; ++h)
        for (int64_t d = 0; d < D; ++d) kk[n++] = ks[k_index(p, bi, s, h, d)];
  n = 0;
  for (int64_t bi = 0; bi < B; ++bi)
    for (int64_t s = 0; s < Sk; ++s)
      for (int64_t h = 0; h < Hk; ++h)
        for (int64_t d = 0; d < Dv; ++d) v[n++] = vs[v_index(p, bi, s, h, d)];
  const bool want_lse = k.writes_lse && b.lse;
  auto desc = [](const char* name, std::vector<int64_t> shape) {
    return Json{{"name", name}, {"dtype", "f32"}, {"shape", shape}};
  };
  Json req;
  req["type"] = "run";
  req["id"] = ++next_id_;
  req["kernel"] = k.name;
  req["problem"] = problem_json(p);
  req["want_lse"] = want_lse;
  req["tensors"] =
      Json::array({desc("q", {B, Sq, Hq, D}), desc("k", {B, Sk, Hk, D}), desc("v", {B, Sk, Hk, Dv})});
  req["payload_bytes"] = (q.size() + kk.size() + v.size()) * 4;
  const auto deadline =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts_.timeout_s));
  const std::string timeout_text =
      "no answer within " + std::to_string(opts_.timeout_s) + " s (the adapter was killed)";
  if (Io r = send(req, {{q.data(), q.size() * 4}, {kk.data(), kk.size() * 4}, {v.data(), v.size() * 4}},
                  deadline);
      r != Io::kOk) {
    if (r == Io::kTimeout) return done(LaunchStatus::kHang, timeout_text, true);
    return done(LaunchStatus::kCrash, io_trouble(r), true);
  }
  const size_t o_count = static_cast<size_t>(B * Sq * Hq * Dv), lse_count = static_cast<size_t>(B * Hq * Sq);
  const size_t expect = (o_count + (want_lse ? lse_count : 0)) * 4;
  Json h;
  std::vector<unsigned char> payload;
  if (Io r = recv(h, payload, deadline, expect); r != Io::kOk) {
    if (r == Io::kTimeout) return done(LaunchStatus::kHang, timeout_text, true);
    if (r == Io::kBad) return done(LaunchStatus::kLaunchError, "adapter " + bad_, true);
    return done(LaunchStatus::kCrash, io_trouble(r), true);
  }
  // The reply: a result with o (and lse), or an error the adapter caught (stream still in sync).
  std::string bad;
  const std::string type = h.value("type", std::string());
  try {
    if (h.value("id", int64_t{-1}) != next_id_) {
      bad = "reply id " + h.value("id", Json()).dump() + " for request " + std::to_string(next_id_);
    } else if (type == "error") {
      return done(LaunchStatus::kLaunchError,
                  "the adapter raised: " + h.value("message", std::string("(no message)")), false);
    } else if (type != "result") {
      bad = "expected a result, got type '" + type + "'";
    } else {
      const Json& ts = h.at("tensors");
      if (!ts.is_array()) throw std::runtime_error("'tensors' is not an array");
      size_t off = 0;
      bool got_o = false, got_lse = false;
      for (const Json& t : ts) {
        const std::string name = t.at("name").get<std::string>(), dt = t.at("dtype").get<std::string>();
        const std::vector<int64_t> shape = t.at("shape").get<std::vector<int64_t>>();
        std::vector<int64_t> want;
        if (name == "o")
          want = {B, Sq, Hq, Dv};
        else if (name == "lse" && want_lse)
          want = {B, Hq, Sq};
        else
          throw std::runtime_error("unexpected tensor '" + name + "'");
        if (dt != "f32") throw std::runtime_error("tensor " + name + " has dtype " + dt + ", expected f32");
        if (shape != want) {
          auto str = [](const std::vector<int64_t>& s) {
            std::string r = "[";
            for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
            return r + "]";
          };
          throw std::runtime_error("tensor " + name + " has shape " + str(shape) + ", expected " + str(want));
        }
        const size_t bytes = (name == "o" ? o_count : lse_count) * 4;
        if (off + bytes > payload.size()) throw std::runtime_error("payload shorter than its tensors");
        const auto* src = reinterpret_cast<const float*>(payload.data() + off);  // malloc'd: aligned
        if (name == "o") {
          auto* o = static_cast<float*>(b.o);
          size_t i = 0;
          for (int64_t bi = 0; bi < B; ++bi)
            for (int64_t s = 0; s < Sq; ++s)
              for (int64_t hh = 0; hh < Hq; ++hh)
                for (int64_t d = 0; d < Dv; ++d) o[o_index(p, bi, s, hh, d)] = src[i++];
          got_o = true;
        } else {
          size_t i = 0;
          for (int64_t bi = 0; bi < B; ++bi)
            for (int64_t hh = 0; hh < Hq; ++hh)
              for (int64_t s = 0; s < Sq; ++s) b.lse[lse_index(p, bi, hh, s)] = src[i++];
          got_lse = true;
        }
        off += bytes;
      }
      if (!got_o) throw std::runtime_error("no tensor 'o'");
      if (want_lse && !got_lse) throw std::runtime_error("no tensor 'lse' (the kernel declared lse)");
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
