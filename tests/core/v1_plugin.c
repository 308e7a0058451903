/* v1_plugin.c - a plug-in built against the frozen ABI version 1 layout: proves v1 plug-ins still load and run. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* ABI v1 exactly as it shipped (include/attnfuzz/abi.h before version 2); do not edit. */
typedef struct v1_problem {
  int64_t batch, heads_q, heads_kv, seq_q, seq_k, head_dim, head_dim_v;
  float scale;
  int32_t mask_kind, mask_align;
  int64_t window_left, window_right;
  int32_t dtype, reserved0;
  int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3], lse_stride[3];
} v1_problem;
typedef struct v1_buffers {
  const void *q, *k, *v;
  void* o;
  float* lse;
  void* workspace;
} v1_buffers;
typedef struct v1_kernel {
  const char *name, *family, *description;
  uint32_t dtypes, masks;
  int64_t max_head_dim, max_head_dim_v;
  int32_t writes_lse, needs_dv_eq_d;
  size_t (*workspace_bytes)(const v1_problem* p);
  int (*check_support)(const v1_problem* p, char* why, size_t why_len);
  int (*launch)(const v1_problem* p, const v1_buffers* b, void* stream);
} v1_kernel;
typedef struct v1_plugin {
  uint32_t abi_version;
  const char* backend;
  const char* name;
  size_t n_kernels;
  const v1_kernel* kernels;
} v1_plugin;

/* Plain host code (the cpu backend's memory is host memory): two-pass softmax in double, no mask, LSE. */
static int naive_launch(const v1_problem* p, const v1_buffers* b, void* stream) {
  (void)stream;
  const float *q = (const float*)b->q, *k = (const float*)b->k, *v = (const float*)b->v;
  float* o = (float*)b->o;
  const int64_t group = p->heads_q / p->heads_kv;
  for (int64_t bb = 0; bb < p->batch; ++bb)
    for (int64_t h = 0; h < p->heads_q; ++h)
      for (int64_t i = 0; i < p->seq_q; ++i) {
        const float* qi = q + bb * p->q_stride[0] + i * p->q_stride[1] + h * p->q_stride[2];
        double m = -INFINITY, l = 0;
        for (int64_t j = 0; j < p->seq_k; ++j) {
          const float* kj = k + bb * p->k_stride[0] + j * p->k_stride[1] + (h / group) * p->k_stride[2];
          double s = 0;
          for (int64_t d = 0; d < p->head_dim; ++d) s += (double)qi[d] * kj[d];
          s *= p->scale;
          if (s > m) m = s;
        }
        float* oi = o + bb * p->o_stride[0] + i * p->o_stride[1] + h * p->o_stride[2];
        for (int64_t d = 0; d < p->head_dim_v; ++d) oi[d] = 0;
        if (p->seq_k == 0) {
          if (b->lse) b->lse[bb * p->lse_stride[0] + h * p->lse_stride[1] + i * p->lse_stride[2]] = -INFINITY;
          continue;
        }
        double acc[512] = {0};
        for (int64_t j = 0; j < p->seq_k; ++j) {
          const float* kj = k + bb * p->k_stride[0] + j * p->k_stride[1] + (h / group) * p->k_stride[2];
          const float* vj = v + bb * p->v_stride[0] + j * p->v_stride[1] + (h / group) * p->v_stride[2];
          double s = 0;
          for (int64_t d = 0; d < p->head_dim; ++d) s += (double)qi[d] * kj[d];
          const double w = exp(s * p->scale - m);
          l += w;
          for (int64_t d = 0; d < p->head_dim_v; ++d) acc[d] += w * vj[d];
        }
        for (int64_t d = 0; d < p->head_dim_v; ++d) oi[d] = (float)(acc[d] / l);
        if (b->lse) b->lse[bb * p->lse_stride[0] + h * p->lse_stride[1] + i * p->lse_stride[2]] = (float)(m + log(l));
      }
  return 0;
}

#ifndef V1_PLUGIN_NO_ENTRY
static const v1_kernel kKernels[] = {
    {"v1-naive", "naive", "ABI v1 plug-in: host loops in double", 1u, 1u /* mask none */, 512, 512, 1, 0, NULL,
     NULL, naive_launch},
};

/* Built a second time with -DPLUGIN_ABI_VERSION=99 to prove that an unknown version is refused; included by
 * v2_plugin.c (with V1_PLUGIN_NO_ENTRY) for the structs and the launch. */
#ifndef PLUGIN_ABI_VERSION
#define PLUGIN_ABI_VERSION 1
#endif
__attribute__((visibility("default"))) const v1_plugin* attnfuzz_plugin(void) {
  static const v1_plugin p = {PLUGIN_ABI_VERSION, "cpu", "abi-v1-test", 1, kKernels};
  return &p;
}
#endif
