// variants.cpp - metamorphic variants for external kernels: emit inputs + manifest, then judge outputs and
// relations.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "attnfuzz/corpus.h"
#include "npy/external.h"
#include "oracle/lowp.h"

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace attnfuzz::npy {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw NpyError(msg); }

struct Variant {
  std::string name, relation, description;
  Tensors t;
  std::vector<int64_t> keys;  // perturbed keys (mask relation)
  std::string tensor;         // "k" or "v": the tensor perturbed at those keys (mask relation)
};

// Permutes key rows of k and v per (b, kv head): new position i holds old key perm(b, hk)[i].
void permute_keys(const Problem& p, Tensors& t, const std::vector<std::vector<int64_t>>& perm) {
  const Tensors src = t;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      const auto& pm = perm[static_cast<size_t>(b * p.heads_kv + hk)];
      for (int64_t i = 0; i < p.seq_k; ++i) {
        const int64_t j = pm[static_cast<size_t>(i)];
        for (int64_t d = 0; d < p.head_dim; ++d)
          t.k[k_index(p, b, i, hk, d)] = src.k[k_index(p, b, j, hk, d)];
        for (int64_t d = 0; d < p.head_dim_v; ++d)
          t.v[v_index(p, b, i, hk, d)] = src.v[v_index(p, b, j, hk, d)];
      }
    }
}

// Per (b, kv head), the key with the largest score seen by any visible (row, query head).
std::vector<int64_t> max_keys(const Problem& p, const Tensors& t) {
  std::vector<int64_t> out;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      double best = -std::numeric_limits<double>::infinity();
      int64_t arg = 0;
      for (int64_t h = 0; h < p.heads_q; ++h) {
        if (kv_head(p, h) != hk) continue;
        for (int64_t s = 0; s < p.seq_q; ++s) {
          const KeyRange kr = visible_keys(p, s);
          for (int64_t j = kr.first; j < kr.last; ++j) {
            double acc = 0;
            for (int64_t d = 0; d < p.head_dim; ++d)
              acc += static_cast<double>(t.q[q_index(p, b, s, h, d)]) * t.k[k_index(p, b, j, hk, d)];
            if (std::isfinite(acc) && acc * p.scale > best) best = acc * p.scale, arg = j;
          }
        }
      }
      out.push_back(arg);
    }
  return out;
}

void write_variant(const fs::path& dir, const Variant& v, const Problem& p, int32_t cd, Layout layout,
                   bool raw) {
  fs::create_directories(dir);
  const Stored as = cd == AF_DTYPE_F16             ? Stored::kF16
                    : (cd == AF_DTYPE_BF16 && raw) ? Stored::kBF16Raw
                                                   : Stored::kF32;
  auto put = [&](const char* name, const std::vector<float>& x, int64_t S, int64_t H, int64_t D) {
    std::vector<float> y(static_cast<size_t>(p.batch * S * H * D));
    std::vector<int64_t> shape;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d) {
            const float val = x[static_cast<size_t>(((b * S + s) * H + h) * D + d)];
            const size_t at = layout == Layout::kBSHD ? static_cast<size_t>(((b * S + s) * H + h) * D + d)
                                                      : static_cast<size_t>(((b * H + h) * S + s) * D + d);
            y[at] = val;
          }
    shape = layout == Layout::kBSHD ? std::vector<int64_t>{p.batch, S, H, D}
                                    : std::vector<int64_t>{p.batch, H, S, D};
    write_array(dir / name, shape, y.data(), as);
  };
  put("q.npy", v.t.q, p.seq_q, p.heads_q, p.head_dim);
  put("k.npy", v.t.k, p.seq_k, p.heads_kv, p.head_dim);
  put("v.npy", v.t.v, p.seq_k, p.heads_kv, p.head_dim_v);
  Spec s;
  s.layout = layout;
  s.mask = mask_to_string(p);
  s.scale = p.scale;
  s.kv_heads = p.heads_kv;
  s.compute_dtype = cd;
  s.bf16_raw = raw;
  std::ofstream f(dir / "case.json");
  f << sidecar_text(s);
  if (!f) fail((dir / "case.json").string() + ": cannot write the file");
}

std::string bits_diff(const Problem& p, const std::vector<float>& a, const std::vector<float>& b, int64_t bb,
                      int64_t h, int64_t s, int64_t& count) {
  std::string first;
  for (int64_t d = 0; d < p.head_dim_v; ++d) {
    const size_t i = static_cast<size_t>(o_index(p, bb, s, h, d));
    if (std::memcmp(&a[i], &b[i], 4) != 0) {
      if (count++ == 0) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "O[b=%lld,s=%lld,h=%lld,d=%lld] %.9g in base, %.9g here",
                      (long long)bb, (long long)s, (long long)h, (long long)d, a[i], b[i]);
        first = buf;
      }
    }
  }
  return first;
}

void make_fail(CheckResult& r, FailureClass c, const std::string& reason) {
  if (r.verdict != Verdict::kFail) {
    r.verdict = Verdict::kFail;
    r.reason = reason;
  } else {
    r.reason = reason + "; " + r.reason;
  }
  r.failure = c;
}

}  // namespace

std::vector<std::string> emit_variants(const Case& c, int32_t cd, Layout layout, bool raw,
                                       const fs::path& dir, const std::string& command_line) {
  const Problem& p = c.problem;
  Tensors base = generate(c);
  if (cd != AF_DTYPE_F32)
    for (auto* x : {&base.q, &base.k, &base.v})
      for (float& f : *x) f = round_to_dtype(f, cd);
  std::vector<Variant> vs;
  vs.push_back({"base", "reference", "the case as generated (rounded to the compute dtype)", base, {}});
  const size_t nh = static_cast<size_t>(p.batch * p.heads_kv);
  if (p.seq_k >= 2) {
    const auto mk = max_keys(p, base);
    std::vector<std::vector<int64_t>> first(nh), last(nh), rev(nh);
    for (size_t i = 0; i < nh; ++i) {
      std::vector<int64_t> rest;
      for (int64_t j = 0; j < p.seq_k; ++j)
        if (j != mk[i]) rest.push_back(j);
      first[i] = {mk[i]};
      first[i].insert(first[i].end(), rest.begin(), rest.end());
      last[i] = rest;
      last[i].push_back(mk[i]);
      for (int64_t j = p.seq_k - 1; j >= 0; --j) rev[i].push_back(j);
    }
    Variant a{"keys-max-first", "order", "K/V rows permuted: the key with the largest score first", base, {}};
    permute_keys(p, a.t, first);
    Variant b{"keys-max-last", "order", "K/V rows permuted: the key with the largest score last", base, {}};
    permute_keys(p, b.t, last);
    Variant r{"keys-reversed", "order", "K/V rows in reverse order", base, {}};
    permute_keys(p, r.t, rev);
    vs.push_back(std::move(a));
    vs.push_back(std::move(b));
    vs.push_back(std::move(r));
  }
  // Masked keys: the (up to 2) keys seen by the fewest rows, among keys some row must not see.
  const std::vector<int64_t> vis = key_visibility_counts(p);
  std::vector<int64_t> order;
  for (int64_t j = 0; j < p.seq_k; ++j)
    if (vis[static_cast<size_t>(j)] < p.seq_q) order.push_back(j);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return vis[x] < vis[y]; });
  if (order.size() > 2) order.resize(2);
  if (!order.empty()) {
    // K alone and V alone, so that a score leak (masked K reaches the softmax) and a P.V leak (masked V
    // read with weight 0: 0 * NaN = NaN) are told apart. Under the finite value domain: FLT_MAX; under
    // activations the domain's bound (64).
    const bool finite = finite_domain(c.values.domain);
    const float big =
        c.values.domain == ValueDomain::kActivations ? static_cast<float>(kActivationBound) : FLT_MAX;
    struct Perturb {
      const char* name;
      float val;
      bool k;
    };
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const std::vector<Perturb> perturbs =
        finite ? std::vector<Perturb>{{"masked-huge-k", big, true}, {"masked-huge-v", big, false}}
               : std::vector<Perturb>{{"masked-nan-k", nan, true},
                                      {"masked-inf-k", inf, true},
                                      {"masked-nan-v", nan, false},
                                      {"masked-inf-v", inf, false}};
    for (const Perturb& pt : perturbs) {
      const std::string what = std::isnan(pt.val)   ? "NaN"
                               : std::isinf(pt.val) ? "+Inf"
                               : pt.val == FLT_MAX  ? "FLT_MAX"
                                                    : "64";
      Variant m{pt.name, "mask",
                std::string(pt.k ? "k" : "v") + "[.., j, .., 0] = " + what +
                    " at keys some rows must not see (" + (pt.k ? "K" : "V") + " alone)",
                base, order};
      m.tensor = pt.k ? "k" : "v";
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t hk = 0; hk < p.heads_kv; ++hk)
          for (int64_t j : order) {
            if (pt.k)
              m.t.k[k_index(p, b, j, hk, 0)] = pt.val;
            else
              m.t.v[v_index(p, b, j, hk, 0)] = pt.val;
          }
      vs.push_back(std::move(m));
    }
  }
  if (p.seq_q >= 2) {
    Variant rc{"rows-changed",
               "rows",
               "every odd query row of q redrawn; even rows must give the same bits",
               base,
               {}};
    double amax = 0;
    for (float f : base.q)
      if (std::isfinite(f)) amax = std::max(amax, static_cast<double>(std::fabs(f)));
    if (amax == 0) amax = 1;
    Rng rng(c.seed ^ 0x6e70792d726f7773ull, 9);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t s = 1; s < p.seq_q; s += 2)
        for (int64_t h = 0; h < p.heads_q; ++h)
          for (int64_t d = 0; d < p.head_dim; ++d) {
            float f = static_cast<float>((2 * rng.uniform01() - 1) * amax);
            rc.t.q[q_index(p, b, s, h, d)] = cd == AF_DTYPE_F32 ? f : round_to_dtype(f, cd);
          }
    vs.push_back(std::move(rc));
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(dir.string() + ": cannot create the directory (" + ec.message() + ")");
  json m;
  m["schema"] = "attnfuzz-npy-manifest";
  m["schema_version"] = 1;
  m["tool"] = {{"name", "attn-check"}, {"version", ATTNFUZZ_VERSION}, {"command", command_line}};
  m["case"] = case_to_json(c);
  m["layout"] = layout_name(layout);
  m["compute_dtype"] = compute_dtype_name(cd);
  m["bf16_raw"] = raw;
  m["outputs"] =
      "write o.npy (same layout as q, dtype float32 or the compute dtype) and optionally lse.npy "
      "[B, Hq, Sq] float32 into each variant directory, then run attn-check --npy " +
      dir.string();
  std::vector<std::string> names;
  for (const Variant& v : vs) {
    write_variant(dir / v.name, v, p, cd, layout, raw);
    json e = {{"name", v.name}, {"relation", v.relation}, {"description", v.description}};
    if (!v.keys.empty()) e["perturbed_keys"] = v.keys;
    if (!v.tensor.empty()) e["perturbed_tensor"] = v.tensor;
    m["variants"].push_back(e);
    names.push_back(v.name);
  }
  std::ofstream f(dir / kManifestName);
  f << m.dump(2) << "\n";
  if (!f) fail((dir / kManifestName).string() + ": cannot write the file");
  return names;
}

std::vector<VariantResult> evaluate_manifest(const fs::path& dir, const Overrides& ov,
                                             const OracleOptions& opts, size_t worst) {
  const fs::path mp = dir / kManifestName;
  std::string text;
  if (std::string e = read_regular_file(mp, kMaxJsonBytes, text); !e.empty()) fail(e);
  json m;
  try {
    m = json::parse(text);
  } catch (const std::exception& e) {
    fail(mp.string() + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  if (m.value("schema", "") != "attnfuzz-npy-manifest" || !m.contains("variants") ||
      !m["variants"].is_array())
    fail(mp.string() + ": not an attn-check --npy-emit manifest");
  std::vector<VariantResult> out;
  std::vector<json> meta;
  for (const json& v : m["variants"]) {
    const std::string name = v.value("name", "");
    if (name.empty() || name.find('/') != std::string::npos) fail(mp.string() + ": bad variant name");
    const fs::path vd = dir / name;
    std::error_code ec;
    if (!fs::exists(vd / "o.npy", ec)) {
      if (name == "base")
        fail((vd / "o.npy").string() + ": the base output is missing (compute every variant's o.npy)");
      continue;
    }
    VariantResult r;
    r.name = name;
    r.ext = load_external(files_in(vd), resolve_spec(vd / "case.json", ov));
    r.ext.label = "npy:" + vd.string();
    r.judged = judge_external(r.ext, opts, worst);
    r.judged.result.kernel = "external/" + name;  // the verdict line and the summary name the variant
    out.push_back(std::move(r));
    meta.push_back(v);
  }
  const VariantResult& base = out.front();
  const Problem& bp = base.ext.problem;
  auto same_shape = [&](const Problem& p) {
    return p.batch == bp.batch && p.seq_q == bp.seq_q && p.heads_q == bp.heads_q &&
           p.head_dim_v == bp.head_dim_v;
  };
  const VariantResult *max_first = nullptr, *max_last = nullptr;
  for (size_t i = 1; i < out.size(); ++i) {
    VariantResult& r = out[i];
    CheckResult& res = r.judged.result;
    const Problem& p = r.ext.problem;
    const std::string rel = meta[i].value("relation", "");
    if (!same_shape(p)) {
      r.notes.push_back(r.name + ": shape differs from base: relation not evaluated");
      continue;
    }
    if (rel == "mask") {
      std::vector<int64_t> keys = meta[i].value("perturbed_keys", std::vector<int64_t>{});
      int64_t diff = 0, rows = 0;
      std::string first;
      for (int64_t s = 0; s < p.seq_q; ++s) {
        const KeyRange kr = visible_keys(p, s);
        bool sees = false;
        for (int64_t j : keys) sees |= j >= kr.first && j < kr.last;
        if (sees) continue;
        ++rows;
        for (int64_t b = 0; b < p.batch; ++b)
          for (int64_t h = 0; h < p.heads_q; ++h) {
            const std::string f = bits_diff(p, base.ext.o, r.ext.o, b, h, s, diff);
            if (first.empty()) first = f;
          }
      }
      std::vector<std::string> ks;
      for (auto j : keys) ks.push_back(std::to_string(j));
      const std::string tensor = meta[i].value("perturbed_tensor", std::string("k and v"));
      const std::string ks_text = "key(s) " + [&] {
        std::string t;
        for (const auto& k : ks) t += (t.empty() ? "" : ",") + k;
        return t;
      }();
      // What a leak through this tensor means for the kernel engineer.
      const std::string path =
          tensor == "k"   ? "masked K reached the scores / softmax of these rows (a score leak: the mask is "
                            "applied after the max or the row sum, or not at all)"
          : tensor == "v" ? "masked V reached P.V of these rows (V read at masked keys, e.g. weight 0 times "
                            "NaN/Inf = NaN: the P.V loop runs over masked keys)"
                          : "masked K/V reached these rows";
      if (diff) {
        make_fail(res, FailureClass::kMask,
                  "mask leak: perturbing " + tensor + " at masked " + ks_text + " changed " +
                      std::to_string(diff) + " output element(s) of rows that never see them");
        res.evidence.push_back(
            {"mask-perturb", "values placed in " + tensor + " at " + ks_text +
                                 ", which these rows must not see, changed their output bits "
                                 "(first " +
                                 first + "): " + path +
                                 "; masked positions must never contribute (if the kernel is "
                                 "not bitwise deterministic, compare two runs of base first)"});
      } else {
        res.evidence.push_back({"mask-perturb", std::to_string(rows) +
                                                    " row(s) that never see the perturbed " + tensor +
                                                    " at " + ks_text + " are bitwise equal to base"});
        if (res.verdict == Verdict::kFail && res.failure == FailureClass::kNonFinite) {
          res.failure = FailureClass::kMask;
          res.evidence.push_back(
              {"classify", "mask: NaN/Inf appear only with masked " + tensor + " perturbed"});
        }
      }
    } else if (rel == "order") {
      if (r.name == "keys-max-first") max_first = &r;
      if (r.name == "keys-max-last") max_last = &r;
      const bool bp_ok = base.judged.result.verdict != Verdict::kFail, vp_ok = res.verdict != Verdict::kFail;
      if (bp_ok != vp_ok)
        res.evidence.push_back({"order", std::string("the verdict depends on the key order: base ") +
                                             (bp_ok ? "passes" : "fails") + ", " + r.name + " " +
                                             (vp_ok ? "passes" : "fails")});
    } else if (rel == "rows") {
      int64_t diff = 0;
      std::string first;
      for (int64_t s = 0; s < p.seq_q; s += 2)
        for (int64_t b = 0; b < p.batch; ++b)
          for (int64_t h = 0; h < p.heads_q; ++h) {
            const std::string f = bits_diff(p, base.ext.o, r.ext.o, b, h, s, diff);
            if (first.empty()) first = f;
          }
      if (diff) {
        const std::string n = std::to_string(diff) +
                              " output element(s) of unchanged query rows differ in bits from base "
                              "(first " +
                              first + "): a row's result depends on other rows' queries";
        res.evidence.push_back({"row-independence", n});
        r.notes.push_back(r.name + ": " + n +
                          (res.verdict == Verdict::kFail ? "" : " (within the bound: not a failure)"));
      } else {
        res.evidence.push_back({"row-independence", "unchanged query rows are bitwise equal to base"});
      }
    }
  }
  // docs/semantics.md's rescale signature: wrong when the max key comes late, right when it comes first.
  if (max_first && max_last && max_first->judged.result.verdict != Verdict::kFail &&
      max_last->judged.result.verdict == Verdict::kFail) {
    for (auto& r : out)
      if (&r == max_last) {
        r.judged.result.failure = FailureClass::kRescale;
        r.judged.result.evidence.push_back(
            {"reorder",
             "fails with the largest-score key last and passes with it first: the running max / sum / "
             "accumulator is not rescaled when the max changes"});
      }
  }
  return out;
}

}  // namespace attnfuzz::npy
