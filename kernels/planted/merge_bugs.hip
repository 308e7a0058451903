// merge_bugs.hip - planted bugs in the merge of attention states (kernels/merge.h), modelled on the reports of
// issue 29; each kernel replaces one hook of kernels/merge.h's MergePolicy (marked PLANTED). kernels/planted/
// README.md "Merge bugs" has each bug's exposing and quiet case.
#include "kernels/merge.h"
#include "kernels/planted/planted.h"

namespace {

// PLANTED: the states are read with the output's (b, s, h) strides (vLLM fork PR #17: the suffix read with the
// prefix's head stride); right only where the states are laid out like o.
struct StrideOfOutput : MergePolicy {
  __host__ __device__ static int64_t state_o_row(const af_problem& p, const SeqShape& s, int64_t st, int64_t i,
                                                 int64_t h) {
    return st * p.state_o_stride[0] + (p.q_layout == AF_SEQ_PACKED ? 0 : s.b * p.o_stride[0]) +
           (s.q_first + i) * p.o_stride[1] + h * p.o_stride[2];
  }
};

// PLANTED: exp(LSE_s - M) and sum / normaliser without the empty-state guards (FlashInfer #4051): two empty states
// give exp(-inf - -inf) = NaN.
struct EmptyNan : MergePolicy {
  __host__ __device__ static float weight(float lse, float m) { return expf(lse - m); }
  __host__ __device__ static float out_o(float acc, float, float l) { return acc / l; }
};

// PLANTED: the running max starts at 0 instead of -inf (and an all-zero sum is taken as "no state"): states whose
// LSEs are all far below 0 underflow to a zero sum, and the row comes out empty.
struct MaxFromZero : MergePolicy {
  __host__ __device__ static float init_max() { return 0.0f; }
  __host__ __device__ static float out_o(float acc, float, float l) { return l == 0.0f ? 0.0f : acc / l; }
  __host__ __device__ static float out_lse(float m, float l) { return l == 0.0f ? neg_inf() : m + logf(l); }
};

// PLANTED: O weighted in base e, the LSE combined in base 2 (M + log2 of the sum).
struct LseBase2 : MergePolicy {
  __host__ __device__ static float out_lse(float m, float l) { return m == neg_inf() ? neg_inf() : m + log2f(l); }
};

const af_kernel kMergeBugs[] = {
    AF_MERGE_KERNEL("planted-merge-stride-of-output", "planted/merge",
                    "merge with a planted bug: the states are read with the output's (b, s, h) strides",
                    merge_check, merge_launch<StrideOfOutput>),
    AF_MERGE_KERNEL("planted-merge-empty-nan", "planted/merge",
                    "merge with a planted bug: no empty-state guard, two empty states give NaN", merge_check,
                    merge_launch<EmptyNan>),
    AF_MERGE_KERNEL("planted-merge-max-from-zero", "planted/merge",
                    "merge with a planted bug: the running max starts at 0, so LSEs far below 0 underflow",
                    merge_check, merge_launch<MaxFromZero>),
    AF_MERGE_KERNEL("planted-merge-lse-base2", "planted/merge",
                    "merge with a planted bug: O weighted in base e, the LSE combined in base 2", merge_check,
                    merge_launch<LseBase2>),
};
static_assert(sizeof(kMergeBugs) / sizeof(kMergeBugs[0]) == attnfuzz_planted::kMergeBugCount, "planted.h's count");

}  // namespace

const af_kernel* attnfuzz_planted::merge_bugs() { return kMergeBugs; }
