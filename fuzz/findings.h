// findings.h - distinct failures grouped into findings: the same class, the same kind of evidence and the same
// minimal input pattern, across kernels and call routes (issue 30 item 3).
#pragma once

#include <string>
#include <vector>

#include "attnfuzz/corpus.h"

namespace attnfuzz::fuzz {

// One root cause as far as the evidence tells: the failures of one implementation whose signature (class and
// deciding evidence) and input pattern agree. pattern: the input tier, the mask family (none, causal, window), the
// variants, the pass and the special values by kind, tensor and placement, e.g. "non-finite-masked; causal;
// nan@k:masked". implementation: an adapter kernel's adapter ("torch_sdpa", "jax_attention"): two libraries' bugs are
// never one root cause, whatever their pattern; empty for built-in and plug-in kernels.
struct Finding {
  std::string signature, pattern, implementation;
  std::vector<std::string> kernels;  // distinct, in the order first seen
  std::vector<size_t> members;       // indexes into the failures grouped, in their order
};

// The input pattern of a (minimal) case, as Finding::pattern.
std::string input_pattern(const Case& c);

// The implementation a recorded verdict's kernel belongs to, as Finding::implementation: the adapter's name from
// the device line ("adapter 'CMD' (torch_sdpa, protocol 1; ...)"); empty for other backends.
std::string implementation_of(const RecordedVerdict& v);

// Groups `failures` (their shown case: the minimal one where there is one) in order; findings with the most
// kernels first, then by first member.
std::vector<Finding> group_findings(const std::vector<const CorpusFile*>& failures);

// report.json's findings: signature, pattern, kernels and the file names of the members (file_names[i] of failure i).
Json findings_json(const std::vector<Finding>& findings, const std::vector<std::string>& file_names);

// "## Findings" with a table (signature, input pattern, kernels, failures) for summary.md; "" for none.
std::string findings_markdown(const std::vector<Finding>& findings);

// "non-finite:compare on non-finite-masked; causal; nan@k:masked: k1, k2, k3 (3 kernels, 4 failures)"; an adapter's
// finding names it: "... nan@k:masked [torch_sdpa]: k1, ..."
std::string finding_line(const Finding& f, size_t max_kernels = 6);

}  // namespace attnfuzz::fuzz
