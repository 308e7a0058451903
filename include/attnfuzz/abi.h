/* abi.h - the versioned C ABI between attn-fuzz and every kernel (built-in or from a user's plug-in). */
#ifndef ATTNFUZZ_ABI_H_
#define ATTNFUZZ_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any incompatible change of the structs below; a plug-in built for another version is refused. */
#define AF_ABI_VERSION 1

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

typedef enum af_dtype { AF_DTYPE_F32 = 0, AF_DTYPE_F16 = 1, AF_DTYPE_BF16 = 2 } af_dtype;

/* One attention forward problem. Tensors are [B, S, H, D] addressed by element strides; the last
 * (head-dim) stride is always 1. visible(i, j) <=> j - (i + off) in [-left, right]. */
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
  int32_t dtype;        /* af_dtype of q, k, v, o (accumulation always fp32) */
  int32_t reserved0;
  int64_t q_stride[3];  /* elements between consecutive b, s, h of q */
  int64_t k_stride[3];  /* same for k */
  int64_t v_stride[3];  /* same for v */
  int64_t o_stride[3];  /* same for o */
  int64_t lse_stride[3];/* elements between consecutive b, h, s of lse [B, Hq, Sq] */
} af_problem;

/* Device pointers for one launch. lse is NULL when the kernel does not write it. workspace holds
 * workspace_bytes(problem) bytes (guarded like every other buffer), or NULL when that is 0. */
typedef struct af_buffers {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  void* workspace;
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

/* A kernel as the tool sees it. Everything but name, family and launch may be zero / NULL. */
typedef struct af_kernel {
  const char* name;        /* unique, e.g. "flash-bk32" */
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
} af_kernel;

/* What a plug-in shared library exports as  const af_plugin* attnfuzz_plugin(void);  */
typedef struct af_plugin {
  uint32_t abi_version;    /* AF_ABI_VERSION the plug-in was built with */
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
