/* abi.h - the versioned C ABI between attn-fuzz and every kernel (built-in or from a user's plug-in). */
#ifndef ATTNFUZZ_ABI_H_
#define ATTNFUZZ_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any incompatible change of the structs below. Each version only APPENDS fields to the previous
 * one (af_problem, af_buffers, af_kernel keep their v1 and v2 prefixes byte for byte), so older plug-ins
 * still load: a v1 or v2 kernel table is copied into v3 tables with every newer field zero (v1: dense forward
 * only, no tunables; v2: no v3 declarations, i.e. the fused compute model, forward + backward as declared,
 * the [B, Hq, Sq] lse, pages of 16 .. 256 tokens, no variants), and its launch receives a v3 af_problem /
 * af_buffers whose prefix is exactly its own layout.
 * A plug-in built for a version outside [AF_ABI_MIN_VERSION, AF_ABI_VERSION] is refused.
 * Version 3 was designed once for three needs (docs/semantics.md): the verdict's compute model and kernel
 * declarations (backward-only kernels, the pass in check_support, packed LSE, page sizes 1 .. 1024), the
 * attention variants (sinks, softcap, ALiBi, bias, custom and block-sparse masks, shared K/V latent,
 * per-head descales), and dropout and merged attention states. */
#define AF_ABI_VERSION 3
#define AF_ABI_MIN_VERSION 1

/* Sentinel for an unbounded window side (causal = left AF_UNBOUNDED, right 0). */
#define AF_UNBOUNDED (-1)

typedef enum af_mask_kind {
  AF_MASK_NONE = 0,   /* every key visible */
  AF_MASK_CAUSAL = 1, /* window left = unbounded, right = 0 */
  AF_MASK_WINDOW = 2  /* finite or unbounded left/right, see window_left/window_right */
} af_mask_kind;

typedef enum af_mask_align {
  AF_ALIGN_TOP_LEFT = 0,    /* off = 0 (PyTorch is_causal) */
  AF_ALIGN_BOTTOM_RIGHT = 1 /* off = Sk - Sq (FlashAttention >= 2.1, CK "b") */
} af_mask_align;

typedef enum af_dtype {
  AF_DTYPE_F32 = 0,
  AF_DTYPE_F16 = 1,
  AF_DTYPE_BF16 = 2,
  AF_DTYPE_FP8_E4M3 = 3, /* v2: OCP e4m3fn (no Inf; NaN = S.1111.111), with per-tensor descale factors */
  AF_DTYPE_FP8_E5M2 = 4  /* v2: OCP e5m2 (IEEE-like: Inf and NaN), with per-tensor descale factors */
} af_dtype;

/* v2: how the sequence dimension of a tensor is stored. */
typedef enum af_seq_layout {
  AF_SEQ_DENSE = 0,  /* [B, S, H, D]: stride[0] between sequences, stride[1] between tokens */
  AF_SEQ_PACKED = 1, /* varlen [total, H, D]: token t of sequence b is row cu_seqlens[b] + t (stride[1]);
                        stride[0] unused (0) */
  AF_SEQ_PAGED = 2   /* K/V only: pool [num_pages, page_size, Hkv, D]; token t of sequence b lives in pool
                        page block_table[b * max_pages_per_seq + t / page_size] at slot t % page_size;
                        stride[0] between pages, stride[1] between slots */
} af_seq_layout;

/* v2: integer tunables a kernel declares (split counts, tile choices); the tool varies them in
 * experiments (e.g. the split-kv detector) and records the values it used in every case. */
#define AF_MAX_TUNABLES 4
#define AF_MAX_TUNABLE_VALUES 16
typedef enum af_tunable_role {
  AF_TUNABLE_OTHER = 0,
  AF_TUNABLE_KV_SPLITS = 1 /* the number of KV splits of a split-KV / decode kernel */
} af_tunable_role;
typedef struct af_tunable {
  const char* name;                      /* e.g. "num_splits" (letters, digits, '-' and '_') */
  const char* description;               /* one line */
  int32_t role;                          /* af_tunable_role */
  int32_t n_values;                      /* 1 .. AF_MAX_TUNABLE_VALUES */
  int32_t values[AF_MAX_TUNABLE_VALUES]; /* accepted values, each >= 1; values[0] is the default */
} af_tunable;

/* One attention problem (forward, and backward for kernels that export launch_bwd). Dense tensors are
 * [B, S, H, D] addressed by element strides; the last (head-dim) stride is always 1.
 * visible(i, j) <=> j - (i + off) in [-left, right], per sequence. Fields after lse_stride are ABI v2. */
typedef struct af_problem {
  int64_t batch;        /* B >= 1 */
  int64_t heads_q;      /* Hq >= 1 */
  int64_t heads_kv;     /* Hkv >= 1, Hq % Hkv == 0; query head h reads kv head h / (Hq / Hkv) */
  int64_t seq_q;        /* Sq >= 1 */
  int64_t seq_k;        /* Sk >= 0 (0: every row fully masked) */
  int64_t head_dim;     /* D >= 1, length of q and k rows */
  int64_t head_dim_v;   /* Dv >= 1, length of v and o rows */
  float scale;          /* score = scale * q.k; default fp32(1/sqrt(D)) */
  int32_t mask_kind;    /* af_mask_kind */
  int32_t mask_align;   /* af_mask_align; ignored for AF_MASK_NONE */
  int64_t window_left;  /* >= 0 or AF_UNBOUNDED; AF_MASK_WINDOW only (causal implies unbounded) */
  int64_t window_right; /* >= 0 or AF_UNBOUNDED; AF_MASK_WINDOW only (causal implies 0) */
  int32_t dtype;        /* af_dtype of q, k, v, o (and do, dq, dk, dv); accumulation always fp32 */
  int32_t reserved0;    /* 0 */
  int64_t q_stride[3];  /* elements between consecutive b, s, h of q */
  int64_t k_stride[3];  /* same for k */
  int64_t v_stride[3];  /* same for v */
  int64_t o_stride[3];  /* same for o */
  int64_t lse_stride[3];/* elements between consecutive b, h, s of lse [B, Hq, Sq] */
  /* ---- ABI v2 ---- */
  /* fp8 (AF_DTYPE_FP8_*): the real value of a stored q/k/v element is stored * descale; the stored o is
   * fp8(O * o_scale). 1.0 for every other dtype. */
  float q_descale;
  float k_descale;
  float v_descale;
  float o_scale;
  /* Integer tunables: entry i holds the value of the kernel's i-th declared af_tunable. The tool always
   * passes an accepted value (the default unless an experiment chose another); in a case, 0 = default. */
  int32_t tunables[AF_MAX_TUNABLES];
  /* Varlen / KV cache / paged KV (docs/semantics.md). With q_layout or kv_layout not dense, batch is the number
   * of sequences and seq_q / seq_k are the largest per-sequence lengths (max_seqlen). */
  int32_t q_layout;          /* AF_SEQ_DENSE or AF_SEQ_PACKED (cu_seqlens_q): q, o, do, dq */
  int32_t kv_layout;         /* AF_SEQ_DENSE, AF_SEQ_PACKED (cu_seqlens_k) or AF_SEQ_PAGED: k, v, dk, dv */
  int64_t total_q;           /* packed q tokens (cu_seqlens_q[batch]); 0 when dense */
  int64_t total_k;           /* packed k tokens (cu_seqlens_k[batch]); 0 unless kv_layout is packed */
  int64_t kv_capacity;       /* KV cache: tokens reserved per sequence (dense: seq_k; paged: pages * page_size);
                                the used length is seqused_k[b] when buffers.seqused_k is set */
  int32_t page_size;         /* tokens per page (AF_SEQ_PAGED): 16 .. 256, or 1 .. 1024 as the kernel declares (v3); 0 otherwise */
  int32_t reserved1;         /* 0 */
  int64_t num_pages;         /* pages in the pool (AF_SEQ_PAGED) */
  int64_t max_pages_per_seq; /* row length of block_table [batch, max_pages_per_seq] */
  /* Backward (launch_bwd): dO and dQ like q/o ([B, Sq, Hq, D or Dv]), dK and dV like k/v. */
  int64_t do_stride[3];
  int64_t dq_stride[3];
  int64_t dk_stride[3];
  int64_t dv_stride[3];
  /* ---- ABI v3 ---- */
  int32_t pass;       /* af_pass of the launch (or, in check_support, of the check asked for) */
  int32_t lse_layout; /* af_lse_layout of lse: AF_LSE_BHS unless the kernel declared AF_KERNEL_LSE_PACKED and
                         q_layout is packed (then [Hq, total_q]: lse_stride[1] between heads, lse_stride[2]
                         between packed rows, lse_stride[0] = 0) */
  /* Variants: which ones this problem uses (AF_VARIANT_*, a subset of af_kernel::variants); a field below is
   * read only when its bit is set. Semantics in docs/semantics.md "Variants". */
  uint32_t variants;
  float softcap;            /* AF_VARIANT_SOFTCAP: s <- softcap * tanh(s / softcap) after scaling, > 0 */
  int64_t bias_stride[4];   /* AF_VARIANT_BIAS: fp32 elements between consecutive b, query head, i, j of
                               buffers.bias (0 = broadcast over that dimension) */
  int64_t mask_stride[3];   /* AF_VARIANT_MASK_DENSE / _BITS: bytes between consecutive b, query head, i of
                               buffers.custom_mask (0 = broadcast) */
  int32_t block_q;          /* AF_VARIANT_BLOCK_SPARSE: query rows and keys per block of buffers.block_mask */
  int32_t block_k;
  int64_t block_mask_stride[3]; /* bytes between consecutive b, query head, query block of block_mask */
  int64_t descale_stride[2];    /* AF_VARIANT_HEAD_DESCALE: elements between consecutive b, head of the
                                   per-head descale arrays (q: query heads; k, v: kv heads) */
  /* Dropout (AF_VARIANT_DROPOUT): each weight P_ij is kept with probability 1 - p and then scaled by
   * 1 / (1 - p); the keep decision is a function of (seed, offset, b, h, i, j) only. */
  float dropout_p;                /* [0, 1) */
  int32_t dropout_rng;            /* af_dropout_rng */
  uint64_t dropout_seed;
  uint64_t dropout_offset;        /* the generator's counter offset */
  int64_t dropout_mask_stride[3]; /* bytes between consecutive b, query head, i of buffers.dropout_mask */
  /* Merged attention states (af_kernel::kind AF_KIND_MERGE): n_states partial results (O_s, LSE_s) of one
   * problem over disjoint key ranges, merged into o and lse (the union). */
  int32_t n_states;
  int32_t reserved2;             /* 0 */
  int64_t state_o_stride[4];     /* elements between consecutive state, b, s, h of buffers.state_o */
  int64_t state_lse_stride[4];   /* elements between consecutive state, b, h, s of buffers.state_lse */
} af_problem;

/* Device pointers for one launch. lse is NULL when the kernel does not write it. workspace holds
 * workspace_bytes(problem) (forward) or bwd_workspace_bytes(problem) (backward) bytes, guarded like
 * every other buffer, or NULL when that is 0. In a backward launch o and lse are inputs. Fields after
 * workspace are ABI v2 and NULL where the problem does not use them. */
typedef struct af_buffers {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  void* workspace;
  /* ---- ABI v2 ---- */
  const int32_t* cu_seqlens_q; /* [batch + 1] prefix sums (q_layout packed) */
  const int32_t* cu_seqlens_k; /* [batch + 1] prefix sums (kv_layout packed) */
  const int32_t* seqused_k;    /* [batch] used KV length per sequence (KV cache), or NULL = full */
  const int32_t* block_table;  /* [batch, max_pages_per_seq] pool page indices (kv_layout paged) */
  const void* dout;            /* backward: dO */
  void* dq;                    /* backward outputs */
  void* dk;
  void* dv;
  /* ---- ABI v3: NULL unless the problem's variant, dropout or kind uses them ---- */
  const float* sinks;        /* AF_VARIANT_SINK: [Hq] one logit per query head, in the softmax denominator only */
  const float* alibi_slopes; /* AF_VARIANT_ALIBI: [Hq]; s_ij -= slope_h * |j - (i + off)| (off of mask_align) */
  const float* bias;         /* AF_VARIANT_BIAS: additive fp32 bias, bias_stride */
  const uint8_t* custom_mask;/* AF_VARIANT_MASK_DENSE: one byte per (i, j), non-zero = visible;
                                AF_VARIANT_MASK_BITS: bit j % 8 of byte j / 8 of row (b, h, i), 1 = visible */
  const uint8_t* block_mask; /* AF_VARIANT_BLOCK_SPARSE: one byte per (query block, key block): 0 empty, 1 full,
                                2 partial (custom_mask decides inside the block) */
  const float* q_descale_h;  /* AF_VARIANT_HEAD_DESCALE: per-head fp8 descales, replacing the per-tensor ones */
  const float* k_descale_h;
  const float* v_descale_h;
  uint8_t* dropout_mask;     /* AF_DROPOUT_RNG_EXPORTED: the kernel writes its keep mask (1 kept, 0 dropped) */
  float* dsinks;             /* backward with AF_VARIANT_SINK: d loss / d sink [Hq] */
  float* dbias;              /* backward with AF_VARIANT_BIAS: d loss / d bias, with bias_stride (summed over
                                broadcast dimensions) */
  const void* state_o;       /* AF_KIND_MERGE: partial outputs (dtype), state_o_stride */
  const float* state_lse;    /* AF_KIND_MERGE: partial LSEs (natural log; -inf = empty state), state_lse_stride */
} af_buffers;

/* Bit sets for af_kernel::masks. */
#define AF_SUPPORTS_MASK_NONE (1u << 0)
#define AF_SUPPORTS_CAUSAL_TL (1u << 1)
#define AF_SUPPORTS_CAUSAL_BR (1u << 2)
#define AF_SUPPORTS_WINDOW_TL (1u << 3)
#define AF_SUPPORTS_WINDOW_BR (1u << 4)
#define AF_SUPPORTS_ALL_MASKS 0x1fu
/* Bit sets for af_kernel::dtypes: (1u << af_dtype). */
#define AF_SUPPORTS_F32 (1u << AF_DTYPE_F32)
#define AF_SUPPORTS_F16 (1u << AF_DTYPE_F16)
#define AF_SUPPORTS_BF16 (1u << AF_DTYPE_BF16)
#define AF_SUPPORTS_FP8_E4M3 (1u << AF_DTYPE_FP8_E4M3)
#define AF_SUPPORTS_FP8_E5M2 (1u << AF_DTYPE_FP8_E5M2)
/* Backward dtypes (v2), also in af_kernel::dtypes: launch_bwd takes q, k, v, o, dout and writes dq, dk, dv as
 * elements of that type (lse and the workspace stay fp32). No such bit: the backward launch is fp32 only. */
#define AF_SUPPORTS_BWD(dtype) (1u << (16 + (dtype)))
#define AF_SUPPORTS_BWD_F16 AF_SUPPORTS_BWD(AF_DTYPE_F16)
#define AF_SUPPORTS_BWD_BF16 AF_SUPPORTS_BWD(AF_DTYPE_BF16)
/* Bit sets for af_kernel::features (v2): which input models beyond dense [B, S, H, D] a kernel takes. */
#define AF_FEATURE_Q_PACKED (1u << 0)  /* q_layout = AF_SEQ_PACKED */
#define AF_FEATURE_KV_PACKED (1u << 1) /* kv_layout = AF_SEQ_PACKED */
#define AF_FEATURE_KV_PAGED (1u << 2)  /* kv_layout = AF_SEQ_PAGED */
#define AF_FEATURE_SEQUSED_K (1u << 3) /* buffers.seqused_k (KV cache with used length < capacity) */
/* v3: the variants this kernel declares (af_kernel::variants) apply on the sequence layouts it declares too
 * (sinks, softcap and ALiBi per sequence; docs/sequence-layouts.md "Variants"). Without it a case with one of
 * those variants on a sequence layout is unsupported (kv-shared needs no bit: it is geometry). */
#define AF_FEATURE_LAYOUT_VARIANTS (1u << 4)
#define AF_FEATURES_KNOWN 0x1fu        /* every feature bit defined; a table declaring another is refused */

/* v3: which pass a launch or a check_support question is about. */
typedef enum af_pass { AF_PASS_FORWARD = 0, AF_PASS_BACKWARD = 1 } af_pass;

/* v3: the lse tensor's layout. */
typedef enum af_lse_layout {
  AF_LSE_BHS = 0,   /* [B, Hq, max Sq] (lse_stride: b, h, s) */
  AF_LSE_PACKED = 1 /* [Hq, total_q] (FlashAttention's varlen convention) */
} af_lse_layout;

/* v3: how a kernel computes in f16 / bf16 (the bound follows it; fp32 and fp8 kernels: no effect). */
typedef enum af_compute_model {
  AF_COMPUTE_FUSED = 0,  /* FlashAttention-style: scores, running max and row sum in fp32 from the stored
                            inputs; P rounded to the storage type before P.V; fp32 accumulation; O rounded once */
  AF_COMPUTE_UNFUSED = 1 /* math-style: q, k (possibly pre-scaled), the scores and the softmax output rounded
                            to the storage type (the f16 contract: exact |s|, |q|, |k|, |v| within 2^15) */
} af_compute_model;

/* v3: af_kernel::flags. */
#define AF_KERNEL_LSE_PACKED (1u << 0) /* lse is [Hq, total_q] when q is packed (AF_LSE_PACKED) */
#define AF_KERNEL_SCORE_ADD_IN_DTYPE (1u << 1) /* f16 / bf16: the kernel takes bias + ALiBi as one additive term in the
                                                  storage type (their fp32 sum rounded to it), as SDPA's float
                                                  attn_mask; the exact result uses that rounded term */
#define AF_KERNEL_FLAGS_KNOWN 0x3u

/* v3: af_kernel::variants and af_problem::variants. A kernel that does not declare a variant is unsupported
 * for a problem that uses it; until the tool checks a variant (docs/semantics.md lists which it does), a
 * kernel declaring it is still judged only on problems without it. */
#define AF_VARIANT_SINK (1u << 0)          /* per-head attention sink logits */
#define AF_VARIANT_SOFTCAP (1u << 1)       /* logit softcap */
#define AF_VARIANT_ALIBI (1u << 2)         /* ALiBi slopes */
#define AF_VARIANT_BIAS (1u << 3)          /* additive bias tensor (broadcast by stride 0) */
#define AF_VARIANT_MASK_DENSE (1u << 4)    /* dense boolean mask tensor (on top of mask_kind) */
#define AF_VARIANT_MASK_BITS (1u << 5)     /* bit-packed custom mask (FlashInfer's layout) */
#define AF_VARIANT_BLOCK_SPARSE (1u << 6)  /* block-sparse mask with partial blocks */
#define AF_VARIANT_KV_SHARED (1u << 7)     /* MLA: buffers.v == buffers.k (V = the first Dv columns of K) */
#define AF_VARIANT_HEAD_DESCALE (1u << 8)  /* per-head fp8 descales */
#define AF_VARIANT_DROPOUT (1u << 9)       /* dropout with a reproducible keep mask */
#define AF_VARIANTS_KNOWN 0x3ffu

/* v3: where a dropout kernel's keep decisions come from. */
typedef enum af_dropout_rng {
  AF_DROPOUT_RNG_EXPORTED = 0,     /* the kernel writes its keep mask to buffers.dropout_mask */
  AF_DROPOUT_RNG_PHILOX_FLASH = 1, /* Philox 4x32 as FlashAttention 2 draws it (7 rounds; its (seed, offset, b, h, i, j)
                                      layout: include/attnfuzz/philox.h, docs/semantics.md "Dropout") */
  AF_DROPOUT_RNG_PHILOX_TORCH = 2  /* PyTorch's memory-efficient attention layout (refused: not pinned down yet) */
} af_dropout_rng;

/* v3: what a kernel computes. */
typedef enum af_kernel_kind {
  AF_KIND_ATTENTION = 0, /* attention forward (launch) and/or backward (launch_bwd) */
  AF_KIND_MERGE = 1      /* merges n_states partial (O, LSE) states into o, lse (launch) */
} af_kernel_kind;

/* A kernel as the tool sees it. Everything but name, family and one of launch / launch_bwd may be zero / NULL
 * (v1 and v2 tables: launch is required). */
typedef struct af_kernel {
  const char* name;        /* unique, e.g. "flash-bm16-bn32" */
  const char* family;      /* e.g. "flash"; planted-bug kernels use "planted/<family>" */
  const char* description; /* one line */
  uint32_t dtypes;         /* AF_SUPPORTS_F32 ...; 0 = fp32 only */
  uint32_t masks;          /* AF_SUPPORTS_*; 0 = every mask */
  int64_t max_head_dim;    /* largest D (0 = no limit) */
  int64_t max_head_dim_v;  /* largest Dv (0 = no limit) */
  int32_t writes_lse;      /* 1 if the kernel fills lse */
  int32_t needs_dv_eq_d;   /* 1 if the kernel requires Dv == D */
  /* Extra workspace for this problem (0 if none). */
  size_t (*workspace_bytes)(const af_problem* p);
  /* Optional finer check: 0 = supported, else writes a reason (why may be NULL). */
  int (*check_support)(const af_problem* p, char* why, size_t why_len);
  /* Enqueues the kernel(s) on the backend it was built for; returns the backend's error code (0 = ok). */
  int (*launch)(const af_problem* p, const af_buffers* b, void* stream);
  /* ---- ABI v2 (zero / NULL in a v1 table) ---- */
  uint32_t features;                /* AF_FEATURE_*; 0 = dense only */
  int32_t n_tunables;               /* 0 .. AF_MAX_TUNABLES */
  const af_tunable* tunables;       /* n_tunables entries; problem.tunables[i] carries the i-th value */
  /* Backward: reads q, k, v, o, lse, dout; writes dq, dk, dv. NULL = forward only. */
  size_t (*bwd_workspace_bytes)(const af_problem* p);
  int (*launch_bwd)(const af_problem* p, const af_buffers* b, void* stream);
  /* ---- ABI v3 (zero / NULL in a v1 or v2 table) ---- */
  int32_t compute_model;   /* af_compute_model of its f16 / bf16 launches (0 = fused) */
  int32_t kind;            /* af_kernel_kind (0 = attention) */
  uint32_t flags;          /* AF_KERNEL_* */
  uint32_t variants;       /* AF_VARIANT_* it accepts (0 = none); AF_VARIANT_DROPOUT also needs dropout_rngs */
  uint32_t dropout_rngs;   /* (1u << af_dropout_rng) bits it can follow */
  int32_t min_page_size;   /* AF_SEQ_PAGED: the page sizes it takes, 1 .. 1024 (0, 0 = 16 .. 256) */
  int32_t max_page_size;
  int32_t reserved3;       /* 0 */
} af_kernel;

/* What a plug-in shared library exports as  const af_plugin* attnfuzz_plugin(void);  the layout is the
 * same in every version; kernels points at af_kernel tables of the plug-in's abi_version. */
typedef struct af_plugin {
  uint32_t abi_version;    /* AF_ABI_VERSION the plug-in was built with (1, 2 and 3 load) */
  const char* backend;     /* "cpu", "nvidia" or "amd": what its kernels were compiled for */
  const char* name;        /* shown in reports */
  size_t n_kernels;
  const af_kernel* kernels;
} af_plugin;

typedef const af_plugin* (*af_plugin_entry)(void);
#define AF_PLUGIN_ENTRY "attnfuzz_plugin"

#ifdef __cplusplus
}
#endif
#endif /* ATTNFUZZ_ABI_H_ */
