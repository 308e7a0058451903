// console.cpp - bounded console output (issue 26): the evidence line(s) that decided a failure's class, and the
// tally that shows the first failures of each kernel x class and counts the rest.
#include <sstream>

#include "attnfuzz/report.h"

namespace attnfuzz {

namespace {
// Detectors whose lines say what did not happen (or are advisory): never the deciding evidence.
bool background(const std::string& detector) {
  for (const char* d : {"compare", "flash-rule", "rows", "classify", "bound"})
    if (detector == d) return true;
  return false;
}
}  // namespace

std::vector<const Evidence*> deciding_evidence(const CheckResult& r) {
  std::string by;  // the classify line reads "CLASS by DETECTOR (...)"; "by check": the check's own finding
  for (const Evidence& e : r.evidence)
    if (e.detector == "classify") {
      std::istringstream words(e.detail);
      std::string cls, word;
      // Only when it names the final class (a later experiment, e.g. an NPY variant, may have changed it).
      if (words >> cls >> word && word == "by" && cls == failure_class_name(r.failure)) words >> by;
    }
  bool by_has_lines = false;
  for (const Evidence& e : r.evidence) by_has_lines |= !by.empty() && e.detector == by;
  if (!by_has_lines) by.clear();  // the decider left no line of its own: every detector's but the background
  // The deciding detector's lines; no detector ran (the check decided, or outputs judged from files): every
  // detector's but the background ones. Of each detector its first line and its last (the conclusion).
  std::vector<const Evidence*> out;
  std::map<std::string, std::vector<const Evidence*>> by_detector;
  std::vector<std::string> order;
  for (const Evidence& e : r.evidence) {
    const bool wanted = by.empty() || by == "check" ? !background(e.detector) : e.detector == by;
    if (!wanted) continue;
    if (by_detector[e.detector].empty()) order.push_back(e.detector);
    by_detector[e.detector].push_back(&e);
  }
  for (const std::string& d : order) {
    const auto& g = by_detector[d];
    out.push_back(g.front());
    if (g.size() > 1) out.push_back(g.back());
  }
  return out;
}

int64_t FailureTally::add(const std::string& kernel, const std::string& cls) {
  const auto [it, fresh] = seen_.emplace(std::make_pair(kernel, cls), 0);
  if (fresh) order_.push_back(it->first);
  return it->second++;
}

int64_t FailureTally::count(const std::string& kernel, const std::string& cls) const {
  const auto it = seen_.find({kernel, cls});
  return it == seen_.end() ? 0 : it->second;
}

int64_t FailureTally::total() const {
  int64_t n = 0;
  for (const auto& [k, c] : seen_) n += c;
  return n;
}

size_t FailureTally::kernels() const {
  std::set<std::string> k;
  for (const auto& [key, c] : seen_) k.insert(key.first);
  return k.size();
}

std::string FailureTally::headline(const std::string& start_kernel, const std::string& start_class,
                                   const std::string& start_replay) const {
  const int64_t n = total();
  std::ostringstream s;
  s << n << (n == 1 ? " failure" : " failures") << " in " << groups() << " kernel x class pair"
    << (groups() == 1 ? "" : "s") << " (" << kernels() << " kernel" << (kernels() == 1 ? "" : "s")
    << "); start with: " << start_kernel << " " << start_class;
  if (!start_replay.empty()) s << ": " << start_replay;
  return s.str();
}

}  // namespace attnfuzz
