// runner.cpp - one kernel x one case: guarded launch, canaries, exact comparison, verdict.
#include "check/runner.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>

#include "attnfuzz/dropout.h"
#include "check/compare.h"
#include "check/dropout.h"
#include "check/dtype_codec.h"
#include "check/merge.h"
#include "check/sequences.h"
#include "oracle/lowp.h"

namespace attnfuzz {

PreparedCase::PreparedCase(Case c, unsigned oracle_threads)
    : case_(std::move(c)),
      tensors_(generate(case_)),
      view_(dense_view(case_.problem, tensors_)),
      keep_(reference_keep_mask(case_.problem)) {
  // What check_support sees (ABI v3): a backward-only case asks about the backward launch.
  case_.problem.pass = case_.pass == Pass::kBwd ? AF_PASS_BACKWARD : AF_PASS_FORWARD;
  view_.pass = case_.problem.pass;
  if (is_merge(case_.problem)) make_states(case_, tensors_, oracle_threads);  // the merge kernel's inputs (check/merge.h)
}

void PreparedCase::use_model(const OracleOptions& o) {
  const int32_t model = o.compute_model * 2 + (o.score_add_in_dtype ? 1 : 0);
  if (model == model_) return;
  oracle_.reset();  // bounds of another compute model: the values would be the same, the bounds are not
  full_.reset();
  whole_.reset();
  grad_.reset();
  model_ = model;
}

const OracleResult& PreparedCase::oracle(const OracleOptions& o) {
  use_model(o);
  OracleOptions lean = o;
  lean.baseline = false;  // up to 4x the exact rows' cost in f16 / bf16, for a passing check's unused evidence
  if (!oracle_ && is_merge(case_.problem)) oracle_ = merge_oracle(case_.problem, tensors_, lean);
  if (!oracle_ && has_sequences(case_.problem))
    oracle_ = sequence_oracle(case_.problem, tensors_, lean);
  if (!oracle_)
    oracle_ = compute_oracle(case_.problem, tensors_.q.data(), tensors_.k.data(), tensors_.v.data(),
                             variant_inputs(), lean);
  return *oracle_;
}

const OracleResult& PreparedCase::oracle_with_baseline(const OracleOptions& o) {
  oracle(o);
  if (!o.baseline || !oracle_->base_o.empty() || is_merge(case_.problem)) return *oracle_;
  OracleResult b = has_sequences(case_.problem)
                       ? sequence_oracle(case_.problem, tensors_, o)
                       : compute_oracle(case_.problem, tensors_.q.data(), tensors_.k.data(), tensors_.v.data(),
                                        variant_inputs(), o);
  if (b.sampled == oracle_->sampled && b.base_o.size() == oracle_->o.size()) {
    oracle_->base_o = std::move(b.base_o);
    oracle_->base_lse = std::move(b.base_lse);
  }
  return *oracle_;
}

const OracleResult* PreparedCase::merge_whole(const OracleOptions& o) {
  if (!is_merge(case_.problem)) return nullptr;
  const OracleResult& merged = oracle(o);
  if (!whole_) {
    std::optional<OracleResult> w = merge_whole_oracle(case_, tensors_, merged, o);
    if (!w) return nullptr;
    whole_ = std::move(*w);
  }
  return &*whole_;
}

void PreparedCase::make_given(const OracleOptions& o) {
  if (given_o_) return;
  const Problem& p = case_.problem;
  OracleOptions every = o;
  every.row_budget = 0;  // a backward launch needs O and LSE of every row
  every.baseline = false;
  const OracleResult& ex = o.row_budget == 0 ? oracle(o)
                                             : full_.emplace(compute_oracle(p, tensors_.q.data(), tensors_.k.data(),
                                                                            tensors_.v.data(), variant_inputs(),
                                                                            every));
  given_o_.emplace();
  given_lse_.emplace();
  given_forward(p, ex, *given_o_, *given_lse_);
}

void given_forward(const Problem& p, const OracleResult& ex, std::vector<float>& o, std::vector<float>& lse) {
  const bool lowp = p.dtype == AF_DTYPE_F16 || p.dtype == AF_DTYPE_BF16;
  auto round = [&](double x) {
    const float f = static_cast<float>(x);
    return lowp ? round_to_dtype(f, p.dtype) : f;
  };
  o.assign(static_cast<size_t>(o_elements(p)), 0.0f);
  lse.assign(static_cast<size_t>(lse_elements(p)), 0.0f);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < p.seq_q; ++s) {
        lse[static_cast<size_t>(lse_index(p, b, h, s))] = static_cast<float>(ex.lse[ex.lse_at(b, h, s)]);
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          o[static_cast<size_t>(o_index(p, b, s, h, d))] = round(ex.o[ex.o_at(b, s, h, d)]);
      }
}

const std::vector<float>& PreparedCase::given_o(const OracleOptions& o) {
  make_given(o);
  return *given_o_;
}

const std::vector<float>& PreparedCase::given_lse(const OracleOptions& o) {
  make_given(o);
  return *given_lse_;
}

GradOptions grad_options(const OracleOptions& o) {
  GradOptions g;
  g.fwd = o;
  g.q_budget = o.row_budget;
  g.k_budget = o.row_budget;
  g.sample_seed = o.sample_seed;
  g.force_multiprecision = o.force_multiprecision;
  return g;
}

const OracleResult& PreparedCase::full_forward(const OracleOptions& o) {
  make_given(o);
  return full_ ? *full_ : *oracle_;
}

const GradResult& PreparedCase::grad(const OracleOptions& o) {
  use_model(o);
  if (!grad_) {
    GradOptions g = grad_options(o);
    g.forward = &full_forward(o);  // the gradient oracle skips its own forward pass
    grad_ = compute_grad_oracle(case_.problem, tensors_.q.data(), tensors_.k.data(), tensors_.v.data(),
                                tensors_.dout.data(), given_o_->data(), given_lse_->data(), variant_inputs(), g);
  }
  return *grad_;
}

namespace {

int64_t count_poison(const std::vector<float>& v, uint32_t poison) {
  int64_t n = 0;
  for (float x : v) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    n += u == poison;
  }
  return n;
}

std::string hex32(uint32_t u) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", u);
  return b;
}

// A crashing launch that faulted in the guard pages around one of bufs (the cpu device fences 256 MiB each
// side): which buffer, and where relative to its payload.
void locate_fault(LaunchOutcome& out, std::initializer_list<const GuardedBuffer*> bufs) {
  if (out.launch.status != LaunchStatus::kCrash || !out.launch.fault_address) return;
  const uint64_t a = out.launch.fault_address;
  const GuardedBuffer* near = nullptr;
  for (const GuardedBuffer* gb : bufs)
    if (gb && (!near || gb->distance_to(a) < near->distance_to(a))) near = gb;
  if (!near || near->distance_to(a) > (uint64_t{1} << 30)) return;
  out.fault_buffer = near->name();
  out.fault_offset = near->offset_of(a);
  const int64_t end = static_cast<int64_t>(near->bytes());
  out.fault_where = out.fault_offset < 0
                        ? std::to_string(-out.fault_offset) + " bytes before the start of buffer " + near->name()
                        : std::to_string(out.fault_offset - end) + " bytes past the end of buffer " + near->name();
}

// The launch's downloads and the changed guard words of every buffer of it, read back together.
void collect_canaries(Device& dev, LaunchOutcome& out, const std::vector<const GuardedBuffer*>& bufs,
                      const std::vector<GuardedBuffer::Download>& downloads) {
  auto hits = GuardedBuffer::read_back(dev, downloads, bufs);
  out.canaries.insert(out.canaries.end(), hits.begin(), hits.end());
  for (const GuardedBuffer* gb : bufs)
    if (gb) out.canary_words += gb->changed_words();
}

}  // namespace

namespace {
std::atomic<uint64_t> g_launches{0};
std::atomic<int> g_in_flight{0};
std::atomic<bool> g_abnormal{false};
thread_local double t_launch_s = 0;
// Counts a launch before it starts, times it, and notes one that did not end normally.
LaunchResult counted_launch(Device& dev, const af_kernel& k, const af_problem& p, const af_buffers& b) {
  ++g_launches;
  ++g_in_flight;
  const auto t0 = std::chrono::steady_clock::now();
  LaunchResult r = dev.launch(k, p, b);
  t_launch_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  --g_in_flight;
  if (r.status != LaunchStatus::kOk) g_abnormal = true;
  return r;
}
}  // namespace

uint64_t guarded_launches() { return g_launches; }
bool guarded_launch_ended_abnormally() { return g_abnormal; }
double guarded_launch_seconds() { return t_launch_s; }

std::unique_ptr<GuardedBuffer> BufferPool::take(const std::string& name, size_t bytes, size_t guard,
                                                uint32_t poison) {
  std::lock_guard<std::mutex> lk(mu_);
  const size_t alloc = GuardedBuffer::allocation_bytes(bytes, guard);
  // A kept allocation serves a payload that fits it with at most min(alloc, 1 MiB) to spare: the spare bytes join
  // the after-guard, whose read-back after each launch stays within twice the need.
  auto fits = [&](const Kept& k) {
    const size_t a = k.buf->allocation();
    return k.guard == guard && k.buf->name() == name && a >= alloc && a - alloc <= std::min(alloc, size_t{1} << 20);
  };
  // The best kept buffer: the same payload size, else the same allocation, else the smallest that fits; newest
  // first among equals.
  auto best = [&] {
    size_t pick = kept_.size();
    for (size_t i = kept_.size(); i-- > 0;) {
      const Kept& k = kept_[i];
      if (!fits(k)) continue;
      const size_t a = k.buf->allocation();
      if (a == alloc && k.buf->bytes() == bytes) return i;
      if (pick == kept_.size()) {
        pick = i;
        continue;
      }
      const size_t b = kept_[pick].buf->allocation();
      if ((a == alloc) != (b == alloc) ? a == alloc : a < b) pick = i;
    }
    return pick;
  };
  size_t pick = best();
  while (pick < kept_.size()) {
    Kept k = std::move(kept_[pick]);
    kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(pick));
    // A stray write of another launch may have reached a kept buffer's guards: never hand that on (it would
    // read as this launch's out-of-bounds write); free it and look further. Nothing can have written since it
    // was kept when no launch ran since and every launch so far ended normally.
    bool clean = k.launches == g_launches && !g_abnormal;
    if (!clean) {
      k.buf->check(0);
      clean = k.buf->changed_words() == 0;
    }
    if (clean) {
      k.buf->relayout(bytes);
      if (k.poison != poison) k.buf->repoison(poison);
      ++hits_;
      return std::move(k.buf);
    }
    pick = best();
  }
  ++misses_;
  return std::make_unique<GuardedBuffer>(dev_, name, bytes, guard, poison);
}

void BufferPool::give(std::unique_ptr<GuardedBuffer> b, size_t guard, uint32_t poison) {
  if (!b || max_ == 0) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (kept_.size() >= max_) kept_.erase(kept_.begin());
  // Kept while another thread's launch runs: checked again when taken (that launch may still write).
  const uint64_t stamp = g_in_flight == 0 ? g_launches.load() : ~uint64_t{0};
  kept_.push_back({guard, poison, std::move(b), stamp});
}

bool packed_lse(const af_kernel& k, const Problem& p) {
  return (k.flags & AF_KERNEL_LSE_PACKED) && p.q_layout == AF_SEQ_PACKED;
}

void use_packed_lse(Problem& p) {
  p.lse_layout = AF_LSE_PACKED;
  p.lse_stride[0] = 0;
  p.lse_stride[1] = p.total_q;
  p.lse_stride[2] = 1;
}

std::vector<float> unpack_lse(const Problem& p, const Tensors& t, const std::vector<float>& packed, uint32_t fill) {
  std::vector<float> out(static_cast<size_t>(lse_elements(p)), std::bit_cast<float>(fill));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < seq_len_q(p, t, b); ++s)
        out[static_cast<size_t>(lse_index(p, b, h, s))] =
            packed[static_cast<size_t>(h * p.total_q + t.cu_seqlens_q[static_cast<size_t>(b)] + s)];
  return out;
}

namespace {

// The guard poison of input buffer `name`: opts.guard_poison, or the other one for RunOptions::swap_guard_of.
uint32_t guard_poison_of(const RunOptions& opts, const char* name) {
  if (opts.swap_guard_of.empty() || opts.swap_guard_of != name) return opts.guard_poison;
  return opts.guard_poison == kGuardPoisonAlt ? kGuardPoison : kGuardPoisonAlt;
}
// AF_DROPOUT_RNG_EXPORTED (attnfuzz/dropout.h): the guarded keep-mask buffer, its bytes poisoned with 0xa5 (neither
// 0 nor 1, so an unwritten visible byte is seen); none for a declared generator.
template <class Make>
std::unique_ptr<GuardedBuffer> exported_mask_buffer(Problem& p, Make& make) {
  if (!(p.variants & AF_VARIANT_DROPOUT)) return nullptr;
  set_dropout_mask_strides(p);  // the tool's layout, whatever the case carried
  if (p.dropout_rng != AF_DROPOUT_RNG_EXPORTED || dropout_mask_bytes(p) == 0) return nullptr;
  std::unique_ptr<GuardedBuffer> gb = make("dropout_mask", static_cast<size_t>(dropout_mask_bytes(p)), 0);
  gb->fill_payload(0xa5a5a5a5u);
  return gb;
}
// The exported mask of one launch into `into` (contiguous), with its bad bytes counted in out.
void read_exported_mask(const Problem& p, GuardedBuffer& gb, const std::vector<float>& lse, LaunchOutcome& out,
                        std::vector<uint8_t>& into) {
  std::vector<uint8_t> raw(gb.bytes());
  gb.download(raw.data());
  int64_t bad = 0;
  std::string first;
  into = gather_keep_mask(p, raw.data(), lse.empty() ? nullptr : lse.data(), bad, first);
  if (bad && !out.keep_bad) out.keep_bad_first = first;
  out.keep_bad += bad;
}
}  // namespace

LaunchOutcome launch_guarded(Device& dev, const KernelEntry& k, const Problem& case_problem, const Tensors& t,
                             const RunOptions& opts) {
  LaunchOutcome out;
  Problem p = case_problem;
  resolve_tunables(k.kernel, p);  // the kernel always sees accepted tunable values
  p.pass = AF_PASS_FORWARD;
  const Problem asked = p;  // outputs come back in the case's layout (a packed lse is unpacked into it)
  const bool packed = packed_lse(k.kernel, p);
  if (packed) use_packed_lse(p);
  const size_t g = opts.guard_bytes;
  const uint32_t poison = opts.guard_poison;
  BufferPool* pool = opts.pool && &opts.pool->device() == &dev ? opts.pool.get() : nullptr;
  // q, k, v and o hold elements of the case's dtype (check/dtype_codec.h), poisoned in that format; lse and the
  // workspace stay fp32.
  const size_t eb = static_cast<size_t>(dtype_bytes(p.dtype));
  const uint32_t fpoison = format_poison(p.dtype, poison);
  auto make = [&](const char* name, size_t bytes, uint32_t pw = 0) {
    if (!pw) pw = guard_poison_of(opts, name);
    return pool ? pool->take(name, bytes, g, pw) : std::make_unique<GuardedBuffer>(dev, name, bytes, g, pw);
  };
  // kv-shared (docs/semantics.md "Shared K/V latent"): no V buffer; the kernel gets K's pointer as buffers.v.
  const bool shared = kv_shared(p);
  std::unique_ptr<GuardedBuffer> q = make("q", t.q.size() * eb, fpoison),
                                 kb = make("k", t.k.size() * eb, fpoison),
                                 v = shared ? nullptr : make("v", t.v.size() * eb, fpoison);
  // Sequence layouts: the arrays in guarded buffers, the K/V gaps holding this launch's guard poison.
  const bool seqs = has_sequences(p);
  std::unique_ptr<GuardedBuffer> cu_q, cu_k, used_k, table;
  // A guarded input holding the host array a (int32 sequence arrays, fp32 variant inputs); none when a is empty.
  auto make_input = [&](const char* name, const auto& a) {
    std::unique_ptr<GuardedBuffer> gb;
    if (!a.empty()) {
      gb = make(name, a.size() * sizeof(a[0]));
      gb->upload(a.data());
    }
    return gb;
  };
  Tensors gapped;
  if (seqs) {
    // The arrays as the kernel receives them: a malformed case's defect applied (docs/semantics.md "Malformed
    // metadata"); the gaps, the download and the oracle keep the well-formed ones.
    const Tensors sent = malformed_arrays(p, t);
    cu_q = make_input("cu_seqlens_q", sent.cu_seqlens_q);
    cu_k = make_input("cu_seqlens_k", sent.cu_seqlens_k);
    used_k = make_input("seqused_k", sent.seqused_k);
    table = make_input("block_table", sent.block_table);
    gapped.k = t.k;
    gapped.v = t.v;
    gapped.cu_seqlens_k = t.cu_seqlens_k;
    gapped.seqused_k = t.seqused_k;
    gapped.block_table = t.block_table;
    fill_outside(p, gapped, poison);
  }
  std::unique_ptr<GuardedBuffer> o = make("o", static_cast<size_t>(o_elements(p)) * eb, fpoison);
  const bool want_lse = k.kernel.writes_lse != 0;
  std::unique_ptr<GuardedBuffer> lse, ws;
  if (want_lse) lse = make("lse", static_cast<size_t>(packed ? p.heads_q * p.total_q : lse_elements(p)) * 4);
  const size_t ws_bytes = k.kernel.workspace_bytes ? k.kernel.workspace_bytes(&p) : 0;
  if (ws_bytes) ws = make("workspace", ws_bytes);
  // Score variants (fp32 in every dtype): sinks [Hq], alibi_slopes [Hq], bias (bias_stride), guarded inputs.
  // Custom masks (bytes): custom_mask (mask_stride), block_mask (block_mask_stride), guarded inputs.
  std::unique_ptr<GuardedBuffer> sinks, slopes, bias, cmask, bmask;
  sinks = make_input("sinks", t.sinks);
  slopes = make_input("alibi_slopes", t.alibi_slopes);
  bias = make_input("bias", t.bias);
  // Per-head fp8 descales (AF_VARIANT_HEAD_DESCALE, descale_stride), fp32 guarded inputs.
  std::unique_ptr<GuardedBuffer> qd = make_input("q_descale_h", t.q_descale_h),
                                 kd = make_input("k_descale_h", t.k_descale_h),
                                 vd = make_input("v_descale_h", t.v_descale_h);
  // Merge cases (issue 29): the partial states (O_s in the dtype, LSE_s fp32) are the inputs; q, k, v are not passed.
  const bool merge = is_merge(p);
  std::unique_ptr<GuardedBuffer> so, sl = make_input("state_lse", t.state_lse);
  if (merge && !t.state_o.empty()) {
    so = make("state_o", t.state_o.size() * eb, fpoison);
    so->upload(p.dtype == AF_DTYPE_F32 ? static_cast<const void*>(t.state_o.data())
                                       : static_cast<const void*>(encode_tensor(t.state_o, p.dtype).data()));
  }
  std::unique_ptr<GuardedBuffer> dmask = exported_mask_buffer(p, make);
  cmask = make_input("custom_mask", t.custom_mask);
  bmask = make_input("block_mask", t.block_mask);
  // K/V gaps of a sequence layout hold the fp32 guard poison; in a narrow dtype it is encoded as that format's
  // NaN (or, for the finite second poison, its nearest value).
  const std::vector<float>& kin = seqs ? gapped.k : t.k;
  const std::vector<float>& vin = seqs ? gapped.v : t.v;
  if (p.dtype == AF_DTYPE_F32) {
    q->upload(t.q.data());
    kb->upload(kin.data());
    if (v) v->upload(vin.data());
  } else {
    q->upload(encode_tensor(t.q, p.dtype).data());
    kb->upload(encode_tensor(kin, p.dtype).data());
    if (v) v->upload(encode_tensor(vin, p.dtype).data());
  }
  o->fill_payload(format_poison(p.dtype, opts.output_poison));
  if (lse) lse->fill_payload(opts.output_poison);
  if (ws) ws->fill_payload(opts.output_poison);
  af_buffers b{};
  b.q = merge ? nullptr : q->data();
  b.k = merge ? nullptr : kb->data();
  b.v = merge ? nullptr : shared ? kb->data() : v->data();
  b.o = o->data();
  b.lse = lse ? static_cast<float*>(lse->data()) : nullptr;
  b.workspace = ws ? ws->data() : nullptr;
  auto ints = [](const std::unique_ptr<GuardedBuffer>& gb) {
    return gb ? static_cast<const int32_t*>(gb->data()) : nullptr;
  };
  b.cu_seqlens_q = ints(cu_q);
  b.cu_seqlens_k = ints(cu_k);
  b.seqused_k = ints(used_k);
  b.block_table = ints(table);
  auto floats = [](const std::unique_ptr<GuardedBuffer>& gb) {
    return gb ? static_cast<const float*>(gb->data()) : nullptr;
  };
  b.sinks = floats(sinks);
  b.alibi_slopes = floats(slopes);
  b.bias = floats(bias);
  b.q_descale_h = floats(qd);
  b.k_descale_h = floats(kd);
  b.v_descale_h = floats(vd);
  b.state_o = so ? so->data() : nullptr;
  b.state_lse = floats(sl);
  b.dropout_mask = dmask ? static_cast<uint8_t*>(dmask->data()) : nullptr;
  b.custom_mask = cmask ? static_cast<const uint8_t*>(cmask->data()) : nullptr;
  b.block_mask = bmask ? static_cast<const uint8_t*>(bmask->data()) : nullptr;
  out.launch = counted_launch(dev, k.kernel, p, b);
  locate_fault(out, {q.get(),    kb.get(),     v.get(),     o.get(),     lse.get(),    ws.get(),   cu_q.get(),
                     cu_k.get(), used_k.get(), table.get(), sinks.get(), slopes.get(), bias.get(), so.get(),
                     sl.get(),   dmask.get(),  cmask.get(), bmask.get(), qd.get(),     kd.get(),   vd.get()});
  if (!dev.usable()) return out;  // a GPU fault: nothing more can be read
  // O and LSE come back with every guard zone in one read-back.
  out.o.resize(static_cast<size_t>(o_elements(p)));
  std::vector<unsigned char> raw(p.dtype == AF_DTYPE_F32 ? 0 : o->bytes());
  if (lse) out.lse.resize(lse->bytes() / 4);
  collect_canaries(dev, out,
                   {q.get(),    kb.get(),     v.get(),     o.get(),     lse.get(),    ws.get(),   cu_q.get(),
                    cu_k.get(), used_k.get(), table.get(), sinks.get(), slopes.get(), bias.get(), so.get(),
                    sl.get(),   dmask.get(),  cmask.get(), bmask.get(), qd.get(),     kd.get(),   vd.get()},
                   {{o.get(), p.dtype == AF_DTYPE_F32 ? static_cast<void*>(out.o.data()) : raw.data()},
                    {lse.get(), out.lse.data()}});
  if (p.dtype != AF_DTYPE_F32) decode_output(raw.data(), out.o.size(), p.dtype, p.o_scale, opts.output_poison, out.o.data());
  if (lse && packed) out.lse = unpack_lse(asked, t, out.lse, opts.output_poison);
  if (dmask) read_exported_mask(p, *dmask, out.lse, out, out.keep);  // dropout is dense: p's lse layout
  const bool clean_guards = out.canary_words == 0;
  if (seqs) {  // LSE rows past a sequence are canaries; outputs go to the dense view
    int64_t off = 0;
    uint32_t bits = 0;
    const int64_t n = output_gap_writes(asked, t, out.lse, opts.output_poison, out.seq_gap_write, off, bits);
    if (n) {
      out.canaries.insert(out.canaries.begin(), CanaryHit{"lse", off, bits, opts.output_poison});
      out.canary_words += static_cast<size_t>(n);
    }
    std::vector<float> vo, vl;
    outputs_to_view(asked, t, out.o, out.lse, std::bit_cast<float>(opts.output_poison), vo, vl);
    out.o = std::move(vo);
    out.lse = std::move(vl);
    const Problem w = dense_view(asked, t);
    out.unwritten = 0;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t s = 0; s < seq_len_q(p, t, b); ++s)
        for (int64_t h = 0; h < p.heads_q; ++h) {
          for (int64_t d = 0; d < p.head_dim_v; ++d)
            out.unwritten += std::bit_cast<uint32_t>(out.o[o_index(w, b, s, h, d)]) == opts.output_poison;
          if (!out.lse.empty())
            out.unwritten += std::bit_cast<uint32_t>(out.lse[lse_index(w, b, h, s)]) == opts.output_poison;
        }
  } else {
    out.unwritten = count_poison(out.o, opts.output_poison) + count_poison(out.lse, opts.output_poison);
  }
  // Only buffers of a clean launch are kept: a crash, hang or launch error may have left anything anywhere.
  if (pool && out.launch.status == LaunchStatus::kOk && clean_guards)
    for (auto* gb : {&q,      &kb,   &v,  &o,  &lse,   &ws,    &cu_q,  &cu_k, &used_k, &table, &sinks,
                     &slopes, &bias, &so, &sl, &dmask, &cmask, &bmask, &qd,   &kd,     &vd})
      if (*gb)
        pool->give(std::move(*gb), g, (gb == &q || gb == &kb || gb == &v || gb == &o || gb == &so) ? fpoison : poison);
  return out;
}

namespace {
// Addressed elements of a [B, S, H, D] tensor with strides st that hold the poison.
int64_t count_poison_addressed(const std::vector<float>& v, const int64_t* st, int64_t n0, int64_t n1, int64_t n2,
                               int64_t n3, uint32_t poison) {
  int64_t n = 0;
  for (int64_t a = 0; a < n0; ++a)
    for (int64_t b = 0; b < n1; ++b)
      for (int64_t c = 0; c < n2; ++c)
        for (int64_t d = 0; d < n3; ++d) {
          uint32_t u;
          std::memcpy(&u, &v[static_cast<size_t>(a * st[0] + b * st[1] + c * st[2] + d)], 4);
          n += u == poison;
        }
  return n;
}
}  // namespace

LaunchOutcome launch_guarded_bwd(Device& dev, const KernelEntry& k, const Problem& case_problem, const Tensors& t,
                                 const std::vector<float>& o_in, const std::vector<float>& lse_in,
                                 const RunOptions& opts) {
  LaunchOutcome out;
  out.backward = true;
  Problem p = case_problem;
  resolve_tunables(k.kernel, p);
  p.pass = AF_PASS_BACKWARD;
  for (int i = 0; i < 3; ++i) {  // the gradients are laid out like their tensors (oracle/grad.h)
    p.do_stride[i] = p.o_stride[i];
    p.dq_stride[i] = p.q_stride[i];
    p.dk_stride[i] = p.k_stride[i];
    p.dv_stride[i] = p.v_stride[i];
  }
  const size_t g = opts.guard_bytes;
  const uint32_t poison = opts.guard_poison;
  BufferPool* pool = opts.pool && &opts.pool->device() == &dev ? opts.pool.get() : nullptr;
  auto make = [&](const char* name, size_t bytes, uint32_t pw) {
    if (pw == poison) pw = guard_poison_of(opts, name);
    return pool ? pool->take(name, bytes, g, pw) : std::make_unique<GuardedBuffer>(dev, name, bytes, g, pw);
  };
  // q, k, v, o, dout and dq, dk, dv hold elements of the case's dtype (f16 / bf16: check/dtype_codec.h), poisoned
  // in that format; lse and the workspace stay fp32.
  const size_t eb = static_cast<size_t>(dtype_bytes(p.dtype));
  const uint32_t fpoison = format_poison(p.dtype, poison);
  std::unique_ptr<GuardedBuffer> q = make("q", t.q.size() * eb, fpoison), kb = make("k", t.k.size() * eb, fpoison),
                                 v = make("v", t.v.size() * eb, fpoison), o = make("o", o_in.size() * eb, fpoison),
                                 lse = make("lse", lse_in.size() * 4, poison),
                                 dout = make("dout", t.dout.size() * eb, fpoison),
                                 dq = make("dq", t.q.size() * eb, fpoison), dk = make("dk", t.k.size() * eb, fpoison),
                                 dv = make("dv", t.v.size() * eb, fpoison), ws;
  const size_t ws_bytes = k.kernel.bwd_workspace_bytes ? k.kernel.bwd_workspace_bytes(&p) : 0;
  if (ws_bytes) ws = make("workspace", ws_bytes, poison);
  // Score variants: fp32 inputs (sinks, slopes, bias) and outputs (d sinks [Hq], d bias with bias_stride).
  std::unique_ptr<GuardedBuffer> sinks, slopes, bias, dsinks, dbias, cmask, bmask;
  if (!t.custom_mask.empty())
    cmask = make("custom_mask", t.custom_mask.size(), poison), cmask->upload(t.custom_mask.data());
  if (!t.block_mask.empty()) bmask = make("block_mask", t.block_mask.size(), poison), bmask->upload(t.block_mask.data());
  if (!t.sinks.empty()) sinks = make("sinks", t.sinks.size() * 4, poison), sinks->upload(t.sinks.data());
  if (!t.alibi_slopes.empty())
    slopes = make("alibi_slopes", t.alibi_slopes.size() * 4, poison), slopes->upload(t.alibi_slopes.data());
  if (!t.bias.empty()) bias = make("bias", t.bias.size() * 4, poison), bias->upload(t.bias.data());
  if (p.variants & AF_VARIANT_SINK)
    dsinks = make("dsinks", static_cast<size_t>(p.heads_q) * 4, poison), dsinks->fill_payload(opts.output_poison);
  if ((p.variants & AF_VARIANT_BIAS) && !t.bias.empty())
    dbias = make("dbias", t.bias.size() * 4, poison), dbias->fill_payload(opts.output_poison);
  auto make_mask = [&](const char* name, size_t bytes, uint32_t) { return make(name, bytes, poison); };
  std::unique_ptr<GuardedBuffer> dmask = exported_mask_buffer(p, make_mask);  // the backward writes its mask too
  auto upload = [&](GuardedBuffer& gb, const std::vector<float>& x) {
    if (p.dtype == AF_DTYPE_F32)
      gb.upload(x.data());
    else
      gb.upload(encode_tensor(x, p.dtype).data());
  };
  upload(*q, t.q);
  upload(*kb, t.k);
  upload(*v, t.v);
  upload(*o, o_in);
  lse->upload(lse_in.data());
  upload(*dout, t.dout);
  for (GuardedBuffer* gb : {dq.get(), dk.get(), dv.get()}) gb->fill_payload(format_poison(p.dtype, opts.output_poison));
  if (ws) ws->fill_payload(opts.output_poison);
  af_buffers b{};
  b.q = q->data();
  b.k = kb->data();
  b.v = v->data();
  b.o = o->data();
  b.lse = static_cast<float*>(lse->data());
  b.workspace = ws ? ws->data() : nullptr;
  b.dout = dout->data();
  b.dq = dq->data();
  b.dk = dk->data();
  b.dv = dv->data();
  b.sinks = sinks ? static_cast<const float*>(sinks->data()) : nullptr;
  b.alibi_slopes = slopes ? static_cast<const float*>(slopes->data()) : nullptr;
  b.bias = bias ? static_cast<const float*>(bias->data()) : nullptr;
  b.dsinks = dsinks ? static_cast<float*>(dsinks->data()) : nullptr;
  b.dbias = dbias ? static_cast<float*>(dbias->data()) : nullptr;
  b.dropout_mask = dmask ? static_cast<uint8_t*>(dmask->data()) : nullptr;
  b.custom_mask = cmask ? static_cast<const uint8_t*>(cmask->data()) : nullptr;
  b.block_mask = bmask ? static_cast<const uint8_t*>(bmask->data()) : nullptr;
  af_kernel bwd = k.kernel;  // the device layer launches `launch`: hand it the backward entry point
  bwd.launch = k.kernel.launch_bwd;
  bwd.workspace_bytes = k.kernel.bwd_workspace_bytes;
  const std::initializer_list<const GuardedBuffer*> all = {q.get(),     kb.get(),     v.get(),      o.get(),
                                                           lse.get(),   dout.get(),   dq.get(),     dk.get(),
                                                           dv.get(),    ws.get(),     sinks.get(),  slopes.get(),
                                                           bias.get(),  dsinks.get(), dbias.get(), dmask.get(),
                                                           cmask.get(), bmask.get()};
  out.launch = counted_launch(dev, bwd, p, b);
  locate_fault(out, all);
  if (!dev.usable()) return out;
  out.o = o_in;
  out.lse = lse_in;
  // The gradients come back with every guard zone in one read-back; a narrow dtype's through raw bytes.
  out.dq.resize(t.q.size());
  out.dk.resize(t.k.size());
  out.dv.resize(t.v.size());
  const bool f32 = p.dtype == AF_DTYPE_F32;
  std::vector<unsigned char> raw_dq(f32 ? 0 : dq->bytes()), raw_dk(f32 ? 0 : dk->bytes()), raw_dv(f32 ? 0 : dv->bytes());
  auto into = [&](std::vector<float>& x, std::vector<unsigned char>& raw) {
    return f32 ? static_cast<void*>(x.data()) : static_cast<void*>(raw.data());
  };
  if (dsinks) out.dsinks.resize(t.sinks.size());
  if (dbias) out.dbias.resize(t.bias.size());
  collect_canaries(dev, out, all,
                   {{dq.get(), into(out.dq, raw_dq)},
                    {dk.get(), into(out.dk, raw_dk)},
                    {dv.get(), into(out.dv, raw_dv)},
                    {dsinks.get(), out.dsinks.data()},
                    {dbias.get(), out.dbias.data()}});
  if (!f32)
    for (auto [x, raw] : {std::pair{&out.dq, &raw_dq}, std::pair{&out.dk, &raw_dk}, std::pair{&out.dv, &raw_dv}})
      decode_output(raw->data(), x->size(), p.dtype, 1.0f, opts.output_poison, x->data());
  if (dmask) read_exported_mask(p, *dmask, lse_in, out, out.keep_bwd);
  out.unwritten =
      count_poison_addressed(out.dq, p.q_stride, p.batch, p.seq_q, p.heads_q, p.head_dim, opts.output_poison) +
      count_poison_addressed(out.dk, p.k_stride, p.batch, p.seq_k, p.heads_kv, p.head_dim, opts.output_poison) +
      count_poison_addressed(out.dv, p.v_stride, p.batch, p.seq_k, p.heads_kv, p.head_dim_v, opts.output_poison);
  if (pool && out.launch.status == LaunchStatus::kOk && out.canary_words == 0)
    for (auto* gb : {&q, &kb, &v, &o, &lse, &dout, &dq, &dk, &dv, &ws, &sinks, &slopes, &bias, &dsinks, &dbias, &dmask,
                     &cmask, &bmask})
      if (*gb)
        pool->give(std::move(*gb), g,
                   (gb == &q || gb == &kb || gb == &v || gb == &o || gb == &dout || gb == &dq || gb == &dk || gb == &dv)
                       ? fpoison
                       : poison);
  return out;
}

LaunchOutcome launch_for_pass(Device& dev, const KernelEntry& k, PreparedCase& pc, const Tensors& t,
                              const RunOptions& opts) {
  const Problem& p = pc.problem();
  switch (pc.the_case().pass) {
    case Pass::kFwd: return launch_guarded(dev, k, p, t, opts);
    case Pass::kBwd: return launch_guarded_bwd(dev, k, p, t, pc.given_o(opts.oracle), pc.given_lse(opts.oracle), opts);
    case Pass::kFwdBwd: break;
  }
  LaunchOutcome fwd = launch_guarded(dev, k, p, t, opts);
  if (fwd.launch.status != LaunchStatus::kOk || !dev.usable() || fwd.canary_words) return fwd;
  std::vector<float> lse = fwd.lse;
  if (lse.empty()) lse.assign(static_cast<size_t>(lse_elements(p)), 0.0f);  // refused earlier: no LSE written
  LaunchOutcome bwd = launch_guarded_bwd(dev, k, p, t, fwd.o, lse, opts);
  bwd.o = std::move(fwd.o);
  bwd.lse = std::move(fwd.lse);
  bwd.keep = std::move(fwd.keep);  // the forward's exported mask (the backward's is keep_bwd)
  if (fwd.keep_bad && !bwd.keep_bad) bwd.keep_bad_first = fwd.keep_bad_first;
  bwd.keep_bad += fwd.keep_bad;
  bwd.unwritten += fwd.unwritten;
  bwd.launch.ms += fwd.launch.ms;
  return bwd;
}

const char* const kBackwardOnly = "the kernel is backward-only (no forward launch): it does not claim forward cases";

std::string case_unsupported_reason(const af_kernel& k, const Problem& p, Pass pass) {
  Problem asked = p;
  asked.pass = pass == Pass::kBwd ? AF_PASS_BACKWARD : AF_PASS_FORWARD;
  if (std::string why = unsupported_reason(k, asked); !why.empty()) return why;
  if (std::string why = pass_unsupported_reason(k, pass, p.dtype); !why.empty()) return why;
  if (pass == Pass::kFwdBwd && k.check_support) {  // fwd+bwd: its own check also sees the backward launch
    asked.pass = AF_PASS_BACKWARD;
    if (std::string why = unsupported_reason(k, asked); !why.empty()) return why;
  }
  return {};
}

std::string pass_unsupported_reason(const af_kernel& k, Pass pass, int32_t dtype) {
  if (pass != Pass::kBwd && !k.launch) return kBackwardOnly;
  if (!has_backward(pass)) return {};
  if (!k.launch_bwd) return "the kernel has no backward launch (launch_bwd): it does not claim backward cases";
  if (dtype != AF_DTYPE_F32 && !(k.dtypes & AF_SUPPORTS_BWD(dtype)))
    return std::string("the kernel's backward launch does not take ") + dtype_name(dtype) +
           " (AF_SUPPORTS_BWD in dtypes): f32 only";
  if (pass == Pass::kFwdBwd && !k.writes_lse)
    return "fwd+bwd feeds the kernel's own forward LSE to its backward, and the kernel does not write LSE";
  return {};
}

namespace {
// Whether a launch's keep mask is the case's reference mask (always so without dropout or with a declared generator).
bool reference_keep(const PreparedCase& pc, const std::vector<uint8_t>& exported) {
  return exported.empty() || exported == pc.keep_mask();
}
}  // namespace

std::vector<GradMap> judge_gradients(PreparedCase& pc, const LaunchOutcome& out, const RunOptions& opts,
                                     CheckResult& r) {
  const Problem& p = pc.problem();
  CompareOptions co;
  co.worst = opts.worst;
  if (pc.the_case().pass == Pass::kBwd && reference_keep(pc, out.keep_bwd))
    return compare_gradients(p, pc.grad(opts.oracle), out.dq.data(), out.dk.data(), out.dv.data(), r, co,
                             out.dsinks.empty() ? nullptr : out.dsinks.data(),
                             out.dbias.empty() ? nullptr : out.dbias.data());
  const GradResult g = grad_oracle_for(pc, out, opts);
  return compare_gradients(p, g, out.dq.data(), out.dk.data(), out.dv.data(), r, co,
                           out.dsinks.empty() ? nullptr : out.dsinks.data(),
                           out.dbias.empty() ? nullptr : out.dbias.data());
}

GradResult grad_oracle_for(PreparedCase& pc, const LaunchOutcome& out, const RunOptions& opts) {
  const bool ref = reference_keep(pc, out.keep_bwd);  // dropout: the backward's own exported mask, if another
  const bool bwd = pc.the_case().pass == Pass::kBwd;
  if (bwd && ref) return pc.grad(opts.oracle);
  const Tensors& t = pc.tensors();
  GradOptions go = grad_options(opts.oracle);
  go.forward = ref ? &pc.full_forward(opts.oracle) : nullptr;
  const std::vector<float>& o = bwd ? pc.given_o(opts.oracle) : out.o;
  const std::vector<float>& lse = bwd ? pc.given_lse(opts.oracle) : out.lse;
  return compute_grad_oracle(pc.problem(), t.q.data(), t.k.data(), t.v.data(), t.dout.data(), o.data(), lse.data(),
                             with_keep(pc, launch_keep(pc, out.keep_bwd)), go);
}

void merge_gradient_judgement(CheckResult& r, CheckResult& cmp) {
  const bool had_output = r.compared > 0;  // fwd+bwd: O / LSE were compared first
  r.compared += cmp.compared;
  r.failed += cmp.failed;
  r.max_ratio = std::max(r.max_ratio, cmp.max_ratio);
  r.max_abs_err = std::max(r.max_abs_err, cmp.max_abs_err);
  r.oracle_ms += cmp.oracle_ms;
  if (!had_output || (r.verdict != Verdict::kFail && cmp.verdict == Verdict::kFail)) {
    r.worst = std::move(cmp.worst);
  } else {
    r.worst.insert(r.worst.end(), cmp.worst.begin(), cmp.worst.end());
  }
  r.evidence.insert(r.evidence.end(), cmp.evidence.begin(), cmp.evidence.end());
  if (cmp.verdict == Verdict::kFail) {
    if (r.verdict != Verdict::kFail) {  // the first failure found names the class
      r.tensor = cmp.tensor;
      r.verdict = Verdict::kFail;
      r.failure = cmp.failure;
      r.reason = cmp.reason;
    }
  } else if (r.verdict != Verdict::kFail && cmp.verdict == Verdict::kOutsideContract) {
    r.verdict = Verdict::kOutsideContract;
    r.reason = cmp.reason;
  }
}

RunOptions for_kernel(const RunOptions& opts, const af_kernel& k, const Problem& p) {
  RunOptions o = opts;
  if (p.dtype == AF_DTYPE_F16 || p.dtype == AF_DTYPE_BF16) {
    o.oracle.compute_model = k.compute_model;
    o.oracle.score_add_in_dtype = (k.flags & AF_KERNEL_SCORE_ADD_IN_DTYPE) != 0;
  }
  return o;
}

namespace {
// Merge cases: the merged output against the whole problem's exact result under the composed bound (check/merge.h);
// a failure here when the merge of the given states passed means the states and the whole problem disagree.
void judge_merge_whole(PreparedCase& pc, const LaunchOutcome& lo, const RunOptions& opts, CheckResult& r) {
  const OracleResult* whole = pc.merge_whole(opts.oracle);
  if (!whole || r.verdict != Verdict::kPass) return;
  CheckResult cmp;
  CompareOptions co;
  co.worst = opts.worst;
  compare_output(pc.view(), *whole, lo.o.data(), lo.lse.empty() ? nullptr : lo.lse.data(), cmp, co);
  if (cmp.verdict != Verdict::kFail) return;
  r.verdict = Verdict::kFail;
  r.failure = cmp.failure;
  r.reason = "within the bound of the given states' merge, but not of the whole problem's exact result: " + cmp.reason;
  r.worst = std::move(cmp.worst);
  r.max_ratio = cmp.max_ratio;
  r.failed = cmp.failed;
  r.evidence.push_back({"merge-whole", "compared with the whole problem (every key, one launch's exact result) under "
                                       "the merge bound plus the states' rounding"});
}
}  // namespace

Judged check_case(Device& dev, const KernelEntry& k, PreparedCase& pc, const RunOptions& given) {
  const RunOptions opts = for_kernel(given, k.kernel, pc.problem());
  Judged j;
  CheckResult& r = j.result;
  r.kernel = k.kernel.name;
  r.backend = backend_name(k.backend);
  r.device = dev.name();
  const Problem& p = pc.problem();
  const Pass pass = pc.the_case().pass;
  if (std::string why = case_unsupported_reason(k.kernel, p, pass); !why.empty()) {
    r.verdict = Verdict::kUnsupported;
    r.reason = why;
    return j;
  }
  j.outcome = launch_for_pass(dev, k, pc, pc.tensors(), opts);
  const LaunchOutcome& lo = j.outcome;
  r.launch_ms = lo.launch.ms;
  auto fail = [&](FailureClass c, std::string reason) {
    if (r.verdict != Verdict::kFail) {  // the first failure found names the class
      r.verdict = Verdict::kFail;
      r.failure = c;
      r.reason = std::move(reason);
    }
  };
  // Malformed metadata (docs/semantics.md "Malformed metadata"): a refusal is the contract kept; any other outcome is
  // judged below with the defect named in the evidence.
  const bool malformed = pc.tensors().malformed.kind != Malformation::kNone;
  const std::string what = malformed ? describe_malformation(pc.problem(), pc.tensors()) : std::string();
  if (malformed) {
    if (lo.launch.status == LaunchStatus::kLaunchError) {
      r.evidence.push_back({"malformed", "refused " + what + ": " + lo.launch.message});
      return j;
    }
    r.evidence.push_back({"malformed", what});
  }
  switch (lo.launch.status) {
    case LaunchStatus::kOk: break;
    case LaunchStatus::kCrash:
      if (!lo.fault_buffer.empty()) {  // it faulted in the guard pages of a buffer: out of bounds, and where
        const int access = lo.launch.fault_access;  // 1 read, 2 write, 0 unknown
        fail(access == 1 ? FailureClass::kOobRead : access == 2 ? FailureClass::kOobWrite : FailureClass::kCrash,
             std::string("the kernel ") + (access == 1 ? "read" : access == 2 ? "wrote" : "accessed memory") + " " +
                 lo.fault_where + ", in the guard pages around it (the access faulted)");
        r.evidence.push_back({"guard-page", "buffer " + lo.fault_buffer + " byte offset " +
                                                std::to_string(lo.fault_offset) +
                                                (access == 1 ? ": read" : access == 2 ? ": write" : "")});
      } else if (lo.launch.message.rfind("memory grows", 0) == 0) {
        fail(FailureClass::kCrash, "the kernel leaks: " + lo.launch.message);
      } else {
        const std::string& m = lo.launch.message;  // the device may already say it ("the kernel crashed: signal 11")
        fail(FailureClass::kCrash, m.rfind("the kernel crashed", 0) == 0 ? m : "the kernel crashed: " + m);
      }
      break;
    case LaunchStatus::kHang: fail(FailureClass::kHang, "the kernel hung: " + lo.launch.message); break;
    case LaunchStatus::kLaunchError:
      fail(FailureClass::kLaunchError, "launch error on a supported case: " + lo.launch.message);
      break;
  }
  if (r.verdict == Verdict::kFail) {
    // One account per access: a fault located in a buffer's guard pages is told by the reason and the
    // guard-page line (the device's generic "outside any mapped memory" would contradict them), and a reason
    // that already quotes the device's message is not repeated under it.
    if (lo.fault_buffer.empty() && r.reason.find(lo.launch.message) == std::string::npos)
      r.evidence.push_back({"launch", lo.launch.message});
    return j;
  }
  if (lo.canary_words && !lo.seq_gap_write.empty())
    fail(FailureClass::kOobWrite, std::to_string(lo.canary_words) +
                                      " output element(s) outside every sequence written; first: " + lo.seq_gap_write);
  if (lo.canary_words) {
    const CanaryHit& h = lo.canaries.front();
    const bool narrow = h.buffer == "q" || h.buffer == "k" || h.buffer == "v" || h.buffer == "o";
    const int64_t es = narrow ? dtype_bytes(p.dtype) : 4;
    const int64_t elem = h.offset >= 0 ? h.offset / es : -((-h.offset + es - 1) / es);
    fail(FailureClass::kOobWrite, std::to_string(lo.canary_words) +
                                      " guard word(s) overwritten; first: buffer " + h.buffer + " element " +
                                      std::to_string(elem) + " (" +
                                      (h.offset < 0 ? "before the start" : "past the end") + ")");
    if (lo.backward) r.tensor = h.buffer == "dq" ? "dQ" : h.buffer == "dk" ? "dK" : h.buffer == "dv" ? "dV" : h.buffer;
    for (const CanaryHit& c : lo.canaries) {
      float f;
      std::memcpy(&f, &c.got, 4);
      r.evidence.push_back({"canary", "buffer " + c.buffer + " byte offset " + std::to_string(c.offset) +
                                          ": " + hex32(c.got) + " (" + std::to_string(f) +
                                          ") instead of poison " + hex32(c.expected)});
    }
  }
  if (malformed && r.verdict != Verdict::kFail && !malformation_has_answer(pc.tensors().malformed.kind)) {
    fail(FailureClass::kAcceptedMalformed, "accepted malformed metadata that has no right answer (the launch returned "
                                           "0): " + what);
    r.decided_by = std::string("malformed/") + malformation_name(pc.tensors().malformed.kind);  // the signature's kind
    return j;
  }
  if (lo.unwritten)
    r.evidence.push_back({"poison", std::to_string(lo.unwritten) +
                                        " output element(s) still hold the pre-launch poison " +
                                        hex32(opts.output_poison) +
                                        " (the unwritten detector relaunches with a second poison)"});
  if (p.variants & AF_VARIANT_DROPOUT) {  // docs/semantics.md "Dropout": the mask checks that need no oracle
    DropoutJudgement dj = judge_dropout_masks(pc, lo);
    if (!dj.failed) {
      DropoutJudgement inv = dropout_invariance(dev, k, pc, lo, opts);
      dj.evidence.insert(dj.evidence.end(), inv.evidence.begin(), inv.evidence.end());
      dj.failed = inv.failed, dj.reason = inv.reason;
    }
    r.evidence.insert(r.evidence.end(), dj.evidence.begin(), dj.evidence.end());
    if (dj.failed) fail(FailureClass::kDropout, dj.reason);
  }
  if (pass == Pass::kBwd) {  // backward alone: only the gradients are outputs
    CheckResult cmp;
    const auto t0 = std::chrono::steady_clock::now();
    j.grad_maps = judge_gradients(pc, lo, opts, cmp);
    r.oracle_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    merge_gradient_judgement(r, cmp);
    return j;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<OracleResult> own;  // dropout: O is exact given the kernel's own exported mask
  if (!reference_keep(pc, lo.keep))
    own = compute_oracle(p, pc.tensors().q.data(), pc.tensors().k.data(), pc.tensors().v.data(), with_keep(pc, lo.keep),
                         opts.oracle);
  const OracleResult* exact = own ? &*own : &pc.oracle(opts.oracle);
  r.oracle_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CheckResult cmp;
  CompareOptions co;
  co.worst = opts.worst;
  j.ratio_map = compare_output(pc.view(), *exact, lo.o.data(), lo.lse.empty() ? nullptr : lo.lse.data(), cmp, co);
  if (cmp.verdict == Verdict::kFail && exact->base_o.empty() && opts.oracle.baseline && !own) {
    exact = &pc.oracle_with_baseline(opts.oracle);  // a failure's "fp32 baseline ratio" (the same verdict)
    cmp = CheckResult{};
    j.ratio_map = compare_output(pc.view(), *exact, lo.o.data(), lo.lse.empty() ? nullptr : lo.lse.data(), cmp, co);
  }
  r.worst = std::move(cmp.worst);
  r.max_ratio = cmp.max_ratio;
  r.max_abs_err = cmp.max_abs_err;
  r.baseline_max_ratio = cmp.baseline_max_ratio;
  r.compared = cmp.compared;
  r.failed = cmp.failed;
  r.evidence.insert(r.evidence.end(), cmp.evidence.begin(), cmp.evidence.end());
  if (cmp.verdict == Verdict::kFail) {  // a malformation with a right answer (the well-formed one) not returned
    fail(malformed ? FailureClass::kAcceptedMalformed : cmp.failure,
         malformed ? "accepted malformed metadata and returned other than its right answer: " + cmp.reason : cmp.reason);
    if (malformed && r.failure == FailureClass::kAcceptedMalformed)
      r.decided_by = std::string("malformed/") + malformation_name(pc.tensors().malformed.kind);
    if (pass == Pass::kFwdBwd && r.tensor.empty())
      r.tensor = !r.worst.empty() && r.worst.front().is_lse ? "LSE" : "O";
  } else if (r.verdict != Verdict::kFail && cmp.verdict == Verdict::kOutsideContract) {
    r.verdict = Verdict::kOutsideContract;
    r.reason = cmp.reason;
  }
  judge_merge_whole(pc, lo, opts, r);
  if (pass == Pass::kFwdBwd && lo.backward) {  // the kernel's own forward fed its backward: judge that too
    CheckResult g;
    j.grad_maps = judge_gradients(pc, lo, opts, g);
    merge_gradient_judgement(r, g);
  }
  return j;
}

}  // namespace attnfuzz
