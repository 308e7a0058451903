// corpus_test.cpp - corpus files: bit-exact round trips, content-hash names, every corrupt-file path.
#include "attnfuzz/corpus.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

namespace attnfuzz {
namespace {

namespace fs = std::filesystem;
using K = CorpusError::Kind;

CorpusFile sample(bool with_verdict = true) {
  CorpusFile f;
  f.tool.command = "attn-check --kernel flash-bk32 --sq 7 --sk 13 --d 59 --mask causal-tl --seed 42";
  Case& c = f.the_case;
  c.problem = make_problem(2, 4, 2, 7, 13, 59, 33);
  EXPECT_EQ(parse_mask("window:3,inf-tl", c.problem), "");
  c.problem.scale = std::bit_cast<float>(0x3e0550f9u);  // not a "nice" decimal
  // Non-contiguous k: padded head rows.
  c.problem.k_stride[2] = 64;
  c.problem.k_stride[1] = 2 * 64;
  c.problem.k_stride[0] = 13 * 128;
  c.values.dist = {Distribution::kExtreme, 88.5};
  SpecialValue a, b;
  EXPECT_EQ(parse_special("nan@k:masked*3", a), "");
  EXPECT_EQ(parse_special("-inf@v:at=1,1,12,32", b), "");
  c.values.specials = {a, b};
  c.seed = 0xfedcba9876543210ull;
  c.label = "rect-7x13";
  if (with_verdict) {
    RecordedVerdict v;
    v.kernel = "flash-bk32";
    v.backend = "cpu";
    v.device = "cpu emulator (fibers)";
    v.verdict = Verdict::kFail;
    v.failure = FailureClass::kNonFinite;
    v.signature = "nan-rows:0-6";
    v.reason = "NaN in O where the oracle is finite";
    v.max_ratio = INFINITY;
    f.verdict = v;
  }
  return f;
}

void expect_same_problem(const Problem& a, const Problem& b) {
  // af_problem is plain data with no padding holes that matter: compare field by field for clear messages.
  EXPECT_EQ(describe(a), describe(b));
  EXPECT_EQ(std::bit_cast<uint32_t>(a.scale), std::bit_cast<uint32_t>(b.scale));
  EXPECT_EQ(a.window_left, b.window_left);
  EXPECT_EQ(a.window_right, b.window_right);
  EXPECT_EQ(a.mask_kind, b.mask_kind);
  EXPECT_EQ(a.mask_align, b.mask_align);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.q_stride[i], b.q_stride[i]);
    EXPECT_EQ(a.k_stride[i], b.k_stride[i]);
    EXPECT_EQ(a.v_stride[i], b.v_stride[i]);
    EXPECT_EQ(a.o_stride[i], b.o_stride[i]);
    EXPECT_EQ(a.lse_stride[i], b.lse_stride[i]);
  }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

K kind_of(const std::string& text) {
  try {
    parse_corpus(text, "t.case");
  } catch (const CorpusError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos)
        << "message must be one line: " << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("t.case: ", 0), 0u) << e.what();
    return e.kind();
  }
  ADD_FAILURE() << "parsed without error:\n" << text.substr(0, 200);
  return K::kIo;
}

TEST(Corpus, RoundTripIsExact) {
  const CorpusFile f = sample();
  const std::string text = to_corpus_text(f);
  EXPECT_EQ(text.rfind("ATTNFUZZ-CASE 1\n# attn-fuzz ", 0), 0u) << text.substr(0, 80);
  const CorpusFile g = parse_corpus(text);
  expect_same_problem(f.the_case.problem, g.the_case.problem);
  EXPECT_EQ(describe(f.the_case), describe(g.the_case));
  EXPECT_EQ(g.the_case.seed, f.the_case.seed);
  EXPECT_EQ(g.the_case.label, f.the_case.label);
  EXPECT_EQ(g.the_case.values.dist.param, 88.5);
  EXPECT_EQ(g.tool.version, ATTNFUZZ_VERSION);
  EXPECT_EQ(g.tool.command, f.tool.command);
  ASSERT_TRUE(g.verdict);
  EXPECT_EQ(g.verdict->kernel, "flash-bk32");
  EXPECT_EQ(g.verdict->failure, FailureClass::kNonFinite);
  EXPECT_EQ(g.verdict->verdict, Verdict::kFail);
  EXPECT_EQ(g.verdict->signature, "nan-rows:0-6");
  EXPECT_TRUE(std::isinf(g.verdict->max_ratio));
  // Same values from both.
  const Tensors a = generate(f.the_case), b = generate(g.the_case);
  EXPECT_TRUE(same_bits(a.q, b.q) && same_bits(a.k, b.k) && same_bits(a.v, b.v));
  // Printing again gives the same text.
  EXPECT_EQ(to_corpus_text(g), text);
}

TEST(Corpus, BackwardPassAndExplicitDoutRoundTrip) {
  CorpusFile f = sample();
  const std::string fwd_text = to_corpus_text(f);
  EXPECT_EQ(fwd_text.find("\"pass\""), std::string::npos);  // forward files are written as before
  EXPECT_EQ(parse_corpus(fwd_text).the_case.pass, Pass::kFwd);  // and files without the field are forward
  const std::string fwd_name = corpus_file_name(f);
  f.the_case.pass = Pass::kFwdBwd;
  const CorpusFile g = parse_corpus(to_corpus_text(f));
  EXPECT_EQ(g.the_case.pass, Pass::kFwdBwd);
  EXPECT_NE(corpus_file_name(f), fwd_name);  // the pass is part of the case's identity
  // Explicit values with dO keep dO's bits (NaN payload included).
  Case c = f.the_case;
  c.pass = Pass::kBwd;
  const Tensors t = generate(c);
  ExplicitValues e{t.q, t.k, t.v, t.dout};
  e.dout[0] = std::bit_cast<float>(0x7fc01234u);
  c.explicit_values = e;
  f.the_case = c;
  const CorpusFile h = parse_corpus(to_corpus_text(f));
  ASSERT_TRUE(h.the_case.explicit_values);
  EXPECT_TRUE(same_bits(h.the_case.explicit_values->dout, e.dout));
  EXPECT_EQ(h.the_case.pass, Pass::kBwd);
  // A bad pass is a corrupt file.
  std::string bad = to_corpus_text(f);
  bad.replace(bad.find("\"bwd\""), 5, "\"bxd\"");
  EXPECT_EQ(kind_of(bad), CorpusError::Kind::kCorrupt);
}

TEST(Corpus, ExplicitValuesAreBitExact) {
  CorpusFile f = sample(false);
  const Tensors t = generate(f.the_case);
  ExplicitValues e{t.q, t.k, t.v};
  const uint32_t odd[] = {0x7fc00000u, 0xffc12345u, 0x7f800001u /* signalling NaN */,
                          0x7fbfffffu, 0x80000000u, 0x00000001u,
                          0x807fffffu, 0x7f800000u, 0xff800000u,
                          0x7f7fffffu};
  for (size_t i = 0; i < std::size(odd); ++i) e.q[i] = std::bit_cast<float>(odd[i]);
  e.v.back() = std::bit_cast<float>(0x7fe5a5a5u);
  f.the_case.explicit_values = e;
  const CorpusFile g = parse_corpus(to_corpus_text(f));
  ASSERT_TRUE(g.the_case.explicit_values);
  EXPECT_TRUE(same_bits(g.the_case.explicit_values->q, e.q));
  EXPECT_TRUE(same_bits(g.the_case.explicit_values->k, e.k));
  EXPECT_TRUE(same_bits(g.the_case.explicit_values->v, e.v));
  const Tensors back = generate(g.the_case);
  EXPECT_TRUE(same_bits(back.q, e.q));
  for (size_t i = 0; i < std::size(odd); ++i) EXPECT_EQ(std::bit_cast<uint32_t>(back.q[i]), odd[i]) << i;
}

TEST(Corpus, HexCodec) {
  const std::vector<float> v = {1.0f, -2.0f, std::bit_cast<float>(0xffc12345u)};
  EXPECT_EQ(floats_to_hex(v), "3f800000c0000000ffc12345");
  EXPECT_TRUE(same_bits(hex_to_floats("3F800000c0000000FFC12345", "x"), v));
  EXPECT_THROW(hex_to_floats("3f80000", "x"), CorpusError);
  EXPECT_THROW(hex_to_floats("3f80000g", "x"), CorpusError);
}

TEST(Corpus, FileNamesAreClassAndContentHash) {
  const CorpusFile f = sample();
  const std::string name = corpus_file_name(f);
  EXPECT_TRUE(std::regex_match(name, std::regex("non-finite-[0-9a-f]{16}\\.case"))) << name;
  CorpusFile relabeled = f;
  relabeled.the_case.label = "another name";
  relabeled.tool.command = "other";
  EXPECT_EQ(corpus_file_name(relabeled), name);  // identity is the content, not the label
  CorpusFile reseeded = f;
  reseeded.the_case.seed ^= 1;
  EXPECT_NE(corpus_file_name(reseeded), name);
  CorpusFile other_kernel = f;
  other_kernel.verdict->kernel = "online-row";
  EXPECT_NE(corpus_file_name(other_kernel), name);
  CorpusFile pass = f;
  pass.verdict->verdict = Verdict::kPass;
  pass.verdict->failure = FailureClass::kNone;
  EXPECT_EQ(corpus_file_name(pass).rfind(std::string(verdict_name(Verdict::kPass)) + "-", 0), 0u);
  EXPECT_EQ(corpus_file_name(sample(false)).rfind("case-", 0), 0u);
}

TEST(Corpus, WriteReadAndSaveToDir) {
  const fs::path dir = fs::temp_directory_path() / ("attnfuzz-corpus-test-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const CorpusFile f = sample();
  const fs::path p = save_to_corpus_dir(dir / "sub", f);
  EXPECT_EQ(p.filename().string(), corpus_file_name(f));
  EXPECT_TRUE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p.string() + ".tmp"));
  const CorpusFile g = read_corpus_file(p);
  EXPECT_EQ(describe(g.the_case), describe(f.the_case));
  EXPECT_EQ(save_to_corpus_dir(dir / "sub", f), p);  // idempotent
  // I/O errors.
  try {
    read_corpus_file(dir / "missing.case");
    ADD_FAILURE();
  } catch (const CorpusError& e) {
    EXPECT_EQ(e.kind(), K::kIo);
  }
  try {
    read_corpus_file(dir);
    ADD_FAILURE();
  } catch (const CorpusError& e) {
    EXPECT_EQ(e.kind(), K::kIo);
  }
  try {
    write_corpus_file(dir / "no" / "such" / "dir" / "x.case", f);
    ADD_FAILURE();
  } catch (const CorpusError& e) {
    EXPECT_EQ(e.kind(), K::kIo);
  }
  fs::remove_all(dir);
}

TEST(CorpusErrors, Truncated) {
  const std::string text = to_corpus_text(sample());
  EXPECT_EQ(kind_of(""), K::kTruncated);
  EXPECT_EQ(kind_of("ATTNFUZ"), K::kTruncated);
  EXPECT_EQ(kind_of("ATTNFUZZ-CASE"), K::kTruncated);
  EXPECT_EQ(kind_of("ATTNFUZZ-CASE 1"), K::kTruncated);
  EXPECT_EQ(kind_of("ATTNFUZZ-CASE 1\n"), K::kTruncated);
  EXPECT_EQ(kind_of("ATTNFUZZ-CASE 1\n# comment only\n"), K::kTruncated);
  // Every cut inside the JSON body is reported as truncated (never as success, never a crash).
  const size_t body = text.find("\n{") + 1;
  const size_t end = text.rfind('}');
  for (size_t n = body; n <= end; n += 1)
    EXPECT_EQ(kind_of(text.substr(0, n)), K::kTruncated) << "cut at " << n;
}

TEST(CorpusErrors, ForeignAndFutureVersion) {
  EXPECT_EQ(kind_of("{\"format\": 1}\n"), K::kForeign);
  EXPECT_EQ(kind_of(std::string("PK\x03\x04\x14\x00", 6)), K::kForeign);
  EXPECT_EQ(kind_of("ATTNFUZZ-CORPUS 1\n{}\n"), K::kForeign);
  std::string text = to_corpus_text(sample());
  std::string future = text;
  future.replace(0, 15, "ATTNFUZZ-CASE 2");
  EXPECT_EQ(kind_of(future), K::kFutureVersion);
  EXPECT_EQ(kind_of("ATTNFUZZ-CASE 9999\n"), K::kFutureVersion);
  try {
    parse_corpus(future, "f.case");
  } catch (const CorpusError& e) {
    EXPECT_NE(std::string(e.what()).find("newer"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kind_of("ATTNFUZZ-CASE 0\n{}\n"), K::kCorrupt);
  EXPECT_EQ(kind_of("ATTNFUZZ-CASE x\n{}\n"), K::kCorrupt);
  EXPECT_EQ(kind_of("ATTNFUZZ-CASE1\n{}\n"), K::kCorrupt);
}

// Replaces the first occurrence of from with to (the test fails if from is absent).
// Only the JSON body is edited (the '#' comment lines repeat some of the same text).
std::string edit(std::string text, const std::string& from, const std::string& to) {
  const size_t pos = text.find(from, text.find("\n{"));
  EXPECT_NE(pos, std::string::npos) << from;
  if (pos != std::string::npos) text.replace(pos, from.size(), to);
  return text;
}

TEST(CorpusErrors, Corrupt) {
  const std::string text = to_corpus_text(sample());
  const std::pair<std::string, std::string> edits[] = {
      {"\"seq_q\": 7", "\"seq_q\": \"seven\""},        // mistyped
      {"\"seq_q\": 7,", ""},                           // missing required field
      {"\"seq_q\": 7", "\"seq_q\": 7.5"},              // not an integer
      {"\"heads_kv\": 2", "\"heads_kv\": 3"},          // invalid problem (Hq % Hkv)
      {"\"seq_k\": 13", "\"seq_k\": -1"},              // invalid problem
      {"window:3,inf-tl", "sideways"},                 // bad mask
      {"\"dtype\": \"f32\"", "\"dtype\": \"f8\""},     // unknown dtype
      {"extreme:88.5", "extreme:-1"},                  // bad distribution
      {"nan@k:masked*3", "nan@w:masked"},              // bad special
      {"-inf@v:at=1,1,12,32", "-inf@v:at=1,1,13,32"},  // special outside the tensor
      {"\"seed\": \"0xfedcba9876543210\"", "\"seed\": \"0xZZ\""},
      {"\"seed\": \"0xfedcba9876543210\"", "\"seed\": -5"},
      {"\"seed\": \"0xfedcba9876543210\"", "\"seeed\": \"0xfedcba9876543210\""},  // seed is required
      {"\"version\": \"" ATTNFUZZ_VERSION "\"", "\"version\": \"\""},             // tool version is required
      {"\"format\": 1", "\"format\": 2"},                                         // disagrees with the header
      {"\"class\": \"non-finite\"", "\"class\": \"gremlins\""},
      {"\"verdict\": \"fail\"", "\"verdict\": \"meh\""},
      {"\"q\": [", "\"q\": {"},                                 // broken JSON syntax (not at the end)
      {"\"k\": [1664, 128, 64]", "\"k\": [1664, 128, 64, 1]"},  // strides array of 4
      {"\"scale_bits\": \"0x3e0550f9\"", "\"scale_bits\": \"0x7fc00000\""},  // NaN scale
  };
  for (const auto& [from, to] : edits)
    EXPECT_EQ(kind_of(edit(text, from, to)), K::kCorrupt) << from << " -> " << to;
  // Trailing garbage after the JSON object.
  EXPECT_EQ(kind_of(text + "}\n"), K::kCorrupt);
  // A JSON body that is not an object.
  EXPECT_EQ(kind_of("ATTNFUZZ-CASE 1\n[1, 2, 3]\n"), K::kCorrupt);
  // Explicit values of the wrong length or with a bad digit.
  CorpusFile f = sample(false);
  const Tensors t = generate(f.the_case);
  f.the_case.explicit_values = ExplicitValues{t.q, t.k, t.v};
  const std::string with = to_corpus_text(f);
  EXPECT_EQ(kind_of(edit(with, "\"q\": \"", "\"q\": \"00000000")), K::kCorrupt);
  EXPECT_EQ(kind_of(edit(with, "\"q\": \"", "\"q\": \"0")), K::kCorrupt);
  EXPECT_EQ(kind_of(edit(with, "\"q\": \"", "\"q\": \"zzzzzzzz")), K::kCorrupt);
}

TEST(CorpusErrors, AcceptsHandWrittenMinimalFiles) {
  // Seed corpus files may be written by hand: strides, scale, dtype and values default.
  const char* text = R"(ATTNFUZZ-CASE 1
# a hand-written case
{"format": 1, "tool": {"name": "hand", "version": "0.1.0"},
 "case": {"problem": {"batch": 1, "heads_q": 1, "heads_kv": 1, "seq_q": 7, "seq_k": 13, "head_dim": 59,
                      "head_dim_v": 59, "mask": "causal"}, "seed": 42}}
)";
  const CorpusFile f = parse_corpus(text);
  EXPECT_EQ(f.the_case.seed, 42u);
  EXPECT_EQ(f.the_case.problem.scale, default_scale(59));
  EXPECT_EQ(mask_to_string(f.the_case.problem), "causal-br");
  EXPECT_EQ(f.the_case.problem.q_stride[2], 59);
  EXPECT_FALSE(f.verdict);
}

TEST(CorpusErrors, RandomMutationsNeverEscapeAsOtherExceptions) {
  const std::string text = to_corpus_text(sample());
  Rng rng(2024);
  int parsed = 0, rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string m = text;
    const int edits = 1 + static_cast<int>(rng.below(4));
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng.below(m.size());
      switch (rng.below(3)) {
        case 0:
          m[pos] = static_cast<char>(rng.below(256));
          break;
        case 1:
          m.erase(pos, 1 + rng.below(8));
          break;
        default:
          m.insert(pos, 1, "{}[]\",:0123456789abcxyz-e.\n\\"[rng.below(28)]);
          break;
      }
    }
    try {
      const CorpusFile f = parse_corpus(m, "m.case");
      EXPECT_EQ(validate(f.the_case), "");
      ++parsed;
    } catch (const CorpusError&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  RecordProperty("parsed", parsed);
}


// Score variants (issue 28): the case file's variants block round-trips (generated and given values), describe names
// them, generation is deterministic and leaves q, k, v unchanged, and invalid variant values are refused.
TEST(CorpusVariants, RoundTripDescribeValidate) {
  Case c = make_case(make_problem(2, 12, 4, 9, 14, 16, 16), 77);
  ASSERT_EQ(set_variants(c, AF_VARIANT_SINK | AF_VARIANT_SOFTCAP | AF_VARIANT_ALIBI | AF_VARIANT_BIAS, 7.5f, "bi"), "");
  c.variants.sink_range = 3;
  const Case back = case_from_json(case_to_json(c));
  EXPECT_EQ(case_to_json(back).dump(), case_to_json(c).dump());
  EXPECT_EQ(back.problem.variants, c.problem.variants);
  EXPECT_EQ(back.problem.softcap, 7.5f);
  EXPECT_EQ(bias_broadcast(back.problem), "bi");
  EXPECT_EQ(back.variants, c.variants);
  const std::string d = describe(c);
  for (const char* w : {"variants=sink+softcap+alibi+bias", "softcap=7.5", "bias-bcast=bi", "sinks=uniform:3",
                        "slopes=default", "bias=uniform:1"})
    EXPECT_NE(d.find(w), std::string::npos) << d;
  const Tensors t = generate(c), t2 = generate(c);
  EXPECT_EQ(t.sinks, t2.sinks);
  EXPECT_EQ(t.bias, t2.bias);
  EXPECT_EQ(t.sinks.size(), 12u);
  EXPECT_EQ(t.alibi_slopes, alibi_default_slopes(12));
  EXPECT_EQ(static_cast<int64_t>(t.bias.size()), 12 * 14);  // broadcast over b and i: [Hq, Sk]
  Case plain = c;
  ASSERT_EQ(set_variants(plain, 0), "");
  EXPECT_EQ(generate(plain).q, t.q);  // the variants' own streams leave q, k, v alone
  EXPECT_EQ(generate(plain).k, t.k);
  // Given values round-trip too (a -inf sink = no sink for that head).
  Case g = c;
  g.variants.sinks.assign(12, 0.5f);
  g.variants.sinks[3] = -INFINITY;
  g.variants.bias.assign(static_cast<size_t>(bias_elements(g.problem)), -1.25f);
  g.variants.alibi_slopes.assign(12, 0.125f);
  EXPECT_EQ(validate(g), "");
  EXPECT_EQ(case_from_json(case_to_json(g)).variants, g.variants);
  // Refused: a NaN / +inf sink, a softcap <= 0, wrong counts, a variant on a sequence layout.
  Case bad = g;
  bad.variants.sinks[0] = NAN;
  EXPECT_NE(validate(bad), "");
  bad = g;
  bad.variants.sinks[0] = INFINITY;
  EXPECT_NE(validate(bad), "");
  bad = g;
  bad.problem.softcap = 0;
  EXPECT_NE(validate(bad), "");
  bad = g;
  bad.variants.alibi_slopes.pop_back();
  EXPECT_NE(validate(bad), "");
  bad = c;
  bad.problem.variants |= AF_VARIANT_KV_SHARED;  // checked (MLA, issue 28 item 5), but V must be a view of K
  bad.problem.v_stride[1] += 1;
  EXPECT_NE(validate(bad), "");
  bad = c;
  bad.problem.variants |= AF_VARIANT_DROPOUT;  // checked (issue 29), but p must be in [0, 1)
  bad.problem.dropout_p = 1;
  EXPECT_NE(validate(bad), "");
}

// MLA's shared K/V latent (issue 28 item 5): a dense and a paged kv-shared case round-trip through the case
// file (the paged one's V strides follow from its layout: K's), and generate the same values after the round
// trip.
TEST(CorpusVariants, KvSharedRoundTripsDenseAndPaged) {
  Case c = make_case(make_problem(2, 8, 1, 2, 23, 40, 32), 91);
  ASSERT_EQ(set_variants(c, AF_VARIANT_KV_SHARED), "");
  const Case back = case_from_json(case_to_json(c));
  EXPECT_TRUE(kv_shared(back.problem));
  EXPECT_EQ(case_to_json(back).dump(), case_to_json(c).dump());
  EXPECT_EQ(generate(back).v, generate(c).v);
  Case pg = make_case(make_problem(2, 4, 1, 1, 30, 24, 16), 92);
  pg.problem.kv_layout = AF_SEQ_PAGED;
  pg.problem.page_size = 16;
  pg.seqs.used = {30, 7};
  ASSERT_EQ(set_sequence_fields(pg), "");
  share_kv(pg.problem);
  ASSERT_EQ(validate(pg), "");
  const Case pback = case_from_json(case_to_json(pg));
  EXPECT_TRUE(kv_shared(pback.problem));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(pback.problem.v_stride[i], pback.problem.k_stride[i]);
  EXPECT_EQ(case_to_json(pback).dump(), case_to_json(pg).dump());
}

// Per-head fp8 descales (issue 28 item 6): drawn and given values and per-batch strides round-trip through
// the case file, describe names them, the stream (seed, 12) leaves q, k, v alone, and bad values or dtypes
// are refused.
TEST(CorpusVariants, HeadDescalesRoundTripDescribeValidate) {
  Case c = make_case(make_problem(3, 6, 2, 9, 14, 16, 16), 78);
  c.problem.dtype = AF_DTYPE_FP8_E4M3;
  ASSERT_EQ(set_variants(c, AF_VARIANT_HEAD_DESCALE), "");
  EXPECT_EQ(validate(c), "");
  EXPECT_EQ(c.problem.descale_stride[0], 0);
  EXPECT_EQ(c.problem.descale_stride[1], 1);
  const std::string d = describe(c);
  for (const char* w : {"fp8-e4m3", "variants=head-descale", "descale_h=drawn"})
    EXPECT_NE(d.find(w), std::string::npos) << d;
  const Tensors t = generate(c), t2 = generate(c);
  EXPECT_EQ(t.q_descale_h.size(), 6u);
  EXPECT_EQ(t.k_descale_h.size(), 2u);
  EXPECT_EQ(t.v_descale_h.size(), 2u);
  EXPECT_EQ(t.k_descale_h, t2.k_descale_h);
  for (float x : t.q_descale_h) EXPECT_EQ(validate_descale_value(x), "") << x;
  Case plain = c;
  ASSERT_EQ(set_variants(plain, 0), "");
  EXPECT_EQ(generate(plain).q, t.q);
  EXPECT_EQ(generate(plain).v, t.v);
  EXPECT_EQ(case_to_json(case_from_json(case_to_json(c))).dump(), case_to_json(c).dump());
  // Given values, per batch: rows of Hq for every array (k, v use the first Hkv of each row).
  Case g = c;
  set_descale_strides(g.problem, true);
  EXPECT_NE(describe(g).find("descale-per-batch"), std::string::npos);
  g.variants.q_descale_h.assign(static_cast<size_t>(descale_h_elements(g.problem, true)), 0.375f);
  g.variants.k_descale_h.assign(static_cast<size_t>(descale_h_elements(g.problem, false)), 8.0f);
  g.variants.v_descale_h.assign(static_cast<size_t>(descale_h_elements(g.problem, false)), 0x1.2p-9f);
  EXPECT_EQ(g.variants.q_descale_h.size(), 18u);
  EXPECT_EQ(g.variants.k_descale_h.size(), 14u);  // 2 * 6 + 2
  EXPECT_EQ(validate(g), "");
  EXPECT_NE(describe(g).find("descale_h=given"), std::string::npos);
  const Case back = case_from_json(case_to_json(g));
  EXPECT_EQ(back.variants, g.variants);
  EXPECT_EQ(back.problem.descale_stride[0], 6);
  EXPECT_EQ(generate(back).k_descale_h, g.variants.k_descale_h);
  // Refused: a descale that is not exact in fp32 scaling, 0, NaN, a wrong count, values without the variant,
  // f32.
  for (float x : {0.0f, -1.0f, NAN, INFINITY, 0x1.00001p0f, 0x1p-20f}) {
    Case bad = g;
    bad.variants.k_descale_h[1] = x;
    EXPECT_NE(validate(bad).find("per-head descale"), std::string::npos) << x << ": " << validate(bad);
  }
  Case bad = g;
  bad.variants.q_descale_h.pop_back();
  EXPECT_NE(validate(bad), "");
  bad = g;
  bad.problem.variants = 0;
  EXPECT_NE(validate(bad).find("no per-head descales"), std::string::npos) << validate(bad);
  bad = c;
  bad.problem.dtype = AF_DTYPE_F16;
  EXPECT_NE(validate(bad).find("fp8 only"), std::string::npos) << validate(bad);
}

}  // namespace
}  // namespace attnfuzz

// Custom masks (issue 28 item 4): generated and given masks round-trip through the case file, describe names them,
// the mask streams leave q, k, v alone, and a corrupt mask field is refused with one sentence.
namespace attnfuzz {
namespace {
TEST(CorpusMasks, RoundTripDescribeValidate) {
  Case c = make_case(make_problem(2, 3, 1, 9, 13, 16, 16), 5);
  ASSERT_EQ(set_mask_variants(c, AF_VARIANT_MASK_BITS | AF_VARIANT_BLOCK_SPARSE, "rows:0.6", "empty-some", "h", 4, 8),
            "");
  Case back = case_from_json(case_to_json(c));
  EXPECT_EQ(case_to_json(back).dump(), case_to_json(c).dump());
  EXPECT_EQ(back.variants, c.variants);
  EXPECT_EQ(mask_broadcast(back.problem), "h");
  const std::string d = describe(c);
  for (const char* w : {"variants=mask-bits+block-sparse", "blocks=4x8", "custom-mask=rows:0.6/bcast=h",
                        "blocks=4x8:empty-some/bcast=h"})
    EXPECT_NE(d.find(w), std::string::npos) << d;
  const Tensors t = generate(c);
  EXPECT_EQ(static_cast<int64_t>(t.custom_mask.size()), 2 * 9 * 2);  // [B, Sq, ceil(13 / 8)] (h broadcast)
  EXPECT_EQ(static_cast<int64_t>(t.block_mask.size()), 2 * 3 * 2);   // [B, ceil(9 / 4), ceil(13 / 8)]
  Case plain = c;
  ASSERT_EQ(set_mask_variants(plain, 0), "");
  EXPECT_EQ(generate(plain).q, t.q);
  Case g = c;  // given bytes
  g.variants.custom_mask = t.custom_mask;
  g.variants.block_mask = t.block_mask;
  back = case_from_json(case_to_json(g));
  EXPECT_EQ(back.variants.custom_mask, t.custom_mask);
  EXPECT_EQ(generate(back).block_mask, t.block_mask);
  nlohmann::json j = case_to_json(g);
  j["variants"]["custom_mask"] = "a5";
  EXPECT_THROW(case_from_json(j), CorpusError);
  j = case_to_json(c);
  j["variants"]["mask_stride"] = {0, 0, 1};
  try {
    (void)case_from_json(j);
    ADD_FAILURE() << "a bits row stride of 1 byte for 13 keys was accepted";
  } catch (const CorpusError& e) {
    EXPECT_NE(std::string(e.what()).find("shorter than a row"), std::string::npos) << e.what();
  }
}
}  // namespace
}  // namespace attnfuzz
