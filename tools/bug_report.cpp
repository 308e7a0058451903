// bug_report.cpp - attn-check --bug-report: replay one recorded failure, then write its bundle
// (tools/bug_report.h).
#include "tools/bug_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "check/runner.h"
#include "runtime/adapter/adapter.h"

namespace fs = std::filesystem;

namespace attnfuzz {
namespace {

using ReproTensor = AdapterDevice::ReproRequest::Tensor;
constexpr double kNotCompared = std::numeric_limits<double>::quiet_NaN();

int bad_input(const std::string& line) {
  std::fprintf(stderr, "attn-check: %s\n", line.c_str());
  return 2;
}

// expected_<name> and bound_<name> (PROTOCOL.md "Bug reports"); the bound is NaN where nothing was compared.
void add_expected(std::vector<ReproTensor>& out, const std::string& name, const std::vector<int64_t>& shape,
                  const std::vector<double>& exact, std::vector<double> bound) {
  out.push_back({"expected_" + name, shape, exact});
  out.push_back({"bound_" + name, shape, std::move(bound)});
}

// O [B, Sq, Hq, Dv] (and LSE [B, Hq, Sq] when the kernel writes it) as compare_output judges them: rows the
// oracle did not compute (sampling) or that lie outside the fp32 contract are not compared.
std::vector<ReproTensor> forward_expected(const OracleResult& ex, bool lse) {
  const Problem& p = ex.problem;
  std::vector<double> ob = ex.o_bound, lb = ex.lse_bound;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < p.seq_q; ++s) {
        const RowInfo& r = ex.row(b, h, s);
        if (r.computed && r.inside_contract()) continue;
        lb[ex.lse_at(b, h, s)] = kNotCompared;
        for (int64_t d = 0; d < p.head_dim_v; ++d) ob[ex.o_at(b, s, h, d)] = kNotCompared;
      }
  std::vector<ReproTensor> out;
  add_expected(out, "o", {p.batch, p.seq_q, p.heads_q, p.head_dim_v}, ex.o, std::move(ob));
  if (lse) add_expected(out, "lse", {p.batch, p.heads_q, p.seq_q}, ex.lse, std::move(lb));
  return out;
}

// A packed q's O travels in q's layout, [total_q, Hq, Dv] (PROTOCOL.md "Sequence layouts"): expected_o and bound_o
// become the dense view's rows t < Sq_b of each sequence b, at packed row cu_seqlens_q[b] + t (the well-formed array).
void pack_o_rows(std::vector<ReproTensor>& ts, const Problem& p, const Tensors& t) {
  const int64_t row = p.heads_q * p.head_dim_v;
  for (ReproTensor& x : ts) {
    if (x.name != "expected_o" && x.name != "bound_o") continue;
    std::vector<double> out(static_cast<size_t>(p.total_q * row));
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t s = 0; s < t.cu_seqlens_q[b + 1] - t.cu_seqlens_q[b]; ++s)
        std::copy_n(x.data.begin() + (b * x.shape[1] + s) * row, row, out.begin() + (t.cu_seqlens_q[b] + s) * row);
    x.shape = {p.total_q, p.heads_q, p.head_dim_v};
    x.data = std::move(out);
  }
}

// dQ [B, Sq, Hq, D], dK [B, Sk, Hkv, D], dV [B, Sk, Hkv, Dv] as compare_gradients judges them.
std::vector<ReproTensor> backward_expected(const GradResult& g) {
  const Problem& p = g.problem;
  std::vector<double> qb = g.dq_bound, kb = g.dk_bound, vb = g.dv_bound;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t s = 0; s < p.seq_q; ++s)
      for (int64_t h = 0; h < p.heads_q; ++h)
        if (!g.inside_contract || !g.q_computed[static_cast<size_t>((b * p.seq_q + s) * p.heads_q + h)])
          for (int64_t d = 0; d < p.head_dim; ++d) qb[g.dq_at(b, s, h, d)] = kNotCompared;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t j = 0; j < p.seq_k; ++j)
      for (int64_t h = 0; h < p.heads_kv; ++h)
        if (!g.inside_contract || !g.k_computed[static_cast<size_t>((b * p.seq_k + j) * p.heads_kv + h)]) {
          for (int64_t d = 0; d < p.head_dim; ++d) kb[g.dk_at(b, j, h, d)] = kNotCompared;
          for (int64_t d = 0; d < p.head_dim_v; ++d) vb[g.dv_at(b, j, h, d)] = kNotCompared;
        }
  std::vector<ReproTensor> out;
  add_expected(out, "dq", {p.batch, p.seq_q, p.heads_q, p.head_dim}, g.dq, std::move(qb));
  add_expected(out, "dk", {p.batch, p.seq_k, p.heads_kv, p.head_dim}, g.dk, std::move(kb));
  add_expected(out, "dv", {p.batch, p.seq_k, p.heads_kv, p.head_dim_v}, g.dv, std::move(vb));
  return out;
}

// Relaunches the case once more with the adapter asked for its script (AdapterDevice::request_repro): the
// files it wrote, or why there are none.
AdapterDevice::ReproReply adapter_script(Session& s, const KernelEntry& k, PreparedCase& pc, const Judged& j,
                                         const fs::path& dir, const std::vector<std::string>& comment) {
  auto* ad = dynamic_cast<AdapterDevice*>(s.device.get());
  const Case& c = pc.the_case();
  if (!ad) return {{}, "not an adapter kernel"};
  if (c.pass == Pass::kFwdBwd)
    return {{}, "scripts are written for forward or backward cases (this one is fwd+bwd): replay it with the "
                "command above"};
  const RunOptions opts = for_kernel(s.run, k.kernel, pc.problem());
  AdapterDevice::ReproRequest req;
  req.dir = fs::absolute(dir).string();
  req.comment = comment;
  // Malformed metadata: the script passes the arrays as sent and holds the library to raising; expected values only
  // where the well-formed reading is the right answer (docs/semantics.md "Malformed metadata").
  const Malformation mk = pc.tensors().malformed.kind;
  if (mk != Malformation::kNone)
    req.malformed = {malformation_name(mk), describe_malformation(c.problem, pc.tensors()),
                     malformation_has_answer(mk)};
  if (mk == Malformation::kNone || malformation_has_answer(mk))
    req.tensors = c.pass == Pass::kBwd ? backward_expected(grad_oracle_for(pc, j.outcome, opts))
                                       : forward_expected(pc.oracle(opts.oracle), k.kernel.writes_lse != 0);
  if (c.problem.q_layout == AF_SEQ_PACKED) pack_o_rows(req.tensors, c.problem, pc.tensors());
  ad->request_repro(std::move(req));
  const LaunchOutcome out = launch_for_pass(*s.device, k, pc, pc.tensors(), opts);
  AdapterDevice::ReproReply reply = ad->repro_reply();
  if (reply.files.empty() && reply.error.empty()) reply.error = "no answer (" + out.launch.message + ")";
  return reply;
}

std::string readme_text(const BugReport& in, const RunEntry& e, const AdapterDevice::ReproReply& script,
                        bool adapter) {
  const CheckResult& r = e.result;
  std::string t = "# " + r.kernel + ": " + failure_class_name(r.failure) + " on " +
                  input_tier_name(input_tier(e.the_case)) + " inputs\n\n";
  t += "Found by attn-fuzz " ATTNFUZZ_VERSION " (" + in.file + "), reproduced on " + r.device + ".\n\n";
  t += "- case: `" + describe(e.the_case) + "`" +
       (in.original.empty() ? "" : " (minimized from `" + in.original + "`)") + "\n";
  t += "- verdict: " + std::string(failure_class_name(r.failure)) +
       (r.decided_by.empty() ? "" : " (decided by " + r.decided_by + ")") + ": " + r.reason + "\n";
  t += "- input tier: " + std::string(input_tier_name(input_tier(e.the_case))) +
       " (docs/semantics.md \"Input tiers\" in attn-fuzz)\n\n## Reproduce\n\n";
  const Malformation mk = e.the_case.seqs.malformed.kind;
  const std::string sent = "the malformed arrays as sent (docs/semantics.md \"Malformed metadata\"): exits 0 when the "
                           "library raises";
  const std::string contract =
      mk == Malformation::kNone
          ? std::string("exits 1 while the library is wrong, 0 once fixed (numpy and the library; inputs in the .npz)")
      : malformation_has_answer(mk) ? sent + " or returns the well-formed arrays' result, 1 otherwise"
                                    : sent + ", 1 when it returns";
  if (!script.files.empty())
    t += "    python3 " + fs::path(script.files.front()).filename().string() + "    # " + contract + "\n";
  t += "    " + e.replay_command + "    # attn-fuzz's replay\n\n";
  if (script.files.empty() && adapter) t += "No script: " + script.error + ".\n\n";
  t += "## Files\n\n- `" + fs::relative(e.corpus_path, in.dir).string() +
       "`: the case (attn-fuzz's corpus format: shape, mask, scale, dtype, value seed, recorded verdict)\n";
  for (const std::string& f : script.files)
    t += "- `" + fs::path(f).filename().string() + "`: " +
         (fs::path(f).extension() == ".py"
              ? "the script (calls the library as the adapter did)"
              : mk != Malformation::kNone && !malformation_has_answer(mk)
                  ? "its inputs as the adapter received them, the malformed arrays included (no expected values: "
                    "no result of them is right)"
                  : "its inputs, expected values (attn-fuzz's exact oracle) and bounds") +
         "\n";
  if (!e.heatmap_path.empty())
    t += "- `" + e.heatmap_path + "`: |error| / bound per (query row, column), max over batch and heads\n";
  t += "\n## Evidence\n\n";
  for (const Evidence& ev : r.evidence) t += "- " + ev.detector + ": " + ev.detail + "\n";
  if (!r.worst.empty()) {
    t += "\n## Worst elements\n\n| element | expected | got | bound |\n|---|---|---|---|\n";
    char buf[128];
    for (size_t i = 0; i < r.worst.size() && i < 8; ++i) {
      const ElementReport& w = r.worst[i];
      std::snprintf(buf, sizeof buf, " | %.9g | %.9g | %.3g |\n", w.expected, w.got, w.bound);
      t += "| " + element_name(w) + buf;
    }
  }
  return t;
}

}  // namespace

int write_bug_report(Session& s, const BugReport& in) {
  const std::optional<RecordedVerdict>& rv = in.recorded.verdict;
  if (!rv || rv->verdict != Verdict::kFail)
    return bad_input(in.file + ": records no failure" +
                     (rv ? " (verdict " + std::string(verdict_name(rv->verdict)) + ")" : "") +
                     ": nothing to report");
  const KernelEntry* k = nullptr;
  try {
    const auto ks = s.registry->select(s.device->backend(), rv->kernel);
    if (ks.size() == 1) k = ks.front();
  } catch (const std::invalid_argument&) {
  }
  if (!k) return bad_input(in.file + ": its kernel " + rv->kernel + " is not loaded on " + s.device->name());
  CommonOptions o = s.opts;
  o.out = in.dir;  // the case, its replay command and the heatmap land in the bundle
  Runner runner(s, o);
  runner.begin(1);
  PreparedCase pc(in.recorded.the_case);
  const Judged& j = runner.check(*k, pc, in.file);
  const RunEntry e = runner.entries().back();
  if (j.result.verdict != Verdict::kFail || j.result.failure != rv->failure) {
    const auto cls = [](Verdict v, FailureClass f) {
      return std::string(verdict_name(v)) +
             (f != FailureClass::kNone ? "/" + std::string(failure_class_name(f)) : "");
    };
    return bad_input(in.file + ": does not reproduce on " + s.device->name() + ": recorded " +
                     cls(rv->verdict, rv->failure) + ", now " + cls(j.result.verdict, j.result.failure));
  }
  if (e.corpus_path.empty())
    return bad_input("--bug-report " + in.dir + ": cannot write the case file there");
  const bool adapter = s.device->backend() == Backend::kAdapter;
  AdapterDevice::ReproReply script;
  if (adapter)
    script = adapter_script(s, *k, pc, j, in.dir,
                            {"attn-fuzz bug report: " + e.result.kernel + " fails (" +
                                 failure_class_name(e.result.failure) + ") on " + describe(e.the_case),
                             "attn-fuzz replay: " + e.replay_command});
  const fs::path readme = fs::path(in.dir) / "README.md";
  std::ofstream f(readme);
  if (!(f << readme_text(in, e, script, adapter) << std::flush))
    return bad_input("--bug-report " + in.dir + ": cannot write " + readme.string());
  std::printf("bug report: %s (%s%s)\n", in.dir.c_str(), script.files.empty() ? "no script" : "script ",
              script.files.empty() ? "" : fs::path(script.files.front()).filename().c_str());
  if (adapter && script.files.empty()) std::printf("  no script: %s\n", script.error.c_str());
  return 0;
}

}  // namespace attnfuzz
