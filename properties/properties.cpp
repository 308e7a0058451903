// properties.cpp - the properties' names and limits, their RapidCheck driver, and the report of a shrunk
// failure (the machinery: relations.cpp; the property bodies: metamorphic.cpp).
#include "properties/properties.h"

#include <rapidcheck.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>

#include "attnfuzz/corpus.h"
#include "attnfuzz/device.h"
#include "attnfuzz/problem.h"
#include "check/runner.h"
#include "check/sequences.h"
#include "oracle/oracle.h"
#include "properties/relations.h"

#ifndef ATTNFUZZ_PROPERTY_DEFAULT_OUT
#define ATTNFUZZ_PROPERTY_DEFAULT_OUT "property-failures"
#endif

namespace attnfuzz::props {

using namespace detail;

// ------------------------------------------------------------------------------------------ names

namespace {

struct PropertyInfo {
  Property p;
  const char* name;
  const char* statement;
};

const PropertyInfo kInfo[] = {
    {Property::kOracle, "oracle",
     "check_case's verdict (exact oracle, per-element bound, canaries, launch status) is pass or "
     "outside-contract"},
    {Property::kKeyPermutation, "key-permutation",
     "permuting key positions together with their values, within groups of keys seen by the same query rows, "
     "changes no O or LSE element by more than bound(A) + bound(B)"},
    {Property::kKeyShift, "key-shift",
     "adding one vector c (per batch and kv head) to every key, exactly in fp32, changes no O element by "
     "more "
     "than bound(A) + bound(B)"},
    {Property::kCausalPrefix, "causal-prefix",
     "changing the keys and values that a set of query rows cannot see (to fresh values, NaN, +-Inf or "
     "FLT_MAX) changes none of those rows' O or LSE elements by more than bound(A) + bound(B)"},
    {Property::kRowIndependence, "row-independence",
     "changing the other query rows (to fresh values, NaN, Inf, FLT_MAX or 0) changes no kept row's O or LSE "
     "element by more than bound(A) + bound(B)"},
    {Property::kBatchHead, "batch-head",
     "the batched multi-head run and one single-head run (B = Hq = Hkv = 1) per (b, h) differ by no more "
     "than bound(batched) + bound(single) in any O or LSE element (backward: in any dQ element, and in any "
     "dK / "
     "dV element of a kv head against the sum of its query heads' single-head dK / dV, within the sum of all "
     "their bounds)"},
    {Property::kDeterminism, "determinism",
     "forward, reverse and shuffled emulator thread orders give bit-identical O and LSE (backward: dQ, dK, "
     "dV)"},
    {Property::kVariants, "variants",
     "for a kernel that declares the score variants, each identity holds within bound(A) + bound(B): every "
     "sink -inf "
     "equals no sink (O, LSE); softcap 1e30 equals no softcap (O, LSE); ALiBi equals the bias tensor "
     "-slope_h |j - (i + off)| (O, LSE); a bias constant along each row (broadcast over keys) leaves O "
     "unchanged"},
    {Property::kMerge, "merge",
     "for a merge kernel (AF_KIND_MERGE), merging the states with one more empty state (an empty key range) "
     "equals "
     "merging the states alone, and the merge at other split points (another state layout and pad) equals "
     "it, within "
     "bound(A) + bound(B) (each the whole problem's composed bound: the merge plus the states' rounding)"},
    {Property::kDropout, "dropout",
     "for a kernel that declares dropout: dropout with p = 0 equals the case without dropout within bound(A) "
     "+ "
     "bound(B) (O, LSE); the same case, with the same seed and offset, run twice gives bit-identical O and "
     "LSE"},
    {Property::kMasks, "masks",
     "for a kernel that declares the custom masks, each identity holds within bound(A) + bound(B) (O, LSE): "
     "a dense "
     "mask of ones equals no custom mask; a dense mask of the bottom-right causal pattern under mask none "
     "equals "
     "mask causal-br; the bit-packed mask equals the dense mask of the same pattern; a block mask of partial "
     "blocks "
     "equals the custom mask alone; a block mask of full blocks equals no mask (a full block never reads the "
     "custom "
     "mask)"},
    {Property::kKvShared, "kv-shared",
     "for a kernel that declares kv-shared (MLA), a case whose V is the first Dv columns of K's rows "
     "(buffers.v == "
     "buffers.k) and the same case with those values copied out into V's own contiguous buffer give "
     "bit-identical O "
     "and LSE"},
    {Property::kPacking, "packing",
     "a packed / KV-cache / paged batch and each of its sequences run alone (batch 1, same layout and "
     "values) differ by no more than bound(batch) + bound(alone) in any O or LSE element of that sequence"},
};

const PropertyInfo& info(Property p) {
  for (const auto& i : kInfo)
    if (i.p == p) return i;
  throw std::logic_error("unknown property");
}

}  // namespace

const std::vector<Property>& all_properties() {
  static const std::vector<Property> v = [] {
    std::vector<Property> r;
    for (const auto& i : kInfo) r.push_back(i.p);
    return r;
  }();
  return v;
}
const char* property_name(Property p) { return info(p).name; }
const char* property_statement(Property p) { return info(p).statement; }
bool parse_property(const std::string& text, Property& out) {
  for (const auto& i : kInfo)
    if (text == i.name) {
      out = i.p;
      return true;
    }
  return false;
}

CaseLimits property_limits(Property p, const af_kernel& k) {
  CaseLimits l;
  switch (p) {
    case Property::kCausalPrefix:
      l.require_mask = true;
      break;
    case Property::kRowIndependence:
      l.min_seq_q = 2;
      break;
    case Property::kBatchHead:
      l.min_bh = 2;
      break;
    case Property::kVariants:
      l.variants = k.variants & (kScoreVariants | AF_VARIANT_HEAD_DESCALE);  // head-descale: fp8 dtypes only
      break;
    case Property::kDropout:
      l.variants = k.variants & AF_VARIANT_DROPOUT;
      break;
    case Property::kMasks:
      l.variants = k.variants & kMaskVariants;
      break;
    case Property::kKvShared:
      l.variants = k.variants & AF_VARIANT_KV_SHARED;
      break;
    default:
      break;
  }
  return limits_for(k, l);
}

std::string property_id(Property p, const KernelEntry& k) {
  return std::string(property_name(p)) + "/" + k.kernel.name;
}

// ------------------------------------------------------------------------------------------ driver

namespace {

std::filesystem::path out_dir(const PropertyOptions& o) {
  if (!o.out.empty()) return o.out;
  if (const char* e = std::getenv("ATTNFUZZ_PROPERTY_OUT"); e && *e) return e;
  return ATTNFUZZ_PROPERTY_DEFAULT_OUT;
}

// Saves the recorded minimal failure's cases with the kernel's verdict on each, and their replay commands.
void save_failure(Property prop, const KernelEntry& k, const PropertyOptions& o, PropertyOutcome& out) {
  const FailureRecord f = g_failure;
  Devices& ds = devices();
  Device* dev = f.order == ThreadOrder::kReverse   ? ds.reverse.get()
                : f.order == ThreadOrder::kShuffle ? ds.shuffle.get()
                                                   : ds.forward.get();
  if (f.order == ThreadOrder::kShuffle) {
    DeviceOptions so = dev->options();
    so.order_seed = f.order_seed;
    dev->set_options(so);
  }
  for (const auto& [role, c0] : f.cases) {
    Case c = c0;
    c.label = std::string("property-") + property_name(prop) + "-" + role +
              (c0.label.empty() ? "" : "-" + c0.label);
    CorpusFile cf;
    cf.tool.name = "attn-props";
    cf.tool.command = std::string("property ") + property_name(prop) + " kernel " + k.kernel.name + " case " +
                      role + f.flags + ": " + f.why;
    cf.the_case = c;
    try {
      PreparedCase pc(c);
      const CheckResult r = check_case(*dev, k, pc, RunOptions{}).result;
      cf.verdict = recorded_verdict(r);
      const std::filesystem::path path = save_to_corpus_dir(out_dir(o), cf);
      out.saved.push_back(path);
      std::string cmd =
          "attn-check --replay " + shell_quote(path.string()) + " --kernel " + shell_quote(k.kernel.name);
      if (k.backend == Backend::kAdapter)
        cmd += " --adapter " + shell_quote(g_adapter_command);
      else if (k.origin != "built-in")
        cmd += " --plugin " + shell_quote(k.origin);
      if (k.backend != Backend::kAdapter) cmd += f.flags;  // thread orders: emulator only
      out.replay.push_back(
          role + " (verdict " + verdict_name(r.verdict) +
          (r.verdict == Verdict::kFail ? std::string(" [") + failure_class_name(r.failure) + "]" : "") +
          "): " + cmd);
    } catch (const std::exception& e) {
      out.replay.push_back(role + ": could not save: " + e.what());
    }
  }
}

}  // namespace

PropertyOutcome run_property(Property prop, const KernelEntry& k, const PropertyOptions& o) {
  using namespace rc::detail;
  PropertyOutcome out;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string id = property_id(prop, k);
  CaseLimits limits = property_limits(prop, k.kernel);
  limits.domain = o.domain;
  limits.dtype = o.dtype;
  limits.pass = o.pass;
  if (has_backward(o.pass)) {
    const bool defined = prop == Property::kOracle || prop == Property::kKeyPermutation ||
                         prop == Property::kBatchHead || prop == Property::kDeterminism;
    const std::string why = pass_unsupported_reason(k.kernel, o.pass, o.dtype);
    if (!why.empty() || !defined) {  // nothing to run: say why, pass with 0 tests
      out.passed = true;
      out.rc_message = !why.empty() ? why + ": not run" : "a forward relation: not run for the backward pass";
      return out;
    }
  }
  if (prop == Property::kCausalPrefix && k.kernel.masks != 0 &&
      (k.kernel.masks & ~AF_SUPPORTS_MASK_NONE) == 0) {
    out.passed = true;  // the kernel supports no mask: nothing is hidden from any row
    out.rc_message = "the kernel supports no mask: not run";
    return out;
  }
  const uint32_t f = k.kernel.features;
  const bool layouts = ((f & AF_FEATURE_Q_PACKED) && (f & AF_FEATURE_KV_PACKED)) || (f & AF_FEATURE_SEQUSED_K);
  if (prop == Property::kPacking && !layouts) {
    out.passed = true;  // the kernel takes dense batches only: nothing is packed
    out.rc_message = "the kernel takes dense batches only: not run";
    return out;
  }
  if ((prop == Property::kMerge) != (k.kernel.kind == AF_KIND_MERGE)) {  // issue 29: merge kernels, merge relations
    out.passed = true;
    out.rc_message = prop == Property::kMerge ? "not a merge kernel: not run"
                                              : "a merge kernel: only the merge property applies, not run";
    return out;
  }
  if (prop == Property::kDropout && !(k.kernel.variants & AF_VARIANT_DROPOUT)) {
    out.passed = true;  // nothing to relate
    out.rc_message = "the kernel declares no dropout: not run";
    return out;
  }
  if (prop == Property::kVariants && !(k.kernel.variants & (kScoreVariants | AF_VARIANT_HEAD_DESCALE))) {
    out.passed = true;  // nothing to relate
    out.rc_message = "the kernel declares no score variant: not run";
    return out;
  }
  if (prop == Property::kMasks && !(k.kernel.variants & kMaskVariants)) {
    out.passed = true;
    out.rc_message = "the kernel declares no custom mask: not run";
    return out;
  }
  if (prop == Property::kKvShared && !(k.kernel.variants & AF_VARIANT_KV_SHARED)) {
    out.passed = true;  // nothing to relate
    out.rc_message = "the kernel declares no kv-shared: not run";
    return out;
  }
  const rc::Gen<Case> gen = prop == Property::kPacking ? gen_sequence_case(limits, k.kernel.features, k.kernel.variants) : gen_case(limits);
  const bool strict = o.strict;
  auto body = [prop, &k, gen, strict]() {
    const Case c = *gen;
    check_property(prop, k, c, strict);
  };
  TestParams params = configuration().testParams;
  const char* env = std::getenv("RC_PARAMS");
  if (!(o.use_rc_params && env && *env)) {
    params.seed = o.seed ? o.seed : hash64(id);
    params.maxSuccess = o.max_success;
    params.disableShrinking = !o.shrink;
  }
  TestMetadata md;
  md.id = id;
  md.description = id;
  g_failure = FailureRecord{};
  g_unsupported = 0;
  const TestResult result = checkTestable(body, md, params);
  std::ostringstream msg;
  printResultMessage(result, msg);
  out.rc_message = msg.str();
  out.unsupported = g_unsupported;
  if (result.template is<SuccessResult>()) {
    out.passed = true;
    out.tests = result.template get<SuccessResult>().numSuccess;
  } else if (result.template is<GaveUpResult>()) {
    out.gave_up = true;
    out.tests = result.template get<GaveUpResult>().numSuccess;
  } else if (result.template is<FailureResult>()) {
    const FailureResult& f = result.template get<FailureResult>();
    out.tests = f.numSuccess;
    Configuration cfg;
    cfg.reproduce[id] = f.reproduce;
    out.reproduce = "RC_PARAMS=\"" + configToMinimalString(cfg) + "\"";
    out.failure = g_failure.why.empty() ? f.description : g_failure.why;
    if (!g_failure.cases.empty()) out.minimal_case = describe(g_failure.cases.front().second);
    save_failure(prop, k, o, out);
  } else {
    out.failure = "RapidCheck error: " + out.rc_message;
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!o.quiet && !out.passed) {
    std::cerr << "\nproperty " << property_name(prop) << " FAILED on kernel " << k.kernel.name << " ("
              << out.tests << " case(s) passed first)\n  statement: " << property_statement(prop)
              << "\n  failure:   " << out.failure << "\n  minimal case: " << out.minimal_case
              << "\n  reproduce: " << out.reproduce << "  (same binary, same test)\n";
    for (size_t i = 0; i < out.saved.size(); ++i)
      std::cerr << "  saved:     " << out.saved[i].string() << "\n  replay " << out.replay[i] << "\n";
    std::cerr << "  RapidCheck: " << out.rc_message << "\n";
  }
  return out;
}

void use_adapter(const std::string& command) {
  g_adapter_command = command;
  devices();  // opens the adapter now: its kernels must be registered before selection
}

}  // namespace attnfuzz::props
