// bug_report.h - attn-check --replay FILE --bug-report DIR: the bundle a library maintainer accepts
// (docs/attn-check.md "Bug reports"): the case, its replay command, the evidence and class, the heatmap and a
// README.md; for an adapter kernel that declares it, a script of at most 40 lines and its .npz
// (adapters/PROTOCOL.md "Bug reports").
#pragma once

#include <string>

#include "attnfuzz/corpus.h"
#include "tools/cli_common.h"

namespace attnfuzz {

struct BugReport {
  std::string file;     // the replayed file
  CorpusFile recorded;  // its case and recorded verdict (the minimal case when minimized here)
  // With --minimize: the case the minimal one came from, described ("" = not minimized here).
  std::string original;
  // Where the bundle goes: an existing, writable directory (an earlier bundle's files are replaced).
  std::string dir;
};

// Replays the recorded failure on the session's device and writes the bundle into in.dir. Returns 0 when it
// is written, 2 after one line on stderr when the file records no failure, its kernel is not loaded, the
// failure does not reproduce (recorded class vs now) or a file cannot be written there.
int write_bug_report(Session& s, const BugReport& in);

}  // namespace attnfuzz
