/* v2_plugin.c - a plug-in built against the frozen ABI version 2 layout: proves v2 plug-ins still load and run. */
#define V1_PLUGIN_NO_ENTRY /* v1_plugin.c's structs and naive launch, without its entry point */
#include "v1_plugin.c"

/* ABI v2 exactly as it shipped: the v1 structs with their v2 fields appended (include/attnfuzz/abi.h before
 * version 3); do not edit. The naive launch reads only the v1 prefix of the problem and buffers. */
typedef struct v2_tunable {
  const char* name;
  const char* description;
  int32_t role, n_values;
  int32_t values[16];
} v2_tunable;
typedef struct v2_kernel {
  v1_kernel v1; /* 80 bytes, 8-aligned: the same layout as the fields written out */
  uint32_t features;
  int32_t n_tunables;
  const v2_tunable* tunables;
  size_t (*bwd_workspace_bytes)(const void* p);
  int (*launch_bwd)(const void* p, const void* b, void* stream);
} v2_kernel;
typedef struct v2_plugin {
  uint32_t abi_version;
  const char* backend;
  const char* name;
  size_t n_kernels;
  const v2_kernel* kernels;
} v2_plugin;

static const v2_tunable kTunables[] = {{"unroll", "unused by the launch", 0, 2, {3, 5}}};
static const v2_kernel kV2Kernels[] = {
    {{"v2-naive", "naive", "ABI v2 plug-in: host loops in double", 1u, 1u /* mask none */, 512, 512, 1, 0, NULL,
      NULL, naive_launch},
     0u, 1, kTunables, NULL, NULL},
};

__attribute__((visibility("default"))) const v2_plugin* attnfuzz_plugin(void) {
  static const v2_plugin p = {2, "cpu", "abi-v2-test", 1, kV2Kernels};
  return &p;
}
