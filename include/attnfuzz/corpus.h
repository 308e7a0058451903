// corpus.h - the corpus file format (corpus/README.md): a saved Case, who made it, and its verdict.
#pragma once

#include <time.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "attnfuzz/case.h"
#include "attnfuzz/verdict.h"

namespace attnfuzz {

// JSON with keys kept in the order written (files read top-down: format, tool, case, verdict).
using Json = nlohmann::ordered_json;

// First line of every corpus file is "ATTNFUZZ-CASE <version>".
inline constexpr const char* kCorpusMagic = "ATTNFUZZ-CASE";
inline constexpr int kCorpusFormatVersion = 1;
inline constexpr const char* kCaseFileExtension = ".case";

// Every way reading (or writing) a corpus file can fail. what() is one line naming the file and the
// problem; a CLI prints it and exits 2.
class CorpusError : public std::runtime_error {
 public:
  enum class Kind {
    kIo,             // cannot open / read / write
    kTruncated,      // empty, or the JSON ends early
    kForeign,        // the first line is not the magic: not a corpus file
    kFutureVersion,  // written by a newer format version than this build reads
    kCorrupt,        // malformed JSON, a missing or mistyped field, a bad value, an invalid case
  };
  CorpusError(Kind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};
const char* corpus_error_kind_name(CorpusError::Kind k);  // "io", "truncated", ...

// Which tool wrote an artifact, with what options (csmith-style provenance). Reading refuses files
// without a tool version.
struct ToolInfo {
  std::string name = "attn-fuzz";
  std::string version = ATTNFUZZ_VERSION;
  std::string command;  // the command line or options that produced the case (may be empty)
};

// The verdict recorded with a case (what replay must reproduce).
struct RecordedVerdict {
  std::string kernel;
  std::string backend;
  std::string device;
  Verdict verdict = Verdict::kFail;
  FailureClass failure = FailureClass::kNone;
  std::string signature;  // dedup key within (kernel, class), chosen by the checker
  std::string reason;     // one line
  double max_ratio = 0;   // max |err| / bound (+inf for a NaN/Inf mismatch)
  int64_t compared = 0;   // output elements compared, and how many of them failed (CheckResult's counts);
  int64_t failed = 0;     // -1 when read from a file that does not record them
};

// The verdict to record for a check's result (signature: the dedup key the caller chose).
RecordedVerdict recorded_verdict(const CheckResult& r, std::string signature = {});
// The reverse, for reports over saved failures: the recorded fields, and the signature as evidence.
CheckResult recorded_result(const RecordedVerdict& v);

// Quotes a word for a POSIX shell (replay commands are printed for copy and paste).
std::string shell_quote(const std::string& s);

struct CorpusFile {
  int format_version = kCorpusFormatVersion;
  ToolInfo tool;
  Case the_case;
  std::optional<RecordedVerdict> verdict;
};

// --- JSON pieces (shared with the reports, so a report's "case" reads back with case_from_json) ---
Json problem_to_json(const Problem& p);
Problem problem_from_json(const Json& j);  // throws CorpusError(kCorrupt)
Json case_to_json(const Case& c);          // label, problem, values, seed, explicit values
Case case_from_json(const Json& j);        // throws CorpusError(kCorrupt); validates the case
Json verdict_to_json(const RecordedVerdict& v);
RecordedVerdict verdict_from_json(const Json& j);  // throws CorpusError(kCorrupt)

// A JSON number, or "nan" / "inf" / "-inf" strings for the values JSON cannot hold.
Json json_number(double v);
// "0x%016x" form of a seed; parse accepts that form or a plain decimal number.
std::string seed_to_hex(uint64_t seed);
// Floats as big-endian hex of their bits, 8 digits each ("3f800000bf800000..."): bit exact, NaN payloads
// included. hex_to_floats throws CorpusError(kCorrupt) on a bad digit or length.
std::string floats_to_hex(const std::vector<float>& v);
std::vector<float> hex_to_floats(std::string_view hex, const std::string& what);

// --- files ---
std::string to_corpus_text(const CorpusFile& f);
// origin names the source in error messages (a path, or "<memory>").
CorpusFile parse_corpus(std::string_view text, const std::string& origin = "<memory>");
// Reads a corpus file: a regular file of at most kMaxCorpusFileBytes (FIFOs, devices such as /dev/zero
// and larger files are refused before reading; the read itself stops at the limit). Throws CorpusError.
CorpusFile read_corpus_file(const std::filesystem::path& path);
constexpr uint64_t kMaxCorpusFileBytes = uint64_t{64} << 20;
// Every tool's bounded read of an input file (corpus, JSON sidecar, manifest): refuses what is not a
// regular file or is larger than max_bytes without reading it, and never reads more than max_bytes + 1.
// Returns "" and fills `out`, or a one-line reason ("x.json: not a regular file (a character device)").
std::string read_regular_file(const std::filesystem::path& path, uint64_t max_bytes, std::string& out);
// Every tool's write of an output file (reports, summaries, JUnit, failure sidecars, corpus and sync files): whole
// or not at all, so a process killed at any moment leaves either the old file or the new one. The bytes go to a
// temporary file in the same directory, named "." + name + "." + host + "." + pid + "." + counter (readers skip
// names starting with '.'; two writers never share one), with the given mtime if any, then rename() it into
// place (atomic on local file systems and NFS). The directory must exist. Returns "" or a one-line reason.
std::string write_file_atomically(const std::filesystem::path& path, std::string_view bytes,
                                  const struct timespec* mtime = nullptr);
// Writes atomically (write_file_atomically). Throws CorpusError(kIo).
void write_corpus_file(const std::filesystem::path& path, const CorpusFile& f);

// 16 hex digits identifying the case content (problem, values, seed, explicit values; not the label)
// together with the recorded kernel, if any.
std::string case_hash(const CorpusFile& f);
// "<class>-<hash16>.case": class is the recorded failure class ("non-finite", ...), or the verdict
// name when it has no class ("pass", "unsupported", "outside-contract"), or "case" without a verdict.
std::string corpus_file_name(const CorpusFile& f);
// Writes f into dir under corpus_file_name(f) (creating dir) and returns the path. An existing file of
// that name is left alone (same content hash: same case).
std::filesystem::path save_to_corpus_dir(const std::filesystem::path& dir, const CorpusFile& f);

}  // namespace attnfuzz
