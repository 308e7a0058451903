// slow_kernel.hip - the test plug-in of one correct but slow kernel, slow-blocks (misbehaving_kernels.hip
// built with AF_SLOW_PLUGIN): every block sleeps 100 ms, so a launch can take many times --timeout while it
// finishes blocks all along (slow, not hung).
#define AF_SLOW_PLUGIN 1
#include "tests/reliability/misbehaving_kernels.hip"
