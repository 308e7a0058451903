// planted_kernels_test.cpp - planted plug-in loads, each bug is real and quiet; example plug-in passes.
//
// Each planted kernel has an exposing case (check_case on the cpu backend says kFail, while the correct
// kernel it varies passes the same case) and a quiet case (it passes: the bug needs the right shape, values
// or thread order to show). The failure class is printed, not asserted: classifying is issue 5's detectors'
// job; kernels/planted/README.md names the class each bug should get.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "attnfuzz/problem.h"
#include "attnfuzz/registry.h"
#include "attnfuzz/verdict.h"
#include "check/runner.h"
#include "tools/cli_common.h"

#ifndef ATTNFUZZ_PLANTED_PLUGIN
#error "ATTNFUZZ_PLANTED_PLUGIN (path of libattnfuzz_planted_cpu.so) must be defined"
#endif
#ifndef ATTNFUZZ_EXAMPLE_PLUGIN
#error "ATTNFUZZ_EXAMPLE_PLUGIN (path of libattnfuzz_example_plugin.so) must be defined"
#endif

namespace attnfuzz {
namespace {

// One case: shape, mask, values (distribution and specials), seed, and the emulator's thread order.
// mask is the README's case text after the shape: the mask, then for a sequence layout attn-check's flags
// ("none --seq-layout varlen --seqlens-q 3,17 --seqlens-k 5,40"; the batch is then the number of lengths, Sq and
// Sk follow from the lists, except decode's Sq and kvcache's capacity Sk).
struct Spec {
  int64_t b, hq, hkv, sq, sk, d, dv;
  const char* mask;
  const char* values = "uniform:1";
  const char* special = "";  // "" or a parse_special text
  ThreadOrder order = ThreadOrder::kForward;
  uint64_t seed = 1;
  int32_t dtype = AF_DTYPE_F32;        // issue 13: the low-precision planted kernels
  float descale[4] = {1, 1, 1, 1};     // fp8: q, k, v descale and o_scale
};

struct Planted {
  const char* name;            // the planted kernel
  const char* family;          // its af_kernel::family
  const char* correct;         // the built-in kernel it is a variation of
  const char* expected_class;  // docs/semantics.md class the detectors should give (kernels/planted/README.md)
  Spec exposing;               // check_case says kFail (and the correct kernel passes)
  Spec quiet;                  // check_case says kPass
};

// gtest prints the kernel's name for a parameter (instead of its bytes).
void PrintTo(const Planted& k, std::ostream* os) { *os << k.name; }

constexpr ThreadOrder kFwd = ThreadOrder::kForward, kRev = ThreadOrder::kReverse;

// Every planted kernel of the plug-in, with the case that exposes it and a case where it stays quiet.
const Planted kPlanted[] = {
    // Several key tiles: some row's max grows after the first tile. Quiet: one key tile (Sk <= 16).
    {"planted-no-acc-rescale",
     "planted/flash",
     "flash-bm16-bn16",
     "rescale",
     {1, 2, 1, 33, 100, 32, 32, "none"},
     {1, 2, 1, 7, 13, 32, 32, "causal-br"}},
    {"planted-no-sum-rescale",
     "planted/flash",
     "flash-bm16-bn16",
     "rescale",
     {1, 2, 1, 33, 100, 32, 32, "causal-br"},
     {1, 2, 1, 13, 16, 32, 32, "none"}},
    // Masked entries in a tile (causal). Quiet: no mask and Sk a multiple of the tile: nothing is masked.
    {"planted-masked-score-zero",
     "planted/flash",
     "flash-bm16-bn16",
     "mask",
     {1, 1, 1, 33, 33, 16, 16, "causal-tl"},
     {1, 1, 1, 20, 32, 16, 16, "none"}},
    // NaN in masked keys reaches the rows that see one key too many. Quiet: decode (Sq = 1) bottom-right:
    // the diagonal is the last key, there is no future key to see.
    {"planted-causal-off-by-one",
     "planted/flash",
     "flash-bm16-bn16",
     "mask",
     {1, 1, 1, 17, 17, 16, 16, "causal-tl", "uniform:1", "nan@k:masked*3"},
     {1, 2, 1, 1, 37, 16, 16, "causal-br", "uniform:1", "nan@k:masked*3"}},
    // Bottom-right with Sq != Sk. Quiet: Sq == Sk, where both alignments agree.
    {"planted-causal-top-left",
     "planted/flash",
     "flash-bm16-bn16",
     "mask",
     {1, 1, 1, 7, 13, 59, 59, "causal-br"},
     {1, 1, 1, 33, 33, 59, 59, "causal-br"}},
    // Sk not a multiple of BLOCK_N = 16: keys 33..47 come from k's guard zone. Quiet: Sk = 32.
    {"planted-tail-k-oob-read",
     "planted/flash",
     "flash-bm16-bn16",
     "oob-read",
     {1, 1, 1, 8, 33, 32, 32, "none"},
     {1, 1, 1, 8, 32, 32, 32, "none"}},
    // Sq not a multiple of BLOCK_M = 16: rows 17..31 land in o's guard zone. Quiet: Sq = 32.
    {"planted-tail-q-oob-write",
     "planted/flash",
     "flash-bm16-bn16",
     "oob-write",
     {1, 1, 1, 17, 16, 32, 32, "none"},
     {1, 1, 1, 32, 20, 32, 32, "none"}},
    // Reverse thread order: threads run before thread 0 publishes (alpha, beta). Quiet: forward order.
    {"planted-no-score-barrier",
     "planted/online-row",
     "online-row",
     "barrier-race",
     {1, 1, 1, 4, 20, 64, 64, "none", "uniform:1", "", kRev},
     {1, 1, 1, 4, 20, 64, 64, "none"}},
    // Rows with no visible key: causal-br with Sq > Sk. Quiet: causal-tl, every row sees key 0.
    {"planted-masked-row-nan",
     "planted/online-row",
     "online-row",
     "empty-row",
     {1, 1, 1, 9, 4, 16, 16, "causal-br"},
     {1, 1, 1, 9, 9, 16, 16, "causal-tl"}},
    // Forward order: thread 0 overwrites red[0] before threads 1.. read the max. Quiet: reverse order.
    {"planted-smem-reuse-race",
     "planted/materialized",
     "materialized",
     "barrier-race",
     {1, 1, 1, 4, 100, 16, 16, "none"},
     {1, 1, 1, 4, 100, 16, 16, "none", "uniform:1", "", kRev}},
    // Scores of magnitude ~100-300: exp(s) overflows. Quiet: the same shape with uniform:1 values.
    {"planted-no-max-sub",
     "planted/materialized",
     "materialized",
     "non-finite",
     {1, 1, 1, 8, 40, 32, 32, "none", "extreme:100"},
     {1, 1, 1, 8, 40, 32, 32, "none"}},
    // Sk = 40: 8 splits of 5 keys. Quiet: Sk <= 4 is one split, whose weight is 1 either way.
    {"planted-combine-wrong-weight",
     "planted/split-kv",
     "split-kv",
     "split-kv",
     {1, 1, 1, 4, 40, 32, 32, "none"},
     {1, 1, 1, 4, 4, 32, 32, "none"}},
    // Sk = 37: 8 splits of 5 keys, the last of 2 is never combined. Quiet: Sk = 40, 8 splits of exactly 5.
    {"planted-combine-drops-last-split",
     "planted/split-kv",
     "split-kv",
     "split-kv",
     {1, 1, 1, 4, 37, 32, 32, "none"},
     {1, 1, 1, 4, 40, 32, 32, "none"}},
    // D = 59: columns 56..58 never enter a score. Quiet: D = 64 (D % 4 == 0).
    {"planted-headdim-unroll4",
     "planted/split-kv",
     "split-kv",
     "tail",
     {1, 1, 1, 4, 40, 59, 59, "none"},
     {1, 1, 1, 4, 40, 64, 64, "none"}},
    // Sk = 40: the partial key tile 32..39 loses key 39 from P.V (row 7 sees it under causal-br).
    // Quiet: Sk = 48 (no partial key tile).
    {"planted-tail-tile-last-key",
     "planted/flash",
     "flash-bm16-bn16",
     "tail",
     {1, 1, 1, 8, 40, 32, 32, "causal-br"},
     {1, 1, 1, 8, 48, 32, 32, "causal-br"}},
    // Empty rows (causal-br, Sq > Sk) in the query tile of rows with keys get LSE = -1e30 + log l. Quiet:
    // causal-tl, no empty row.
    {"planted-masked-score-finite",
     "planted/flash",
     "flash-bm16-bn16",
     "empty-row",
     {1, 1, 1, 9, 4, 16, 16, "causal-br"},
     {1, 1, 1, 9, 9, 16, 16, "causal-tl"}},
    // LSE off by the row max. Quiet: tiny inputs, every row max ~0.
    {"planted-lse-no-max",
     "planted/flash",
     "flash-bm16-bn16",
     "lse",
     {1, 1, 1, 8, 40, 32, 32, "causal-br"},
     {1, 1, 1, 8, 40, 32, 32, "causal-br", "uniform:0.0001"}},
    // Sq = 20: rows 16..19 (the last partial tile) never stored. Quiet: Sq = 32, two whole tiles.
    {"planted-last-q-tile-unstored",
     "planted/flash",
     "flash-bm16-bn16",
     "unwritten",
     {1, 1, 1, 20, 16, 32, 32, "none"},
     {1, 1, 1, 32, 16, 32, 32, "none"}},
    // GQA 4 query heads on 2 KV heads: heads 1 and 2 read the other KV head. Quiet: MQA (one KV head).
    {"planted-gqa-interleaved",
     "planted/flash",
     "flash-bm16-bn16",
     "wrong",
     {1, 4, 2, 33, 33, 32, 32, "causal-br"},
     {1, 4, 1, 33, 33, 32, 32, "causal-br"}},
    // NaN in V at keys some rows must not see: 0 * NaN reaches those rows. Quiet: the same case with -0 there
    // (every finite value is quiet: 0 * v = 0); the bug needs a non-finite value.
    {"planted-masked-pv-zero-weight",
     "planted/flash",
     "flash-bm16-bn16",
     "mask",
     {1, 1, 1, 17, 17, 16, 16, "causal-tl", "uniform:1", "nan@v:masked*3"},
     {1, 1, 1, 17, 17, 16, 16, "causal-tl", "uniform:1", "-0@v:masked*3"}},
    // ---- low precision (issue 13): the correct kernel is online-row in the same dtype (flash-bm16-bn32 for
    // fp8, which online-row does not take) ----
    // Scores of magnitude ~30-90: exp(s) > 65504 in fp16. Quiet: uniform:1 (|s| < 2).
    {"planted-f16-exp-no-max-sub",
     "planted/lowp",
     "online-row",
     "non-finite",
     {1, 1, 1, 8, 40, 32, 32, "none", "extreme:30", "", kFwd, 1, AF_DTYPE_F16},
     {1, 1, 1, 8, 40, 32, 32, "none", "uniform:1", "", kFwd, 1, AF_DTYPE_F16}},
    // 2048 keys with v in [0, 1]: l passes 1024, where fp16 drops weights below 0.5. Quiet: 64 keys.
    {"planted-f16-sum-half",
     "planted/lowp",
     "online-row",
     "precision",
     {1, 1, 1, 4, 2048, 32, 32, "none", "vbias:1", "", kFwd, 1, AF_DTYPE_F16},
     {1, 1, 1, 4, 64, 32, 32, "none", "vbias:1", "", kFwd, 1, AF_DTYPE_F16}},
    {"planted-f16-acc-half",
     "planted/lowp",
     "online-row",
     "precision",
     {1, 1, 1, 4, 2048, 32, 32, "none", "vbias:1", "", kFwd, 1, AF_DTYPE_F16},
     {1, 1, 1, 4, 64, 32, 32, "none", "vbias:1", "", kFwd, 1, AF_DTYPE_F16}},
    // D = 64, scores ~3000 RMS: the unscaled q.k passes 65504, scale * q.k does not. Quiet: uniform:1.
    {"planted-f16-scale-after-cast",
     "planted/lowp",
     "online-row",
     "non-finite",
     {1, 1, 1, 8, 40, 64, 64, "none", "extreme:3000", "", kFwd, 1, AF_DTYPE_F16},
     {1, 1, 1, 8, 40, 64, 64, "none", "uniform:1", "", kFwd, 1, AF_DTYPE_F16}},
    // Scores ~300 RMS: the running max jumps by more than 88.7. Quiet: uniform:1.
    {"planted-bf16-p-early-max",
     "planted/lowp",
     "online-row",
     "rescale",
     {1, 1, 1, 8, 40, 32, 32, "none", "extreme:300", "", kFwd, 1, AF_DTYPE_BF16},
     {1, 1, 1, 8, 40, 32, 32, "none", "uniform:1", "", kFwd, 1, AF_DTYPE_BF16}},
    // q_descale * k_descale = 4: scores 4x too large. Quiet: q_descale * k_descale = 1 (v_descale 4).
    {"planted-fp8-descale-twice",
     "planted/lowp",
     "flash-bm16-bn32",
     "lse",
     {1, 2, 1, 16, 40, 32, 32, "none", "uniform:1", "", kFwd, 1, AF_DTYPE_FP8_E4M3, {2, 2, 1, 1}},
     {1, 2, 1, 16, 40, 32, 32, "none", "uniform:1", "", kFwd, 1, AF_DTYPE_FP8_E4M3, {0.5f, 2, 4, 0.125f}}},
    // Issue 25's regimes. Near-uniform weights (p = exp(s - m) ~ 0.5), v in [1024, 2048], 128 keys: sum p v ~ 98k >
    // 65504 before the division by l. Quiet: 32 keys (~24k).
    {"planted-f16-acc-store-half",
     "planted/lowp",
     "online-row",
     "non-finite",
     {1, 1, 1, 8, 128, 32, 32, "none", "widev:2048", "", kFwd, 1, AF_DTYPE_F16},
     {1, 1, 1, 8, 32, 32, 32, "none", "widev:2048", "", kFwd, 1, AF_DTYPE_F16}},
    // Logits of ~1e3: the bf16 score is ~2 off, the weights e^2. The fused bound catches it; the unfused bound
    // (scores rounded to bf16 allowed) would not. Quiet: uniform:1.
    {"planted-bf16-score-half",
     "planted/lowp",
     "online-row",
     "precision",
     {1, 1, 1, 8, 40, 32, 32, "none", "extreme:1000", "", kFwd, 1, AF_DTYPE_BF16},
     {1, 1, 1, 8, 40, 32, 32, "none", "uniform:1", "", kFwd, 1, AF_DTYPE_BF16}},
    // ---- varlen / KV cache / paged KV / decode (issue 15) ----
    // Each sequence takes one key too many: the next sequence's first key, and past the end of k for the
    // last. Quiet: causal top-left with Sq_b <= Sk_b (no row sees key Sk_b).
    {"planted-varlen-cu-off-by-one",
     "planted/varlen",
     "varlen-bm16-bn16",
     "oob-read",
     {1, 2, 1, 1, 0, 32, 32, "none --seq-layout varlen --seqlens-q 3,17 --seqlens-k 5,40"},
     {1, 2, 1, 1, 0, 32, 32, "causal-tl --seq-layout varlen --seqlens-q 3,17 --seqlens-k 5,40"}},
    // Offsets 7 and 0 per sequence, 5 from the batch maxima. Quiet: equal lengths.
    {"planted-varlen-causal-batch-max",
     "planted/varlen",
     "varlen-bm16-bn16",
     "mask",
     {1, 2, 1, 1, 0, 32, 32, "causal-br --seq-layout varlen --seqlens-q 3,5 --seqlens-k 10,5"},
     {1, 2, 1, 1, 0, 32, 32, "causal-br --seq-layout varlen --seqlens-q 4,4 --seqlens-k 9,9"}},
    // KV cache of capacity 64 used to 17 and 33: the poisoned tails are read. Quiet: used = capacity.
    {"planted-varlen-seqused-ignored",
     "planted/varlen",
     "varlen-bm16-bn16",
     "oob-read",
     {1, 2, 1, 4, 64, 32, 32, "none --seq-layout kvcache --seqused-k 17,33"},
     {1, 2, 1, 4, 64, 32, 32, "none --seq-layout kvcache --seqused-k 64,64"}},
    // GQA 4 on 2 over packed K/V: query heads 1 and 2 read the other kv head. Quiet: MQA.
    {"planted-varlen-gqa-packed",
     "planted/varlen",
     "varlen-bm16-bn16",
     "wrong",
     {1, 4, 2, 1, 0, 32, 32, "causal-br --seq-layout varlen --seqlens-q 7,20 --seqlens-k 7,20"},
     {1, 4, 1, 1, 0, 32, 32, "causal-br --seq-layout varlen --seqlens-q 7,20 --seqlens-k 7,20"}},
    // Malformed metadata accepted (issue 30 item 6a): cu_seqlens_k decreasing at sequence 1. The correct kernel
    // refuses it (a pass). Quiet: the same arrays well-formed.
    {"planted-varlen-trusts-metadata",
     "planted/varlen",
     "varlen-bm16-bn16",
     "accepted-malformed",
     {1, 2, 1, 1, 0, 32, 32, "none --seq-layout varlen --seqlens-q 3,17 --seqlens-k 5,40 --malformed cu-k-decreasing@1"},
     {1, 2, 1, 1, 0, 32, 32, "none --seq-layout varlen --seqlens-q 3,17 --seqlens-k 5,40"}},
    // Used 17 of 2 pages of 16: slots 17..31 of the last page are scored. Quiet: used 16 and 48.
    {"planted-paged-last-page-whole",
     "planted/paged-decode",
     "paged-decode",
     "oob-read",
     {1, 2, 1, 1, 0, 64, 64, "none --seq-layout decode --seqused-k 17,40 --page-size 16 --page-order 3"},
     {1, 2, 1, 1, 0, 64, 64, "none --seq-layout decode --seqused-k 16,48 --page-size 16 --page-order 3"}},
    // Pages of 32 looked up as pages of 16: keys 16..19 of sequence 0 come from its unused second page.
    // Quiet: page size 16.
    {"planted-paged-page-size-16",
     "planted/paged-decode",
     "paged-decode",
     "oob-read",
     {1, 2, 1, 1, 0, 64, 64,
      "none --seq-layout decode --seqlens-k 64,32 --seqused-k 20,9 --page-size 32 --page-order 5"},
     {1, 2, 1, 1, 0, 64, 64,
      "none --seq-layout decode --seqlens-k 64,32 --seqused-k 20,9 --page-size 16 --page-order 5"}},
    // kv_len 33 (% 32 == 1): key 32's value comes from K. Quiet: kv_len 34.
    {"planted-decode-kvlen-mod32",
     "planted/paged-decode",
     "paged-decode",
     "tail",
     {1, 2, 1, 1, 0, 32, 32, "none --seq-layout decode --seqused-k 33,8 --page-size 16"},
     {1, 2, 1, 1, 0, 32, 32, "none --seq-layout decode --seqused-k 34,8 --page-size 16"}},
    // One query token, window 8 left of the last key: key Sk - 9 is dropped. Quiet: two query tokens.
    {"planted-decode-window-sq1",
     "planted/paged-decode",
     "paged-decode",
     "mask",
     {1, 2, 1, 1, 0, 32, 32, "window:8,0-br --seq-layout decode --seqused-k 40,20 --page-size 16"},
     {1, 2, 1, 2, 0, 32, 32, "window:8,0-br --seq-layout decode --seqused-k 40,20 --page-size 16"}},
    // 8 splits of 8 keys from the longest sequence (64): the short one (5 keys) leaves 7 splits unwritten.
    // Quiet: equal lengths.
    {"planted-decode-empty-split",
     "planted/paged-decode",
     "paged-decode",
     "split-kv",
     {1, 2, 1, 1, 0, 32, 32, "none --seq-layout decode --seqused-k 64,5 --page-size 16"},
     {1, 2, 1, 1, 0, 32, 32, "none --seq-layout decode --seqused-k 64,64 --page-size 16"}},
    // Issue 28, variants on sequence layouts. A window of 16 keys at the end of 200 / 64: the token sees none of
    // the first splits, each writes the sink as its partial LSE and the combine adds it again. Quiet: no mask (every
    // split holds keys of the token).
    {"planted-paged-sink-twice-empty-split",
     "planted/paged-decode",
     "paged-decode",
     "split-kv",
     {1, 4, 1, 1, 0, 32, 32, "window:16,0-br --seq-layout decode --seqused-k 200,64 --page-size 16 --variant sink"},
     {1, 4, 1, 1, 0, 32, 32, "none --seq-layout decode --seqused-k 200,64 --page-size 16 --variant sink"}},
    // Logits of magnitude ~100 past a cap of 5 on the packed-q path. Quiet: the same on a KV cache (dense q).
    {"planted-varlen-softcap-ignored",
     "planted/varlen",
     "varlen-bm16-bn16",
     "ignored-parameter",
     {1, 2, 1, 1, 0, 32, 32,
      "causal-br --seq-layout varlen --seqlens-q 7,20 --seqlens-k 9,20 --variant softcap --softcap 5", "extreme:100"},
     {1, 2, 1, 7, 24, 32, 32, "causal-br --seq-layout kvcache --seqused-k 9,20 --variant softcap --softcap 5",
      "extreme:100"}},
};

// Loads both plug-ins into the process-wide registry once.
void load_plugins() {
  static std::once_flag once;
  std::call_once(once, [] {
    Registry::global().load_plugin(ATTNFUZZ_PLANTED_PLUGIN);
    Registry::global().load_plugin(ATTNFUZZ_EXAMPLE_PLUGIN);
  });
}

const KernelEntry& cpu_kernel(const std::string& name) {
  load_plugins();
  const KernelEntry* e = Registry::global().find(Backend::kCpu, name);
  if (!e) throw std::runtime_error(name + " is not registered for the cpu backend");
  return *e;
}

Device& cpu_device(ThreadOrder order) {
  static std::map<ThreadOrder, std::unique_ptr<Device>> devices;
  auto& d = devices[order];
  if (!d) {
    DeviceOptions o;
    o.order = order;
    o.order_seed = 7;
    d = open_device("cpu", o);
  }
  return *d;
}

// The score variants of a case text: --variant NAMES (sink, softcap, alibi on a layout) and --softcap X.
struct VariantFlags {
  uint32_t bits = 0;
  float softcap = 30;
};

// "--seq-layout L --seqlens-q .. --seqlens-k .. --seqused-k .. --page-size P --page-order N --spare-pages N
// --malformed KIND@SEQ --variant NAMES --softcap X" into
// the one option table's SequenceOptions (tools/cli_common.h) and the variants; "" when there are none.
std::string parse_layout_flags(std::istringstream& in, SequenceOptions& o, VariantFlags& v) {
  for (std::string flag, value; in >> flag;) {
    if (!(in >> value)) return flag + " needs a value";
    if (flag == "--variant") {
      if (std::string e = parse_variant_names(value, v.bits); !e.empty()) return e;
    } else if (flag == "--softcap") v.softcap = std::stof(value);
    else if (flag == "--seq-layout") o.layout = value;
    else if (flag == "--seqlens-q") o.seqlens_q = value;
    else if (flag == "--seqlens-k") o.seqlens_k = value;
    else if (flag == "--seqused-k") o.seqused_k = value;
    else if (flag == "--page-size") o.page_size = std::stoll(value);
    else if (flag == "--page-order") o.page_order = std::stoull(value);
    else if (flag == "--spare-pages") o.spare_pages = std::stoll(value);
    else if (flag == "--malformed") o.malformed = value;
    else return "unknown flag " + flag;
  }
  return {};
}

Case make_spec_case(const Spec& s) {
  Problem p = make_problem(s.b, s.hq, s.hkv, s.sq, s.sk, s.d, s.dv);
  std::istringstream words(s.mask);
  std::string mask;
  words >> mask;
  EXPECT_EQ(parse_mask(mask, p), "") << s.mask;
  p.dtype = s.dtype;
  p.q_descale = s.descale[0], p.k_descale = s.descale[1], p.v_descale = s.descale[2], p.o_scale = s.descale[3];
  Case c = make_case(p, s.seed);
  SequenceOptions so;
  VariantFlags vf;
  EXPECT_EQ(parse_layout_flags(words, so, vf), "") << s.mask;
  if (!so.layout.empty()) EXPECT_EQ(apply_sequence_options(so, c), "") << s.mask;
  if (vf.bits) EXPECT_EQ(set_variants(c, vf.bits, vf.softcap), "") << s.mask;
  EXPECT_EQ(parse_distribution(s.values, c.values.dist), "") << s.values;
  if (*s.special) {
    SpecialValue sv;
    EXPECT_EQ(parse_special(s.special, sv), "") << s.special;
    c.values.specials.push_back(sv);
  }
  EXPECT_EQ(validate(c), "");
  return c;
}

std::string describe(const Spec& s) {
  return describe(make_spec_case(s)) + " order=" + thread_order_name(s.order);
}

CheckResult check(const std::string& kernel, const Spec& s) {
  PreparedCase pc(make_spec_case(s));
  return check_case(cpu_device(s.order), cpu_kernel(kernel), pc, RunOptions{}).result;
}

std::string summary(const CheckResult& r) {
  return std::string(verdict_name(r.verdict)) +
         (r.verdict == Verdict::kFail ? std::string(" [") + failure_class_name(r.failure) + "]" : "") + " " +
         r.reason + " (max ratio " + std::to_string(r.max_ratio) + ", " + std::to_string(r.failed) + "/" +
         std::to_string(r.compared) + " elements failed)";
}

// ---- the planted plug-in ---------------------------------------------------------------------------------

TEST(PlantedPlugin, LoadsAndListsEveryPlantedKernel) {
  load_plugins();
  std::set<std::string> listed;
  for (const KernelEntry& e : Registry::global().all()) {
    if (e.origin != ATTNFUZZ_PLANTED_PLUGIN) continue;
    if (e.kernel.launch_bwd) continue;  // the backward bugs: tests/kernels/planted/bwd_planted_test.cpp
    // The score-variant bugs (issue 28): tests/check/planted_classify_test.cpp (PlantedVariant) lists and checks them.
    if (std::string(e.kernel.family) == "planted/variants") continue;
    // The merge bugs (issue 29): tests/check/planted_classify_test.cpp (PlantedMerge).
    if (std::string(e.kernel.family) == "planted/merge") continue;
    // The MLA bug (issue 28 item 5): tests/check/planted_classify_test.cpp (PlantedMla).
    if (std::string(e.kernel.family) == "planted/mla") continue;
    EXPECT_EQ(e.backend, Backend::kCpu) << e.kernel.name;
    EXPECT_EQ(std::string(e.kernel.name).rfind("planted-", 0), 0u) << e.kernel.name;
    EXPECT_EQ(std::string(e.kernel.family).rfind("planted/", 0), 0u) << e.kernel.name;
    ASSERT_NE(e.kernel.description, nullptr) << e.kernel.name;
    EXPECT_NE(std::string(e.kernel.description), "") << e.kernel.name;
    if (std::string(e.kernel.family) == "planted/lowp")  // one low-precision dtype each (issue 13)
      EXPECT_TRUE(e.kernel.dtypes != AF_SUPPORTS_F32 && (e.kernel.dtypes & (e.kernel.dtypes - 1)) == 0)
          << e.kernel.name;
    else
      EXPECT_EQ(e.kernel.dtypes, AF_SUPPORTS_F32) << e.kernel.name;
    EXPECT_EQ(e.kernel.masks, AF_SUPPORTS_ALL_MASKS) << e.kernel.name;
    EXPECT_EQ(e.kernel.writes_lse, 1) << e.kernel.name;
    listed.insert(e.kernel.name);
  }
  std::set<std::string> want;
  for (const Planted& k : kPlanted) {
    want.insert(k.name);
    EXPECT_EQ(std::string(cpu_kernel(k.name).kernel.family), k.family) << k.name;
  }
  EXPECT_EQ(listed, want)
      << "every planted kernel needs an entry in kPlanted (and kernels/planted/README.md)";
  EXPECT_GE(listed.size(), 12u);
}

TEST(PlantedPlugin, RefusesOverrunsBeyondTheGuardZone) {
  // The planted OOB kernels keep their overrun inside the checker's 64 KiB guards: wide rows are refused.
  for (const char* name : {"planted-tail-k-oob-read", "planted-tail-q-oob-write"}) {
    const af_kernel& k = cpu_kernel(name).kernel;
    EXPECT_EQ(unsupported_reason(k, make_problem(1, 4, 4, 17, 33, 128, 128)), "") << name;
    EXPECT_NE(unsupported_reason(k, make_problem(1, 16, 16, 17, 33, 128, 128)), "") << name;
  }
}

class PlantedKernel : public ::testing::TestWithParam<Planted> {};

// The bug is real: its exposing case fails, and the correct kernel it varies passes the very same case.
TEST_P(PlantedKernel, ExposingCaseFails) {
  const Planted& k = GetParam();
  SCOPED_TRACE(describe(k.exposing));
  const CheckResult bad = check(k.name, k.exposing);
  std::cout << "[ planted ] " << k.name << " (expected class " << k.expected_class << "): " << summary(bad)
            << "\n";
  EXPECT_EQ(bad.verdict, Verdict::kFail) << k.name << ": " << summary(bad);
  const CheckResult good = check(k.correct, k.exposing);
  EXPECT_EQ(good.verdict, Verdict::kPass) << k.correct << ": " << summary(good);
}

// The bug is quiet: a case that does not meet its trigger passes.
TEST_P(PlantedKernel, QuietCasePasses) {
  const Planted& k = GetParam();
  SCOPED_TRACE(describe(k.quiet));
  const CheckResult r = check(k.name, k.quiet);
  EXPECT_EQ(r.verdict, Verdict::kPass) << k.name << ": " << summary(r);
}

INSTANTIATE_TEST_SUITE_P(Plugin, PlantedKernel, ::testing::ValuesIn(kPlanted),
                         [](const ::testing::TestParamInfo<Planted>& info) {
                           std::string s = info.param.name;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// The out-of-bounds write is caught by the canaries and named as such by the runner today.
TEST(PlantedPlugin, TailQWriteHitsTheCanaries) {
  const CheckResult r = check("planted-tail-q-oob-write", {1, 1, 1, 17, 16, 32, 32, "none"});
  EXPECT_EQ(r.verdict, Verdict::kFail);
  EXPECT_EQ(r.failure, FailureClass::kOobWrite) << summary(r);
}

// The tail-K read really lands in k's and v's guard zones: the output follows the guard poison (NaN or a
// finite 1.23), while the correct kernel's output does not depend on it.
TEST(PlantedPlugin, TailKReadFollowsTheGuardPoison) {
  const Case c = make_spec_case({1, 1, 1, 8, 33, 32, 32, "none"});
  const Tensors t = generate(c);
  for (const char* name : {"planted-tail-k-oob-read", "flash-bm16-bn16"}) {
    RunOptions nan_guard, finite_guard;
    finite_guard.guard_poison = kGuardPoisonAlt;
    const LaunchOutcome a = launch_guarded(cpu_device(kFwd), cpu_kernel(name), c.problem, t, nan_guard);
    const LaunchOutcome b = launch_guarded(cpu_device(kFwd), cpu_kernel(name), c.problem, t, finite_guard);
    ASSERT_EQ(a.launch.status, LaunchStatus::kOk) << a.launch.message;
    ASSERT_EQ(b.launch.status, LaunchStatus::kOk) << b.launch.message;
    EXPECT_EQ(a.canary_words + b.canary_words, 0u) << name << " wrote into a guard zone";
    const bool same = a.o.size() == b.o.size() && std::memcmp(a.o.data(), b.o.data(), a.o.size() * 4) == 0;
    EXPECT_EQ(same, std::string(name) != "planted-tail-k-oob-read") << name;
  }
}

// The barrier races depend on the schedule only: the same case and values pass under one order and fail
// under another (and the seed-000 race also under some shuffles).
TEST(PlantedPlugin, BarrierRacesDependOnTheThreadOrder) {
  const Spec base{1, 2, 1, 6, 50, 64, 64, "causal-br"};
  auto with = [&](ThreadOrder o) {
    Spec s = base;
    s.order = o;
    return s;
  };
  EXPECT_EQ(check("planted-no-score-barrier", with(ThreadOrder::kForward)).verdict, Verdict::kPass);
  EXPECT_EQ(check("planted-no-score-barrier", with(ThreadOrder::kReverse)).verdict, Verdict::kFail);
  EXPECT_EQ(check("planted-no-score-barrier", with(ThreadOrder::kShuffle)).verdict, Verdict::kFail);
  EXPECT_EQ(check("planted-smem-reuse-race", with(ThreadOrder::kForward)).verdict, Verdict::kFail);
  EXPECT_EQ(check("planted-smem-reuse-race", with(ThreadOrder::kReverse)).verdict, Verdict::kPass);
  EXPECT_EQ(check("planted-smem-reuse-race", with(ThreadOrder::kShuffle)).verdict, Verdict::kFail);
}

// ---- the example plug-in (examples/plugin/) ---------------------------------------------------------------

// Issue 25: the bound follows the declared compute model. A bf16 score in a kernel that declares fused fails at
// logits of ~1e3; the very same launch declared unfused (scores rounded to bf16 allowed) passes.
TEST(PlantedPlugin, ABf16ScoreFailsOnlyUnderTheFusedModelItDeclares) {
  load_plugins();
  const Spec s{1, 1, 1, 8, 40, 32, 32, "none", "extreme:1000", "", kFwd, 1, AF_DTYPE_BF16};
  KernelEntry k = cpu_kernel("planted-bf16-score-half");
  ASSERT_EQ(k.kernel.compute_model, AF_COMPUTE_FUSED);
  PreparedCase pc(make_spec_case(s));
  const CheckResult fused = check_case(cpu_device(s.order), k, pc, RunOptions{}).result;
  EXPECT_EQ(fused.verdict, Verdict::kFail) << summary(fused);
  k.kernel.compute_model = AF_COMPUTE_UNFUSED;
  const CheckResult unfused = check_case(cpu_device(s.order), k, pc, RunOptions{}).result;
  EXPECT_EQ(unfused.verdict, Verdict::kPass) << summary(unfused);
}

TEST(ExamplePlugin, LoadsAndPasses) {
  const KernelEntry& e = cpu_kernel("example-naive");
  EXPECT_EQ(e.origin, ATTNFUZZ_EXAMPLE_PLUGIN);
  EXPECT_EQ(std::string(e.kernel.family), "example");
  const Spec cases[] = {
      {1, 1, 1, 1, 1, 1, 1, "none"},
      {1, 2, 1, 7, 13, 59, 59, "causal-br"},
      {1, 2, 2, 13, 7, 59, 33, "causal-tl"},
      {2, 4, 2, 33, 31, 16, 16, "window:5,3-br"},
      {1, 4, 1, 40, 9, 16, 16, "causal-br"},  // fully masked rows
      {2, 2, 1, 5, 0, 13, 13, "none"},        // Sk = 0
      {1, 1, 1, 17, 17, 16, 16, "causal-tl", "uniform:1", "nan@k:masked*3"},
      {1, 1, 1, 17, 23, 16, 16, "none", "uniform:1", "nan@q:visible"},
      {1, 2, 1, 16, 64, 32, 32, "causal-br", "extreme:100"},
  };
  for (const Spec& s : cases) {
    SCOPED_TRACE(describe(s));
    const CheckResult r = check("example-naive", s);
    EXPECT_EQ(r.verdict, Verdict::kPass) << summary(r);
  }
}

}  // namespace
}  // namespace attnfuzz
