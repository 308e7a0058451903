// unwritten.cpp - the unwritten detector: relaunch with a second output poison; elements that keep the
// pre-launch poison under both were never written.
#include <algorithm>
#include <cstring>
#include <map>

#include "check/detectors/detectors.h"

namespace attnfuzz::detect {

namespace {
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
std::string poison_text(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return fmt("0x%08x (%s)", u, num(f).c_str());
}
}  // namespace

namespace {
// Backward launches: addressed dQ / dK / dV elements that keep the output poison under both poisons.
Finding unwritten_gradients(Context& c, const LaunchOutcome& first, const LaunchOutcome& second, uint32_t pa,
                            uint32_t pb) {
  Finding f;
  const Problem& p = c.problem();
  std::string detail, first_elem;
  int64_t total = 0;
  auto scan = [&](const char* name, const std::vector<float>& a, const std::vector<float>& x, const int64_t* st,
                  int64_t seq, int64_t heads, int64_t dim) {
    int64_t n = 0;
    std::vector<int64_t> pos;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t d = 0; d < dim; ++d) {
            const size_t i = static_cast<size_t>(b * st[0] + s * st[1] + h * st[2] + d);
            if (bits(a[i]) != pa || bits(x[i]) != pb) continue;
            if (n++ == 0 && first_elem.empty())
              first_elem = fmt("%s[b=%lld,%s=%lld,h=%lld,d=%lld]", name, (long long)b, seq == p.seq_q ? "s" : "j",
                               (long long)s, (long long)h, (long long)d);
            pos.push_back(s);
          }
    if (!n) return;
    std::sort(pos.begin(), pos.end());
    pos.erase(std::unique(pos.begin(), pos.end()), pos.end());
    if (!detail.empty()) detail += "; ";
    detail += fmt("%s: %lld element(s), %s = ", name, (long long)n, name[1] == 'Q' ? "query rows s" : "keys j") +
              ranges(pos) + fmt(" of %lld", (long long)seq);
    total += n;
  };
  scan("dQ", first.dq, second.dq, p.q_stride, p.seq_q, p.heads_q, p.head_dim);
  scan("dK", first.dk, second.dk, p.k_stride, p.seq_k, p.heads_kv, p.head_dim);
  scan("dV", first.dv, second.dv, p.v_stride, p.seq_k, p.heads_kv, p.head_dim_v);
  if (!total) {
    f.evidence.push_back({"unwritten", fmt("%lld gradient element(s) held the first poison, none keeps the second: "
                                           "written with the poison's value, not left unwritten",
                                           (long long)first.unwritten)});
    return f;
  }
  f.fired = true;
  f.cls = FailureClass::kUnwritten;
  f.evidence.push_back({"unwritten", "gradient elements keep the pre-launch poison under both " + poison_text(pa) +
                                         " and " + poison_text(pb) + ": never written; " + detail + "; first " +
                                         first_elem});
  return f;
}
}  // namespace

Finding unwritten(Context& c) {
  Finding f;
  const LaunchOutcome& first = c.original();
  if (first.o.empty() || first.unwritten == 0) return f;
  if (first.backward && (c.gradient_failure() || c.pass() == Pass::kBwd)) {
    RunOptions o = c.opts;
    o.output_poison = c.opts.output_poison == kOutputPoisonAlt ? kOutputPoison : kOutputPoisonAlt;
    const LaunchOutcome second = c.launch(c.tensors(), o);
    if (second.launch.status != LaunchStatus::kOk || !second.backward || second.dq.size() != first.dq.size()) {
      f.evidence.push_back({"unwritten", std::string("the relaunch with the second output poison ended with ") +
                                             launch_status_name(second.launch.status)});
      return f;
    }
    return unwritten_gradients(c, first, second, c.opts.output_poison, o.output_poison);
  }
  const Problem& p = c.problem();
  RunOptions o = c.opts;
  o.output_poison = c.opts.output_poison == kOutputPoisonAlt ? kOutputPoison : kOutputPoisonAlt;
  const LaunchOutcome second = c.launch(c.tensors(), o);
  if (second.launch.status != LaunchStatus::kOk || second.o.size() != first.o.size() ||
      second.lse.size() != first.lse.size()) {
    f.evidence.push_back({"unwritten", std::string("the relaunch with the second output poison ended with ") +
                                           launch_status_name(second.launch.status)});
    return f;
  }
  const uint32_t pa = c.opts.output_poison, pb = o.output_poison;
  int64_t o_count = 0, lse_count = 0, o_first_only = 0;
  std::string first_elem;
  // Per (b, h): the query rows with an unwritten O element, and whether every Dv column of them is.
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> rows;
  std::vector<int64_t> all_rows;
  bool whole_rows = true;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t s = 0; s < p.seq_q; ++s) {
        int64_t n = 0;
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          const size_t i = static_cast<size_t>(o_index(p, b, s, h, d));
          const bool a = bits(first.o[i]) == pa, x = bits(second.o[i]) == pb;
          if (a && x) {
            if (o_count++ == 0) first_elem = o_name(b, s, h, d);
            ++n;
          } else if (a) {
            ++o_first_only;
          }
        }
        if (!first.lse.empty()) {
          const size_t i = static_cast<size_t>(lse_index(p, b, h, s));
          if (bits(first.lse[i]) == pa && bits(second.lse[i]) == pb) {
            if (lse_count++ == 0 && first_elem.empty())
              first_elem = fmt("LSE[b=%lld,h=%lld,s=%lld]", (long long)b, (long long)h, (long long)s);
          }
        }
        if (n) {
          rows[{b, h}].push_back(s);
          all_rows.push_back(s);
          whole_rows &= n == p.head_dim_v;
        }
      }
  const std::string both = "under both " + poison_text(pa) + " and " + poison_text(pb);
  if (o_count + lse_count == 0) {
    f.evidence.push_back({"unwritten", fmt("%lld element(s) held the first poison, but none keeps the second "
                                           "one: written with the poison's own value (e.g. copied), not left "
                                           "unwritten",
                                           (long long)first.unwritten)});
    return f;
  }
  std::sort(all_rows.begin(), all_rows.end());
  all_rows.erase(std::unique(all_rows.begin(), all_rows.end()), all_rows.end());
  std::string detail = fmt("%lld O element(s) and %lld LSE element(s) keep the pre-launch poison ",
                           (long long)o_count, (long long)lse_count) +
                       both + ": never written";
  if (!all_rows.empty()) {
    detail += fmt("; O in %zu (b, h) slice(s), query rows s = ", rows.size()) + ranges(all_rows) +
              fmt(" of Sq=%lld", (long long)p.seq_q) +
              (whole_rows ? " (every Dv column)" : " (some columns)");
    // A suffix [s0, Sq) in every slice that starts on a tile boundary: the last partial tile not stored.
    bool suffix = true;
    for (const auto& [bh, v] : rows)
      suffix &= v.back() == p.seq_q - 1 && v.back() - v.front() + 1 == static_cast<int64_t>(v.size()) &&
                v.front() == all_rows.front();
    const int64_t s0 = all_rows.front();
    if (suffix && s0 > 0)
      for (int64_t tile : {128, 64, 32, 16, 8})
        if (s0 % tile == 0 && p.seq_q - s0 < tile) {
          detail +=
              fmt("; the rows from s=%lld to the end are the last partial %lld-row tile (Sq %% %lld = %lld): "
                  "a tile store bounded by whole tiles",
                  (long long)s0, (long long)tile, (long long)tile, (long long)(p.seq_q % tile));
          break;
        }
  }
  detail += "; first " + first_elem;
  if (o_first_only) detail += fmt("; %lld more held the first poison only", (long long)o_first_only);
  f.fired = true;
  f.cls = FailureClass::kUnwritten;
  f.evidence.push_back({"unwritten", detail});
  return f;
}

}  // namespace attnfuzz::detect
