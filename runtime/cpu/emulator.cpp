// emulator.cpp - runs HIP kernels on the CPU: one fiber per GPU thread, rounds between barriers, chosen order.
//
// A block's fibers run on one OS thread. A round resumes every runnable fiber once, in forward,
// reverse or seeded-shuffle order; a fiber runs until it reaches __syncthreads(), a warp shuffle or
// its end, and then switches straight to the round's next fiber (the last one back to the scheduler):
// one context switch per fiber and round. A block barrier opens when every thread of the block waits at
// it; a warp exchange when every live lane of the warp does. __shared__ is `static thread_local`: one
// block at a time per OS thread. Under ThreadSanitizer every fiber is a TSan fiber and barriers are
// release/acquire pairs, so a missing barrier is reported as a data race on the shared variable with both
// source lines.
#include "runtime/cpu/emulator.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include <boost/context/detail/fcontext.hpp>

#include "attnfuzz/hip_cpu.h"

#if defined(ATTNFUZZ_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace hipemu {

__thread const FiberIds* tl_ids = nullptr;

Config& config() {
  static Config c;
  return c;
}

namespace {
std::atomic<uint64_t> g_progress_own{0};
std::atomic<std::atomic<uint64_t>*> g_progress{&g_progress_own};
}  // namespace

std::atomic<uint64_t>* progress_counter() { return g_progress.load(std::memory_order_relaxed); }
void set_progress_counter(std::atomic<uint64_t>* c) { g_progress.store(c ? c : &g_progress_own); }

namespace {

namespace bcd = boost::context::detail;

#if defined(ATTNFUZZ_TSAN)
// Must be inlined even at -O0, or TSan's shadow call stacks get unbalanced across the switch.
__attribute__((always_inline)) inline void ts_switch(void* f, unsigned flags) { __tsan_switch_to_fiber(f, flags); }
inline void ts_release(void* a) { __tsan_release(a); }
inline void ts_acquire(void* a) { __tsan_acquire(a); }
inline void* ts_create() { return __tsan_create_fiber(0); }
inline void ts_destroy(void* f) { __tsan_destroy_fiber(f); }
inline void* ts_current() { return __tsan_get_current_fiber(); }
#else
inline void ts_switch(void*, unsigned) {}
inline void ts_release(void*) {}
inline void ts_acquire(void*) {}
inline void* ts_create() { return nullptr; }
inline void ts_destroy(void*) {}
inline void* ts_current() { return nullptr; }
#endif
constexpr unsigned kNoSync = 1;  // __tsan_switch_to_fiber_no_sync

// Emulator bookkeeping is not kernel data: relaxed atomics keep TSan quiet about it.
template <class T>
T ld(const T& v) { return __atomic_load_n(&v, __ATOMIC_RELAXED); }
template <class T>
void st(T& v, T x) { __atomic_store_n(&v, x, __ATOMIC_RELAXED); }
void set_ids(const FiberIds* ids) { st(tl_ids, ids); }  // what threadIdx etc. read (hip_cpu.h: ids())

// ---- errors ----
std::mutex g_err_mu;
int g_err_code = hipSuccess;
std::string g_err_msg;

// ---- fiber stacks: a global pool of mmap'd stacks, each with a guard page below ----
std::mutex g_stack_mu;
std::vector<void*> g_stacks;
size_t g_stack_bytes = 0;

void* stack_map() {
  const size_t n = config().stack_bytes + 4096;
  char* p = static_cast<char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (p == MAP_FAILED) return nullptr;
  mprotect(p, 4096, PROT_NONE);
  // Page-aligned stack tops would put every fiber's saved context in the same L1 cache sets (4 KiB
  // aliasing); a different 64-byte colour per stack spreads them.
  static std::atomic<unsigned> colour{0};
  return p + n - (colour.fetch_add(1, std::memory_order_relaxed) % 61) * 64;  // top of the stack
}
// n stacks into out (tops), from the pool (one lock) and new mappings; false when memory ran out.
bool stacks_get(size_t n, std::vector<void*>& out) {
  out.clear();
  {
    std::lock_guard<std::mutex> lk(g_stack_mu);
    if (g_stack_bytes != config().stack_bytes) {  // size changed: drop the pool (stacks leak; rare)
      g_stacks.clear();
      g_stack_bytes = config().stack_bytes;
    }
    const size_t take = std::min(n, g_stacks.size());
    out.assign(g_stacks.end() - static_cast<std::ptrdiff_t>(take), g_stacks.end());
    g_stacks.resize(g_stacks.size() - take);
  }
  while (out.size() < n) {
    void* top = stack_map();
    if (!top) return false;
    out.push_back(top);
  }
  return true;
}
void stacks_put(std::vector<void*>& v) {
#if defined(ATTNFUZZ_TSAN)
  // Under TSan a reused stack keeps the shadow of the finished fibers' accesses, and the next block's
  // first writes to it are reported as races with them: unmap instead (fresh mappings get clean shadow).
  for (void* top : v)
    if (top) {  // the top sits below the mapping's end by its colour (< one page)
      const uintptr_t end = (reinterpret_cast<uintptr_t>(top) + 4095) & ~uintptr_t{4095};
      munmap(reinterpret_cast<char*>(end) - (g_stack_bytes + 4096), g_stack_bytes + 4096);
    }
  v.clear();
  return;
#endif
  std::lock_guard<std::mutex> lk(g_stack_mu);
  g_stacks.insert(g_stacks.end(), v.begin(), v.end());
}

// ---- shuffled thread orders, kept between launches ----
// A block's shuffled order in round r depends only on (seed, block index) and its thread count, and a
// campaign launches the same small grids case after case: each block's orders are drawn once (mt19937_64's
// seeding and first refill cost as much as a small block's fiber switches) and replayed from a tape after.
using Tape = std::vector<uint16_t>;          // the recorded rounds, n thread indices each
constexpr size_t kTapeMaxEntries = 1 << 16;  // per tape; a longer block draws its later rounds itself
// All tapes kept, at most: a tape that would pass it is dropped, so the small grids that come first (and
// the low block indices every grid has) keep theirs. Far below the cpu device's leak limit (4 MiB kept by
// each of two launches in a row), which a store growing with every new grid would trip.
constexpr size_t kTapesMaxBytes = 1 << 20;
static_assert(kMaxThreadsPerBlock <= 65536, "tapes hold thread indices as uint16_t");
using TapeKey = std::pair<uint64_t, unsigned>;  // (mt19937_64 seed, threads)
struct TapeKeyHash {
  size_t operator()(const TapeKey& k) const { return std::hash<uint64_t>()(k.first * 31 + k.second); }
};
std::mutex g_tape_mu;
std::unordered_map<TapeKey, Tape, TapeKeyHash> g_tapes;
size_t g_tape_bytes = 0;

// The tape of this key, taken out of the store (a block uses it alone); empty if none.
Tape tape_take(const TapeKey& key) {
  std::lock_guard<std::mutex> lk(g_tape_mu);
  auto it = g_tapes.find(key);
  if (it == g_tapes.end()) return {};
  Tape t = std::move(it->second);
  g_tapes.erase(it);
  g_tape_bytes -= t.capacity() * sizeof(uint16_t);
  return t;
}

void tape_give(const TapeKey& key, Tape t) {
  std::lock_guard<std::mutex> lk(g_tape_mu);
  const size_t bytes = t.capacity() * sizeof(uint16_t);
  if (t.empty() || g_tape_bytes + bytes > kTapesMaxBytes) return;  // dropped
  if (g_tapes.emplace(key, std::move(t)).second) g_tape_bytes += bytes;  // one given back meanwhile stays
}

// The thread order of each round of one block: fixed (forward, reverse) or shuffled: the r-th std::shuffle
// of iota(n) by std::mt19937_64(seed * 0x9E3779B97F4A7C15 + block), replayed from the tape as far as it was
// recorded, drawn (and recorded) after that.
class RoundOrder {
 public:
  RoundOrder(const Config& cfg, uint64_t lin, unsigned n)
      : n_(n), shuffle_(cfg.order == Order::kShuffle), key_{cfg.seed * 0x9E3779B97F4A7C15ull + lin, n} {
    if (shuffle_) {
      tape_ = tape_take(key_);
      return;
    }
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), 0u);
    if (cfg.order == Order::kReverse) std::reverse(order_.begin(), order_.end());
  }
  ~RoundOrder() {
    if (shuffle_) tape_give(key_, std::move(tape_));
  }
  // Calls f(thread) for each thread of round r (r = 0, 1, 2, ... in turn), in this round's order.
  template <class F>
  void each(unsigned r, F&& f) {
    if (!shuffle_) {
      for (unsigned k : order_) f(k);
      return;
    }
    const size_t at = size_t{r} * n_;
    if (at + n_ <= tape_.size()) {
      for (size_t i = at; i < at + n_; ++i) f(unsigned{tape_[i]});
      return;
    }
    if (!rng_) {  // past the tape: the generator as it stands after the recorded rounds
      rng_.emplace(key_.first);
      order_.resize(n_);
      std::iota(order_.begin(), order_.end(), 0u);
      for (size_t k = 0; k < tape_.size() / n_; ++k) std::shuffle(order_.begin(), order_.end(), *rng_);
    }
    std::shuffle(order_.begin(), order_.end(), *rng_);
    if (at == tape_.size() && at + n_ <= kTapeMaxEntries) tape_.insert(tape_.end(), order_.begin(), order_.end());
    for (unsigned k : order_) f(k);
  }

 private:
  unsigned n_;
  bool shuffle_;
  TapeKey key_;
  Tape tape_;
  std::vector<unsigned> order_;
  std::optional<std::mt19937_64> rng_;
};

enum class State : int { kReady, kAtBarrier, kAtWarp, kDone };

struct Block;
struct alignas(64) Fiber {  // two cache lines: the switch path's fields, then the ids the kernel reads
  bcd::fcontext_t self = nullptr;  // where it resumes (made when the block starts)
  void* tsan = nullptr;
  Block* blk = nullptr;
  State state = State::kReady;
  unsigned bar_gen = 0, warp_gen = 0;
  int line = 0;
  const char* file = "";
  void* stack = nullptr;
  FiberIds ids;
};

struct Block {
  dim3 bid, bdim, gdim;
  void (*fn)(void*) = nullptr;
  void* ctx = nullptr;
  unsigned n = 0, warp = 32;
  std::vector<Fiber> th;
  std::vector<uint64_t> slots;       // warp exchange values, one per thread
  std::vector<char> warp_sync;       // TSan sync objects: 2 per warp
  char bar_sync[2] = {0, 0}, done_sync = 0, start_sync = 0;
  void* sched_tsan = nullptr;
  bcd::fcontext_t sched = nullptr;   // the scheduler, while a round runs
  // This round's runnable fibers in run order (run_n of them; sized n at the block's start, so the fibers
  // read it while the scheduler never reallocates it), and the index of the one running.
  std::vector<Fiber*> run;
  unsigned run_n = 0, pos = 0;
  std::vector<void*> run_stacks;  // the fibers' stacks (kept: no allocation per block)
  // Counters kept by the fibers as they arrive, so a round ends without rescanning every thread.
  unsigned done = 0, at_bar = 0, at_warp = 0;
  const char* bar_file = nullptr;  // site of the first arrival at the current barrier
  int bar_line = 0;
  bool bar_mixed = false;          // a later arrival waits at another __syncthreads()
};

__thread Fiber* tl_fiber = nullptr;
__thread char* tl_start_sync = nullptr;  // the running block's start_sync (TSan builds)

// ---- switching ----
// A context that jumps passes where its own context is to be saved (the running fiber's `self`, the
// scheduler's `sched`; null for a fiber that ended); the context it lands in saves it there. Under TSan the
// switches carry no synchronisation: fibers are ordered by the barriers' release/acquire pairs only, and
// `start_sync` orders the block's set-up before every fiber's first instruction.

// Where a switch goes: the context, where the running one is saved, and the TSan fiber of the target.
struct Next {
  bcd::fcontext_t to;
  bcd::fcontext_t* slot;
  void* tsan;
};

// The round's fiber at index `next` (the running one's context to be saved in *slot), or the scheduler past
// the last: where to switch. Sets the identity the next one reads (tl_ids, tl_fiber).
Next handoff(Block& b, unsigned next, bcd::fcontext_t* slot) {
  const unsigned count = ld(b.run_n);
  st(b.pos, next);
  if (next < count) {
    Fiber* f = ld(b.run[next]);
    // While it runs, fetch what the next ones touch first: the top of the stack of the one after it (its
    // Fiber was fetched a switch ago), and the Fiber of the one after that.
    if (next + 1 < count) {
      if (const char* top = static_cast<const char*>(ld(ld(b.run[next + 1])->self)))
        for (int line = 0; line < 4; ++line) __builtin_prefetch(top + 64 * line);
      if (next + 2 < count) {
        const char* g = reinterpret_cast<const char*>(ld(b.run[next + 2]));
        __builtin_prefetch(g);
        __builtin_prefetch(g + 64);
      }
    }
    set_ids(&f->ids);
    st(tl_fiber, f);
    return {ld(f->self), slot, f->tsan};
  }
  set_ids(nullptr);
  st(tl_fiber, (Fiber*)nullptr);
  return {ld(b.sched), slot, b.sched_tsan};
}

// Switches as h says and returns what the context that later resumes this one passed. Under TSan nothing
// may be read between the TSan fiber switch and the jump (it would count as the next fiber's read), and it
// is inlined, as ts_switch is, so that no call returns across the switch.
__attribute__((always_inline)) inline bcd::transfer_t switch_to(const Next& h) {
  const bcd::fcontext_t to = h.to;
  void* const slot = h.slot;
#if defined(ATTNFUZZ_TSAN)
  ts_switch(h.tsan, kNoSync);
#endif
  return bcd::jump_fcontext(to, slot);
}

// The running fiber hands the OS thread on (handoff()); returns when it is resumed.
void pass_on(Block& b, bcd::fcontext_t* slot) { save_jumper(switch_to(handoff(b, ld(b.pos) + 1, slot))); }

void fiber_entry(bcd::transfer_t tr) {
  ts_acquire(ld(tl_start_sync));  // first: the block's set-up (Fibers, kernel arguments, ids) happens before
  save_jumper(tr);
  Fiber& f = *ld(tl_fiber);
  Block& b = *f.blk;
  b.fn(b.ctx);
  st(f.state, State::kDone);
  __atomic_fetch_add(&b.done, 1u, __ATOMIC_RELAXED);
  const Next h = handoff(b, ld(b.pos) + 1, nullptr);
  ts_release(&b.done_sync);  // after the fiber's last access to the block: the scheduler acquires it
  switch_to(h);              // never resumed
}

// One round: every fiber of b.run, in order, until each yields or ends.
void run_round(Block& b) {
  if (ld(b.run_n) == 0) return;
  save_jumper(switch_to(handoff(b, 0, &b.sched)));
}

// The calling fiber leaves the round until the scheduler makes it runnable again.
void yield(Fiber& f) { pass_on(*f.blk, &f.self); }

std::string site(const Fiber& f) {
  const char* base = std::strrchr(f.file, '/');
  return std::string(base ? base + 1 : f.file) + ":" + std::to_string(f.line);
}

// Runs one block to completion; returns an error message (empty on success).
// Steady-clock nanoseconds (the time a block of a launch last finished).
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// `last_done_ns`: when a block of this launch last finished (or the launch began); with a deadline the block is
// abandoned once no block has finished for deadline_ns (a slow launch that keeps finishing blocks is not hung).
std::string run_block(Block& b, const std::atomic<int64_t>& last_done_ns, int64_t deadline_ns, bool has_deadline) {
  const Config& cfg = config();
  b.th.assign(b.n, Fiber{});
  b.done = b.at_bar = b.at_warp = 0;
  b.bar_file = nullptr;
  b.bar_mixed = false;
  b.slots.assign(b.n, 0);
  b.warp_sync.assign(2 * ((b.n + b.warp - 1) / b.warp), 0);
  b.sched_tsan = ts_current();
  b.run.assign(b.n, nullptr);
  std::vector<void*>& stacks = b.run_stacks;
  if (!stacks_get(b.n, stacks)) {
    stacks_put(stacks);
    return "cannot allocate fiber stacks (out of memory)";
  }
  for (unsigned i = 0; i < b.n; ++i) {
    Fiber& f = b.th[i];
    f.blk = &b;
    f.ids.thread_idx = dim3(i % b.bdim.x, (i / b.bdim.x) % b.bdim.y, i / (b.bdim.x * b.bdim.y));
    f.ids.block_idx = b.bid;
    f.ids.block_dim = b.bdim;
    f.ids.grid_dim = b.gdim;
    f.ids.linear_tid = i;
    f.ids.warp_size = b.warp;
    f.ids.dynamic_shared = ld(tl_ids) ? ld(tl_ids)->dynamic_shared : nullptr;
    f.stack = stacks[i];
    f.self = bcd::make_fcontext(f.stack, cfg.stack_bytes, &fiber_entry);
    f.tsan = ts_create();
  }
  st(tl_start_sync, &b.start_sync);
  ts_release(&b.start_sync);
  set_ids(nullptr);
  const uint64_t lin = b.bid.x + uint64_t{b.gdim.x} * (b.bid.y + uint64_t{b.gdim.y} * b.bid.z);
  RoundOrder order(cfg, lin, b.n);

  std::string err;
  const unsigned nwarps = (b.n + b.warp - 1) / b.warp;
  for (unsigned round = 0;; ++round) {
    unsigned runnable = 0;
    order.each(round, [&](unsigned k) {
      if (ld(b.th[k].state) == State::kReady) st(b.run[runnable++], &b.th[k]);
    });
    st(b.run_n, runnable);
    run_round(b);
    st(tl_fiber, (Fiber*)nullptr);
    // Who may run next round?
    const unsigned done = ld(b.done), at_bar = ld(b.at_bar);
    if (done == b.n) break;
    bool progress = false;
    if (ld(b.at_warp)) {
      for (unsigned w = 0; w < nwarps; ++w) {  // warp exchanges whose live lanes have all arrived
        const unsigned lo = w * b.warp, hi = std::min(b.n, lo + b.warp);
        bool all = true, any = false;
        for (unsigned i = lo; i < hi; ++i) {
          const State s = ld(b.th[i].state);
          if (s == State::kAtWarp) any = true;
          else if (s != State::kDone) all = false;
        }
        if (!(any && all)) continue;
        for (unsigned i = lo; i < hi; ++i)
          if (ld(b.th[i].state) == State::kAtWarp) {
            st(b.th[i].state, State::kReady);
            st(b.at_warp, ld(b.at_warp) - 1);
          }
        progress = true;
      }
    }
    if (at_bar > 0 && at_bar + done == b.n) {
      auto bar_site = [&] {
        const char* base = std::strrchr(b.bar_file, '/');
        return std::string(base ? base + 1 : b.bar_file) + ":" + std::to_string(b.bar_line);
      };
      if (done > 0) {
        err = std::to_string(done) + " of " + std::to_string(b.n) +
              " threads exited while the others wait at __syncthreads() (" + bar_site() + ")";
      } else if (ld(b.bar_mixed) && cfg.strict_sites) {
        std::string sites;
        for (const Fiber& f : b.th)
          if (sites.find(site(f)) == std::string::npos) sites += (sites.empty() ? "" : ", ") + site(f);
        err = "threads wait at different __syncthreads() (" + sites + ")";
      } else {
        for (Fiber& f : b.th) st(f.state, State::kReady);
        st(b.at_bar, 0u);
        st(b.bar_mixed, false);
        progress = true;
      }
    }
    if (err.empty() && !progress) {
      err = "deadlock: no thread can proceed (" + std::to_string(at_bar) + " at __syncthreads, " +
            std::to_string(done) + " exited, the rest in a warp shuffle with missing lanes)";
    }
    if (err.empty() && has_deadline && now_ns() - last_done_ns.load(std::memory_order_relaxed) > deadline_ns) {
      char m[128];
      std::snprintf(m, sizeof m, "timeout: no block of the launch finished for %g s (hung at round %u)",
                    cfg.deadline_s, round);
      err = m;
    }
    if (!err.empty()) {
      char where[96];
      std::snprintf(where, sizeof where, "block (%u,%u,%u): ", b.bid.x, b.bid.y, b.bid.z);
      err = where + err;
      break;  // unfinished fibers are abandoned: their stacks are not reused
    }
  }
  ts_acquire(&b.done_sync);  // the whole block happens-before what follows
  std::vector<void*>& reuse = b.run_stacks;
  reuse.clear();
  for (Fiber& f : b.th) {
    ts_destroy(f.tsan);
    if (err.empty() || ld(f.state) == State::kDone) reuse.push_back(f.stack);
  }
  stacks_put(reuse);
  return err;
}

thread_local std::vector<unsigned char> tl_dynamic_shared;

Next arrive(const char* file, int line) {  // a barrier's arrival: bookkeeping, and where to switch
  Fiber& f = *ld(tl_fiber);
  const unsigned g = f.bar_gen;
  ts_release(&f.blk->bar_sync[g & 1]);  // arrival at barrier g
  f.file = file;
  f.line = line;
  f.bar_gen = g + 1;
  Block& b = *f.blk;
  if (ld(b.at_bar) == 0) {
    st(b.bar_file, file);
    st(b.bar_line, line);
  } else if (line != ld(b.bar_line) || (file != ld(b.bar_file) && std::strcmp(file, ld(b.bar_file)) != 0)) {
    st(b.bar_mixed, true);
  }
  st(b.at_bar, ld(b.at_bar) + 1);
  st(f.state, State::kAtBarrier);
  return handoff(b, ld(b.pos) + 1, &f.self);
}

void depart(bcd::transfer_t from) {  // a barrier's departure, when the fiber is resumed
  save_jumper(from);
  const Fiber& f = *ld(tl_fiber);
  ts_acquire(&f.blk->bar_sync[(f.bar_gen - 1) & 1]);  // sees every arrival at the barrier
}
}  // namespace

Handoff barrier_arrive(const char* file, int line) {
#if defined(ATTNFUZZ_TSAN)
  syncthreads(file, line);  // the switch, announced to TSan, and back
  return {nullptr, nullptr};
#else
  const Next n = arrive(file, line);
  return {n.to, n.slot};
#endif
}

void syncthreads(const char* file, int line) {  // TSan builds, and plug-ins built against an older hip_cpu.h
  depart(switch_to(arrive(file, line)));
}

uint64_t warp_exchange(uint64_t bits, int src_lane, const char* file, int line) {
  Fiber& f = *ld(tl_fiber);
  Block& b = *f.blk;
  const unsigned me = f.ids.linear_tid, warp = me / b.warp;
  char* sync = &b.warp_sync[2 * warp];
  b.slots[me] = bits;
  for (int phase = 0; phase < 2; ++phase) {  // publish, then read; the second wait guards slot reuse
    const unsigned g = f.warp_gen;
    ts_release(&sync[g & 1]);
    f.file = file;
    f.line = line;
    f.warp_gen = g + 1;
    st(b.at_warp, ld(b.at_warp) + 1);
    st(f.state, State::kAtWarp);
    yield(f);
    ts_acquire(&sync[g & 1]);
    if (phase == 0) bits = b.slots[std::min<unsigned>(warp * b.warp + (unsigned)src_lane, b.n - 1)];
  }
  return bits;
}

void set_last_error(int code, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lk(g_err_mu);
  if (g_err_code == hipSuccess) {  // keep the first error, as GPUs do
    g_err_code = code;
    g_err_msg = buf;
  }
}

int take_last_error() {
  std::lock_guard<std::mutex> lk(g_err_mu);
  const int c = g_err_code;
  g_err_code = hipSuccess;
  return c;
}

std::string last_error_message() {
  std::lock_guard<std::mutex> lk(g_err_mu);
  return g_err_msg;
}

int run_grid(dim3 g, dim3 bd, size_t dynamic_shared, void (*fn)(void*), void* ctx) {
  const Config& cfg = config();
  {
    std::lock_guard<std::mutex> lk(g_err_mu);
    if (g_err_code == hipSuccess) g_err_msg.clear();
  }
  const uint64_t nthreads = uint64_t{bd.x} * bd.y * bd.z;
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.y > kMaxGridDimYZ || g.z > kMaxGridDimYZ) {
    set_last_error(hipErrorInvalidConfiguration, "invalid grid (%u,%u,%u)", g.x, g.y, g.z);
    return hipErrorInvalidConfiguration;
  }
  if (nthreads == 0 || nthreads > kMaxThreadsPerBlock || bd.z > kMaxBlockDimZ) {
    set_last_error(hipErrorInvalidConfiguration, "invalid block (%u,%u,%u): at most %u threads, z <= %u", bd.x, bd.y,
                   bd.z, kMaxThreadsPerBlock, kMaxBlockDimZ);
    return hipErrorInvalidConfiguration;
  }
  if (dynamic_shared > cfg.max_dynamic_shared) {
    set_last_error(hipErrorInvalidConfiguration, "dynamic shared memory %zu bytes exceeds the limit of %zu",
                   dynamic_shared, cfg.max_dynamic_shared);
    return hipErrorInvalidConfiguration;
  }
  if (cfg.warp_size != 32 && cfg.warp_size != 64) {
    set_last_error(hipErrorInvalidValue, "warp size %u: must be 32 or 64", cfg.warp_size);
    return hipErrorInvalidValue;
  }
  const uint64_t nb = uint64_t{g.x} * g.y * g.z;
  const unsigned W = static_cast<unsigned>(std::max<uint64_t>(1, std::min<uint64_t>(cfg.workers, nb)));
  const bool has_deadline = cfg.deadline_s > 0;
  const int64_t deadline_ns = has_deadline ? static_cast<int64_t>(cfg.deadline_s * 1e9) : 0;
  std::atomic<int64_t> last_done_ns{now_ns()};
  std::atomic<uint64_t>* const progress = progress_counter();
  std::atomic<bool> failed{false};
  std::mutex msg_mu;
  std::string first_err;
  std::atomic<unsigned> started{0};
  auto work = [&](unsigned worker) {  // static striding: the same blocks meet on the same OS thread every run
    // The workers start their first blocks together, as a GPU's blocks do: a worker created first would
    // otherwise be done with its blocks before the last one exists, and blocks that race would never meet.
    started.fetch_add(1, std::memory_order_acq_rel);
    while (started.load(std::memory_order_acquire) < W) std::this_thread::yield();
    Block blk;
    blk.gdim = g;
    blk.bdim = bd;
    blk.fn = fn;
    blk.ctx = ctx;
    blk.n = static_cast<unsigned>(nthreads);
    blk.warp = cfg.warp_size;
    tl_dynamic_shared.assign(std::max<size_t>(dynamic_shared, 1), 0xff);  // NaN-filled: uninitialised reads show
    FiberIds proto{};
    proto.dynamic_shared = tl_dynamic_shared.data();
    for (uint64_t i = worker; i < nb && !failed.load(std::memory_order_relaxed); i += W) {
      blk.bid = dim3(static_cast<unsigned>(i % g.x), static_cast<unsigned>((i / g.x) % g.y),
                     static_cast<unsigned>(i / (uint64_t{g.x} * g.y)));
      std::fill(tl_dynamic_shared.begin(), tl_dynamic_shared.end(), 0xff);
      set_ids(&proto);
      std::string e = run_block(blk, last_done_ns, deadline_ns, has_deadline);
      set_ids(nullptr);
      if (e.empty()) {
        progress->fetch_add(1, std::memory_order_relaxed);
        if (has_deadline) last_done_ns.store(now_ns(), std::memory_order_relaxed);
      }
      if (!e.empty()) {
        std::lock_guard<std::mutex> lk(msg_mu);
        if (first_err.empty()) first_err = e;
        failed = true;
      }
    }
  };
  if (W == 1) {
    // A fresh thread also for one worker: __shared__ is thread_local, so on the calling thread a block
    // would start from what earlier launches (other cases) left there, and a racy kernel's output would
    // depend on the launch history (issue 11: a replay gave another class).
    std::thread(work, 0u).join();
  } else {
    std::vector<std::thread> ts;
    for (unsigned w = 0; w < W; ++w) ts.emplace_back(work, w);
    for (auto& t : ts) t.join();
  }
  if (failed) {
    set_last_error(hipErrorLaunchFailure, "%s", first_err.c_str());
    return hipErrorLaunchFailure;
  }
  return hipSuccess;
}

}  // namespace hipemu
