// worker_config.cpp - the WorkerConfig the common options decide (tools/worker_config.h).
#include "tools/worker_config.h"

#include <filesystem>

namespace attnfuzz::cli {

fuzz::WorkerConfig common_worker_config(const CommonOptions& o, Backend backend) {
  namespace fs = std::filesystem;
  fuzz::WorkerConfig w;
  w.kernels = o.kernel;
  w.backend = backend_name(backend);
  w.adapter = o.adapter;
  for (const auto& p : o.plugins) w.plugins.push_back(fs::absolute(p).string());
  w.order = o.order;
  w.order_seed = o.order_seed;
  w.warp_size = o.warp_size;
  w.timeout_s = o.timeout_s;
  w.compile_timeout_s = o.compile_timeout_s;
  w.isolate = o.no_isolate ? "never" : "auto";
  w.oracle_rows = o.oracle_rows;
  w.mp_bits = o.mp_bits;
  w.limits.domain = value_domain(o);
  w.limits.dtype = case_dtype(o);
  w.limits.passes = static_cast<uint8_t>(1u << static_cast<int>(case_pass(o)));
  w.limits.variants = case_variants(o);  // issue 28: --variant lets decoded cases use score variants
  w.repeat_calls = o.repeat_calls;       // issue 30 item 6b: stale plan caches in campaigns too
  // What a replay needs besides the file: the thread order (races), warp size, plug-ins, backend, --amplify.
  std::string flags;
  const CommonOptions dflt;  // attn-check's defaults: say only what differs
  if (backend == Backend::kCpu &&
      (w.order != dflt.order || (w.order == "shuffle" && w.order_seed != dflt.order_seed)))
    flags +=
        "--order " + w.order + (w.order == "shuffle" ? " --order-seed " + std::to_string(w.order_seed) : "");
  if (backend == Backend::kCpu && w.warp_size != 32)
    flags += (flags.empty() ? "" : " ") + std::string("--warp-size ") + std::to_string(w.warp_size);
  for (const auto& p : o.plugins) flags += (flags.empty() ? "" : " ") + ("--plugin " + shell_quote(p));
  if (backend == Backend::kAdapter)
    flags += (flags.empty() ? "" : " ") + std::string("--adapter ") + shell_quote(o.adapter);
  else if (backend != Backend::kCpu)
    flags += (flags.empty() ? "" : " ") + std::string("--backend ") + backend_name(backend);
  w.amplify = o.amplify;  // an amplified failure passes the plain check: its replay needs --amplify too
  if (o.amplify) flags += (flags.empty() ? "" : " ") + std::string("--amplify");
  if (o.repeat_calls)  // after the siblings, and on the cpu backend in one process as the campaign's workers launch
    flags += (flags.empty() ? "" : " ") + std::string("--repeat-calls") + (backend == Backend::kCpu ? " --no-isolate" : "");
  w.replay_flags = flags;
  return w;
}

}  // namespace attnfuzz::cli
