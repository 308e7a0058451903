// sync_test.cpp - attn-fuzz --sync and --merge: publish / import through a shared directory, dedup of
// failures across campaigns, atomicity (a partially written file is never imported), the merged summary,
// and two real campaigns syncing through a temporary directory.
#include "fuzz/sync.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "attnfuzz/corpus.h"

namespace fs = std::filesystem;

namespace attnfuzz::fuzz {
namespace {

fs::path fresh(const std::string& name) {
  const fs::path d = fs::path(TEST_TMP) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

Case some_case(uint64_t seed) {
  Rng rng(seed);
  const CaseDomain dom;
  return dom.init(rng).the_case;
}

CorpusFile failure_file(uint64_t seed, const std::string& kernel, FailureClass cls, const std::string& sig) {
  CorpusFile f;
  f.the_case = some_case(seed);
  RecordedVerdict v;
  v.kernel = kernel;
  v.backend = "cpu";
  v.device = "test";
  v.verdict = Verdict::kFail;
  v.failure = cls;
  v.signature = sig;
  v.reason = "planted";
  f.verdict = v;
  return f;
}

// A campaign directory as run_campaign leaves it (what Sync reads and writes).
struct FakeCampaign {
  fs::path out;
  SyncConfig cfg;
  FakeCampaign(const fs::path& root, const std::string& name, const fs::path& sync_dir) {
    out = root / name;
    for (const char* d : {"failures", "fuzz-corpus", "work/dedup"}) fs::create_directories(out / d);
    cfg.dir = sync_dir;
    cfg.name = name;
    cfg.out = out;
    cfg.corpus = out / "fuzz-corpus";
    cfg.kernels = {"k0", "k1"};
    cfg.quiet = true;
  }
  fs::path add_corpus(uint64_t seed) {
    CorpusFile f;
    f.the_case = some_case(seed);
    f.the_case.label = "fuzz-k1";
    return save_to_corpus_dir(cfg.corpus, f);
  }
  // A failure found here: claimed in work/dedup like a worker does, saved in failures/.
  fs::path add_failure(const CorpusFile& f) {
    std::ofstream(out / "work" / "dedup" / failure_key(*f.verdict)) << "x\n";
    return save_to_corpus_dir(out / "failures", f);
  }
};

std::set<std::string> names(const fs::path& dir) {
  std::set<std::string> s;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file()) s.insert(e.path().filename().string());
  return s;
}

TEST(Sync, CorpusEntriesCrossBothWaysAndFeedTheWorkers) {
  const fs::path root = fresh("cross"), dir = root / "sync";
  FakeCampaign a(root, "a", dir), b(root, "b", dir);
  const std::string ea = a.add_corpus(1).filename().string(), eb = b.add_corpus(2).filename().string();
  Sync sa(a.cfg), sb(b.cfg);
  sa.start();
  sb.start();
  sa.round();  // a publishes ea
  sb.round();  // b imports ea, publishes eb
  sa.round();  // a imports eb
  EXPECT_TRUE(names(a.cfg.corpus).count(eb));
  EXPECT_TRUE(names(b.cfg.corpus).count(ea));
  EXPECT_EQ(sa.totals().imported_corpus.at("b"), 1);
  EXPECT_EQ(sb.totals().imported_corpus.at("a"), 1);
  // b publishes only what it found itself, not what it imported from a
  EXPECT_EQ(names(dir / "b" / "corpus"), std::set<std::string>{eb});
  EXPECT_EQ(names(dir / "a" / "corpus"), std::set<std::string>{ea});
  // the imported entry waits in the workers' inbox as a fuzzer input of the kernel it was labelled with
  ASSERT_EQ(names(a.out / "work" / "sync-in").size(), 1u);
  auto in = take_synced_input(a.out.string(), 1 << 20);
  ASSERT_TRUE(in.has_value());
  const FuzzInput got = decode(in->data(), in->size(), a.cfg.limits);
  EXPECT_EQ(got.kernel, 1u);
  EXPECT_EQ(describe(got.the_case), describe(read_corpus_file(a.cfg.corpus / eb).the_case));
  EXPECT_TRUE(names(a.out / "work" / "sync-in").empty());
  EXPECT_EQ(sa.totals().imported_inputs_run, 1);
  // another round imports nothing again
  sa.round();
  EXPECT_EQ(sa.totals().imported_corpus.at("b"), 1);
}

TEST(Sync, FailuresAreDeduplicatedAcrossCampaigns) {
  const fs::path root = fresh("dedup"), dir = root / "sync";
  FakeCampaign a(root, "a", dir), b(root, "b", dir), c(root, "c", dir);
  // a and b both found (k0, mask, mask:compare) on different cases; a also found (k1, nan, ...)
  a.add_failure(failure_file(10, "k0", FailureClass::kMask, "mask:compare"));
  a.add_failure(failure_file(11, "k1", FailureClass::kNonFinite, "non-finite:compare"));
  b.add_failure(failure_file(12, "k0", FailureClass::kMask, "mask:compare"));
  Sync sa(a.cfg), sb(b.cfg);
  auto sc = std::make_unique<Sync>(c.cfg);
  for (Sync* s : {&sa, &sb, sc.get()}) s->start();
  for (int i = 0; i < 2; ++i)
    for (Sync* s : {&sa, &sb, sc.get()}) s->round();
  // a imports nothing (it has both keys); b imports only the key it lacks; c imports each key once
  EXPECT_TRUE(sa.imported_failures().empty());
  const auto ib = sb.imported_failures();
  ASSERT_EQ(ib.size(), 1u);
  EXPECT_EQ(ib[0].verdict.kernel, "k1");
  EXPECT_EQ(ib[0].from, "a");
  const auto ic = sc->imported_failures();
  ASSERT_EQ(ic.size(), 2u);
  std::set<std::string> keys;
  for (const auto& f : ic) keys.insert(failure_key(f.verdict));
  EXPECT_EQ(keys.size(), 2u);
  // the imported keys are claimed: a local worker's save_failure of the same key is a duplicate
  for (const auto& f : ic) EXPECT_TRUE(fs::exists(c.out / "work" / "dedup" / failure_key(f.verdict)));
  // resume: a new Sync over the same OUT re-claims the imported keys after the campaign cleared work/dedup (the
  // first one has ended: a live campaign's name is not taken twice)
  sc.reset();
  fs::remove_all(c.out / "work" / "dedup");
  fs::create_directories(c.out / "work" / "dedup");
  Sync sc2(c.cfg);
  sc2.start();
  for (const auto& f : ic) EXPECT_TRUE(fs::exists(c.out / "work" / "dedup" / failure_key(f.verdict)));
  EXPECT_EQ(sc2.imported_failures().size(), 2u);
}

TEST(Sync, PartiallyWrittenFilesAreNeverImported) {
  const fs::path root = fresh("atomic"), dir = root / "sync";
  FakeCampaign a(root, "a", dir);
  Sync sa(a.cfg);
  sa.start();
  CorpusFile f;
  f.the_case = some_case(5);
  const std::string text = to_corpus_text(f);
  // a writer in the middle of its write: the temporary name (what publish_file uses) ...
  fs::create_directories(dir / "w" / "corpus");
  fs::create_directories(dir / "w" / "failures");
  std::ofstream(dir / "w" / "corpus" / ".case-x.case.host.1.0") << text.substr(0, text.size() / 2);
  // ... and a foreign writer that writes in place (not atomic): truncated under its final name
  std::ofstream(dir / "w" / "corpus" / "case-trunc.case") << text.substr(0, text.size() / 2);
  const CorpusFile ff = failure_file(6, "k0", FailureClass::kMask, "mask:compare");
  const std::string ft = to_corpus_text(ff);
  std::ofstream(dir / "w" / "failures" / "mask-trunc.case") << ft.substr(0, ft.size() - 20);
  sa.round();
  EXPECT_TRUE(names(a.cfg.corpus).empty());
  EXPECT_TRUE(names(a.out / "work" / "sync-in").empty());
  EXPECT_TRUE(sa.imported_failures().empty());
  EXPECT_FALSE(fs::exists(a.out / "work" / "dedup" / failure_key(*ff.verdict)));

  // publish_file under a concurrent reader: every visible file is whole, no temporary is left behind
  std::string big(1 << 20, 'x');
  std::atomic<bool> done{false};
  std::atomic<int> partial{0}, seen{0};
  const fs::path pub = root / "pub";
  fs::create_directories(pub);
  std::thread reader([&] {
    while (!done) {
      for (const auto& e : fs::directory_iterator(pub)) {
        if (e.path().filename().string()[0] == '.') continue;
        std::ifstream in(e.path(), std::ios::binary);
        std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        ++seen;
        if (s.size() != big.size() + 1) ++partial;
      }
    }
  });
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(publish_file(pub, "f" + std::to_string(i % 4), big + char('a' + i)));
  done = true;
  reader.join();
  EXPECT_GT(seen.load(), 0);
  EXPECT_EQ(partial.load(), 0);
  EXPECT_EQ(names(pub), (std::set<std::string>{"f0", "f1", "f2", "f3"}));
}

TEST(Sync, BadNamesAndDirectoriesAreRefused) {
  EXPECT_EQ(campaign_name_problem("task-0"), "");
  EXPECT_NE(campaign_name_problem(".hidden"), "");
  EXPECT_NE(campaign_name_problem("a/b"), "");
  EXPECT_NE(campaign_name_problem(""), "");
  const fs::path root = fresh("baddir");
  std::ofstream(root / "file") << "x";
  EXPECT_NE(sync_dir_problem((root / "file").string()), "");
  EXPECT_EQ(sync_dir_problem((root / "new" / "dir").string()), "");
  EXPECT_TRUE(fs::is_directory(root / "new" / "dir"));
}

TEST(Merge, EachDistinctFailureOnceWithWhoFoundItFirst) {
  const fs::path root = fresh("merge");
  FakeCampaign a(root, "a", root / "sync"), b(root, "b", root / "sync");
  const fs::path fa = a.add_failure(failure_file(20, "k0", FailureClass::kMask, "mask:compare"));
  const fs::path fb = b.add_failure(failure_file(21, "k0", FailureClass::kMask, "mask:compare"));  // same key
  const fs::path fb2 = b.add_failure(failure_file(22, "k1", FailureClass::kRescale, "rescale:compare"));
  // b found the shared one first
  auto set_mtime = [](const fs::path& p, time_t t) {
    struct timespec ts[2] = {{t, 0}, {t, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), ts, 0), 0);
  };
  set_mtime(fa, 2000000000);
  set_mtime(fb, 1999999000);
  set_mtime(fb2, 2000000500);
  auto report = [](const fs::path& out, const std::string& name, int64_t cases) {
    Json j;
    j["schema"] = "attnfuzz-report";
    j["schema_version"] = 1;
    j["campaign"] = {{"name", name}, {"cases", cases}, {"cases_per_s", cases / 10.0}, {"wall_s", 10.0},
                     {"semantic_features", 7}, {"started_unix", 1999998000}, {"started_at", "x"},
                     {"replay_flags", "--order shuffle --order-seed 1"}, {"features_hex", "0f00"}};
    std::ofstream(out / "report.json") << j.dump();
  };
  report(a.out, "a", 100);
  report(b.out, "b", 300);
  const fs::path out = root / "merged";
  EXPECT_EQ(merge_campaigns({a.out.string(), b.out.string()}, out.string(), "attn-fuzz --merge", true), 1);
  std::ifstream in(out / "report.json");
  const Json j = Json::parse(in);
  const Json& fl = j.at("merge").at("failures");
  ASSERT_EQ(fl.size(), 2u);
  EXPECT_EQ(fl[0].at("kernel"), "k0");
  EXPECT_EQ(fl[0].at("first_found_by"), "b");
  EXPECT_EQ(fl[0].at("also_found_by"), Json::array({"a"}));
  EXPECT_EQ(fl[0].at("found_after_s"), 1000.0);
  EXPECT_EQ(fl[1].at("kernel"), "k1");
  EXPECT_EQ(j.at("results").size(), 2u);
  EXPECT_EQ(j.at("merge").at("cases"), 400);
  EXPECT_EQ(j.at("merge").at("semantic_features_union"), 4);
  const Json& cs = j.at("merge").at("campaigns");
  ASSERT_EQ(cs.size(), 2u);
  EXPECT_EQ(cs[0].at("first_found"), 0);
  EXPECT_EQ(cs[1].at("first_found"), 2);
  EXPECT_TRUE(fs::exists(out / "junit.xml"));
  EXPECT_TRUE(fs::exists(out / "failures" / fb.filename()));
  EXPECT_TRUE(fl[0].at("minimized").is_null());
  std::ifstream md(out / "summary.md");
  const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("--replay"), std::string::npos);
  EXPECT_NE(text.find("--order shuffle --order-seed 1"), std::string::npos);
  // a directory that is no campaign: exit 2
  fs::create_directories(root / "empty");
  EXPECT_EQ(merge_campaigns({(root / "empty").string()}, out.string(), "x", true), 2);
}

// Issue 30 item 1: a campaign's minimal case (OUT/minimized/<name>) is what the merge shows and replays; the case as
// found stays in OUT/failures (on an H200 the merged summary showed the as-found cases, specials and all).
TEST(Merge, AMinimizedFailureIsShownAndReplayedAsItsMinimalCase) {
  const fs::path root = fresh("merge-minimized");
  FakeCampaign a(root, "a", root / "sync");
  const fs::path found = a.add_failure(failure_file(30, "k1", FailureClass::kRescale, "rescale:compare"));
  CorpusFile minimal = failure_file(31, "k1", FailureClass::kRescale, "rescale:compare");
  fs::create_directories(a.out / "minimized");
  {
    std::ofstream f(a.out / "minimized" / found.filename());
    f << to_corpus_text(minimal);
  }
  const fs::path out = root / "merged";
  ASSERT_EQ(merge_campaigns({a.out.string()}, out.string(), "attn-fuzz --merge", true), 1);
  const Json j = Json::parse(std::ifstream(out / "report.json"));
  const Json& fl = j.at("merge").at("failures");
  ASSERT_EQ(fl.size(), 1u);
  EXPECT_EQ(fl[0].at("file"), (out / "failures" / found.filename()).string());
  EXPECT_EQ(fl[0].at("minimized"), (out / "minimized" / found.filename()).string());
  EXPECT_NE(fl[0].at("replay").get<std::string>().find("minimized"), std::string::npos) << fl[0].dump();
  EXPECT_TRUE(fs::exists(out / "failures" / found.filename()));
  EXPECT_TRUE(fs::exists(out / "minimized" / found.filename()));
  ASSERT_EQ(j.at("results").size(), 1u);
  EXPECT_NE(j.at("cases").at(0).at("text").get<std::string>().find(describe(minimal.the_case)), std::string::npos)
      << j.at("cases").at(0).dump();
  std::ifstream md(out / "summary.md");
  const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("1 minimized"), std::string::npos) << text;
}

// Issue 27 item 7: inputs a merge must refuse, each with one line and exit 2, writing nothing: --out is one of the
// campaigns (its report was overwritten), a campaign given twice (counted twice), a campaign whose failures/ is a
// file (merged without a word), a report of another schema version (merged as version 1).
TEST(Merge, BadInputsAreRefusedWithOneLineAndExitTwo) {
  const fs::path root = fresh("merge-bad");
  FakeCampaign a(root, "a", root / "sync"), b(root, "b", root / "sync");
  a.add_failure(failure_file(30, "k0", FailureClass::kMask, "mask:compare"));
  const std::string report_a = R"({"schema": "attnfuzz-report", "schema_version": 1, "campaign": {"name": "a"}})";
  std::ofstream(a.out / "report.json") << report_a;
  auto refused = [](const std::vector<std::string>& dirs, const fs::path& out, const std::string& why) {
    ::testing::internal::CaptureStderr();
    const int rc = merge_campaigns(dirs, out.string(), "attn-fuzz --merge", true);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(rc, 2) << err;
    EXPECT_NE(err.find(why), std::string::npos) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  };
  auto text = [](const fs::path& p) {
    std::ifstream f(p);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  refused({a.out.string(), b.out.string()}, a.out, "is one of the campaigns merged");
  refused({a.out.string(), b.out.string()}, a.out / "." , "is one of the campaigns merged");
  EXPECT_EQ(text(a.out / "report.json"), report_a);  // untouched
  refused({a.out.string(), (root / "." / "a").string()}, root / "m1", "is given twice");
  EXPECT_FALSE(fs::exists(root / "m1"));
  FakeCampaign c(root, "c", root / "sync");
  fs::remove_all(c.out / "failures");
  std::ofstream(c.out / "failures") << "not a directory";
  refused({a.out.string(), c.out.string()}, root / "m2", "failures is not a directory");
  FakeCampaign d(root, "d", root / "sync");
  std::ofstream(d.out / "report.json") << R"({"schema": "attnfuzz-report", "schema_version": 99, "campaign": {}})";
  refused({a.out.string(), d.out.string()}, root / "m3", "version 99");
  EXPECT_FALSE(fs::exists(root / "m2") || fs::exists(root / "m3"));
  EXPECT_EQ(merge_campaigns({a.out.string(), b.out.string()}, (root / "m4").string(), "x", true), 1);  // still merges
}

// Issue 26 item 4: a resumed campaign's failures are timed from its first start (its report's campaign time),
// never before the campaign's own start; a failure imported from a campaign not merged gets an "after" too (from
// the merge's first start, marked), never "?"; summary.md has one H1.
// And counted whole: every run's cases and seconds (a ten-minute campaign run as two halves was merged as its second).
TEST(Merge, AResumedCampaignIsTimedFromItsFirstStartAndNoCellIsUnknown) {
  const fs::path root = fresh("merge-resumed");
  FakeCampaign a(root, "a", root / "sync");
  const fs::path own = a.add_failure(failure_file(30, "k0", FailureClass::kMask, "mask:compare"));
  fs::create_directories(a.out / "imported" / "elsewhere");
  const fs::path imp = save_to_corpus_dir(a.out / "imported" / "elsewhere",
                                          failure_file(31, "k1", FailureClass::kRescale, "rescale:compare"));
  auto set_mtime = [](const fs::path& p, time_t t) {
    struct timespec ts[2] = {{t, 0}, {t, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), ts, 0), 0);
  };
  set_mtime(own, 2000000100);  // found in the first run, which started at 2000000000
  set_mtime(imp, 2000000300);
  Json j;
  j["schema"] = "attnfuzz-report";
  j["schema_version"] = 2;
  j["campaign"] = {{"name", "a"}, {"cases", 10}, {"wall_s", 5.0}, {"cases_per_s", 2.0},
                   {"started_unix", 2000001000},  // the resume
                   {"first_started_unix", 2000000000}, {"started_at", "x"}, {"features_hex", "01"},
                   {"runs", Json::array({{{"started_unix", 2000000000}, {"wall_s", 15.0}, {"cases", 30}},
                                         {{"started_unix", 2000001000}, {"wall_s", 5.0}, {"cases", 10}}})},
                   {"failures", Json::array({{{"file", own.filename().string()}, {"found_after_s", 100.0}}})}};
  std::ofstream(a.out / "report.json") << j.dump();
  const fs::path out = root / "merged";
  EXPECT_EQ(merge_campaigns({a.out.string()}, out.string(), "attn-fuzz --merge", true), 1);
  std::ifstream in(out / "report.json");
  const Json m = Json::parse(in).at("merge");
  EXPECT_EQ(m.at("cases"), 40);
  EXPECT_DOUBLE_EQ(m.at("cases_per_s").get<double>(), 2.0);  // 40 cases in 20 s
  ASSERT_EQ(m.at("failures").size(), 2u);
  for (const Json& f : m.at("failures")) {
    EXPECT_GE(f.at("found_after_s").get<double>(), 0) << f.dump();
    if (f.at("kernel") == "k0") {
      EXPECT_EQ(f.at("found_after_s"), 100.0);
      EXPECT_EQ(f.at("found_after_s_from"), "finder-start");
    } else {
      EXPECT_EQ(f.at("found_after_s"), 300.0);  // since the merge's first start: its finder is not merged
      EXPECT_EQ(f.at("found_after_s_from"), "merge-start");
    }
  }
  std::ifstream mdf(out / "summary.md");
  std::stringstream md;
  md << mdf.rdbuf();
  EXPECT_EQ(md.str().find("| ? |"), std::string::npos) << md.str();
  EXPECT_EQ(md.str().find("\n# "), std::string::npos) << "a second H1\n" << md.str();
  EXPECT_NE(md.str().find("| 100 s |"), std::string::npos) << md.str();
}

// Issue 27 item 8: a second campaign with the same --name on one sync directory is refused while the first runs
// (the two used to mix their files and never import from each other); the name is free again once it ends.
TEST(Sync, SameNameTwiceAtOnceIsRefused) {
  const fs::path root = fresh("same-name");
  FakeCampaign a(root, "x", root / "sync"), a2(root, "x2", root / "sync");
  a2.cfg.name = "x";
  {
    Sync first(a.cfg);
    try {
      Sync second(a2.cfg);
      ADD_FAILURE() << "a second campaign named x was accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("'x' is in use by another campaign"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("pid " + std::to_string(getpid())), std::string::npos) << e.what();
    }
#ifdef ATTN_FUZZ
    const fs::path log = root / "second.log";
    const int st = std::system((std::string(ATTN_FUZZ) + " --sync " + (root / "sync").string() +
                                " --name x --kernel online-row --no-seeds --workers 1 --max-time 5 --out " +
                                (root / "second").string() + " > " + log.string() + " 2>&1")
                                   .c_str());
    std::ifstream f(log);
    const std::string out((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << out;
    EXPECT_NE(out.find("in use by another campaign"), std::string::npos) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
#endif
  }
  Sync again(a2.cfg);  // the first one ended: the name is free
}

#ifdef ATTN_FUZZ
int sh(const std::string& cmd) {
  std::printf("$ %s\n", cmd.c_str());
  std::fflush(stdout);
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

// Two real campaigns (one worker each) syncing through a temporary directory, then the merge.
TEST(Sync, TwoCampaignsSyncThroughATempDirAndMerge) {
  const fs::path root = fresh("two"), dir = root / "sync";
  const std::string common = std::string(" --plugin ") + PLANTED_PLUGIN +
                             " --kernel 'planted-*' --no-seeds --workers 1 --max-time 10 --sync-interval 2 --progress 5"
                             " --timeout 5 --sync " + dir.string();
  const std::string a = std::string(ATTN_FUZZ) + common + " --name a --out " + (root / "a").string() + " > " +
                        (root / "a.log").string() + " 2>&1",
                    b = std::string(ATTN_FUZZ) + common + " --name b --out " + (root / "b").string() + " > " +
                        (root / "b.log").string() + " 2>&1";
  EXPECT_EQ(sh("(" + a + ") & (" + b + "); rb=$?; wait $!; ra=$?; cat " + (root / "a.log").string() + " " +
               (root / "b.log").string() + "; [ $ra -eq 1 ] && [ $rb -eq 1 ]"),
            0);
  std::set<std::string> all_keys;
  for (const char* n : {"a", "b"}) {
    std::ifstream in(root / n / "report.json");
    const Json c = Json::parse(in).at("campaign");
    EXPECT_EQ(c.at("name"), n);
    const Json& s = c.at("sync");
    EXPECT_GT(s.at("published_corpus").get<int64_t>(), 0) << n;
    EXPECT_GT(s.at("imported_corpus").value(n == std::string("a") ? "b" : "a", int64_t{0}), 0) << n;
    // no (kernel, class, signature) is both found here and imported
    std::set<std::string> own;
    for (const auto& e : fs::directory_iterator(root / n / "failures"))
      if (e.path().extension() == ".case") own.insert(failure_key(*read_corpus_file(e.path()).verdict));
    for (const Json& f : s.at("imported_failures")) {
      const std::string key =
          failure_key(*read_corpus_file(f.at("file").get<std::string>()).verdict);
      EXPECT_FALSE(own.count(key)) << n << " imported a failure it also saved: " << f.dump();
      own.insert(key);
    }
    all_keys.insert(own.begin(), own.end());
  }
  EXPECT_EQ(sh(std::string(ATTN_FUZZ) + " --merge " + (root / "a").string() + " " + (root / "b").string() +
               " --out " + (root / "m").string()),
            1);
  std::ifstream in(root / "m" / "report.json");
  const Json m = Json::parse(in).at("merge");
  std::set<std::string> merged;
  for (const Json& f : m.at("failures")) {
    RecordedVerdict v;
    v.kernel = f.at("kernel");
    ASSERT_TRUE(parse_failure_class(f.at("class"), v.failure));
    v.signature = f.at("signature");
    EXPECT_TRUE(merged.insert(failure_key(v)).second) << "listed twice: " << f.dump();
  }
  EXPECT_EQ(merged, all_keys);
  // Issue 30 item 3: the merged failures grouped into findings; every failure in exactly one.
  size_t members = 0;
  for (const Json& g : m.at("findings")) {
    EXPECT_FALSE(g.at("kernels").empty()) << g.dump();
    members += g.at("failures").size();
  }
  EXPECT_EQ(members, m.at("failures").size());
  // bad --sync: one line, exit 2
  EXPECT_EQ(sh(std::string(ATTN_FUZZ) + " --sync " + (root / "a.log").string() + " --max-time 1 2>&1 | grep -c . | grep -qx 1 && " +
               ATTN_FUZZ + " --sync " + (root / "a.log").string() + " --max-time 1; test $? -eq 2"),
            0);
}
#endif

}  // namespace
}  // namespace attnfuzz::fuzz
