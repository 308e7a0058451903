// sequences.cpp - varlen / KV-cache / paged cases through NPY: inputs in their layout + int32 arrays out,
// an external output judged per sequence.
#include "npy/sequences.h"

#include <bit>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <xtensor/xadapt.hpp>
#include <xtensor/xnpy.hpp>

#include "attnfuzz/corpus.h"
#include "check/compare.h"
#include "check/sequences.h"
#include "npy/external.h"
#include "npy/npy_io.h"

namespace attnfuzz::npy {

namespace fs = std::filesystem;

namespace {

void write_ints(const fs::path& path, const std::vector<int64_t>& shape, const std::vector<int32_t>& v) {
  std::vector<size_t> sh(shape.begin(), shape.end());
  std::string bytes;
  try {
    bytes = xt::dump_npy(xt::adapt(v.data(), v.size(), xt::no_ownership(), sh));
  } catch (const std::exception& e) {
    throw NpyError(path.string() + ": cannot encode NPY: " + e.what());
  }
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw NpyError(path.string() + ": cannot write the file");
}

// Shapes of q (and o with Dv) / k / v in the layout.
std::vector<int64_t> q_shape(const Problem& p, int64_t d) {
  if (p.q_layout == AF_SEQ_PACKED) return {p.total_q, p.heads_q, d};
  return {p.batch, p.seq_q, p.heads_q, d};
}
std::vector<int64_t> kv_shape(const Problem& p, int64_t d) {
  if (p.kv_layout == AF_SEQ_PACKED) return {p.total_k, p.heads_kv, d};
  if (p.kv_layout == AF_SEQ_PAGED) return {p.num_pages, p.page_size, p.heads_kv, d};
  return {p.batch, p.seq_k, p.heads_kv, d};
}

}  // namespace

void emit_sequence_case(const Case& c, const fs::path& dir, const std::string& command_line) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw NpyError(dir.string() + ": cannot create the directory: " + ec.message());
  const Problem& p = c.problem;
  Tensors t = generate(c);
  fill_outside(p, t, std::bit_cast<uint32_t>(std::numeric_limits<float>::quiet_NaN()));
  write_array(dir / "q.npy", q_shape(p, p.head_dim), t.q.data());
  write_array(dir / "k.npy", kv_shape(p, p.head_dim), t.k.data());
  write_array(dir / "v.npy", kv_shape(p, p.head_dim_v), t.v.data());
  const int64_t B = p.batch;
  if (!t.cu_seqlens_q.empty()) write_ints(dir / "cu_seqlens_q.npy", {B + 1}, t.cu_seqlens_q);
  if (!t.cu_seqlens_k.empty()) write_ints(dir / "cu_seqlens_k.npy", {B + 1}, t.cu_seqlens_k);
  if (!t.seqused_k.empty()) write_ints(dir / "seqused_k.npy", {B}, t.seqused_k);
  if (!t.block_table.empty()) write_ints(dir / "block_table.npy", {B, p.max_pages_per_seq}, t.block_table);
  Json j;
  j["sequence_case"] = case_to_json(c);
  j["describe"] = describe(c);
  j["command"] = command_line;
  std::ofstream out(dir / "case.json");
  out << j.dump(2) << "\n";
  if (!out) throw NpyError((dir / "case.json").string() + ": cannot write the file");
}

bool is_sequence_dir(const fs::path& dir) {
  std::string text;
  if (!read_regular_file(dir / "case.json", kMaxJsonBytes, text).empty()) return false;
  try {
    const Json j = Json::parse(text);
    return j.is_object() && j.contains("sequence_case");
  } catch (const std::exception&) {
    return false;
  }
}

Judged judge_sequence_dir(const fs::path& dir, const OracleOptions& opts, size_t worst, Case& out_case) {
  std::string text;
  if (std::string e = read_regular_file(dir / "case.json", kMaxJsonBytes, text); !e.empty()) throw NpyError(e);
  try {
    out_case = case_from_json(Json::parse(text).at("sequence_case"));
  } catch (const std::exception& e) {
    throw NpyError((dir / "case.json").string() + ": not a sequence case: " + e.what());
  }
  PreparedCase pc(out_case);
  const Problem& p = pc.problem();
  const Tensors& t = pc.tensors();
  const Array o = read_array(dir / "o.npy");
  if (o.shape != q_shape(p, p.head_dim_v))
    throw NpyError((dir / "o.npy").string() + ": shape " + shape_text(o.shape) + ", the case needs " +
                   shape_text(q_shape(p, p.head_dim_v)) + " (o follows q's layout)");
  std::vector<float> lse;
  bool fa_lse = false;
  if (fs::exists(dir / "lse.npy")) {
    const Array l = read_array(dir / "lse.npy");
    const std::vector<int64_t> ours{p.batch, p.heads_q, p.seq_q}, fa{p.heads_q, p.total_q};
    if (l.shape == ours) {
      lse = l.data;
    } else if (p.q_layout == AF_SEQ_PACKED && l.shape == fa) {  // FlashAttention varlen: [Hq, total_q]
      fa_lse = true;
      lse.assign(static_cast<size_t>(lse_elements(p)), 0.0f);
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t h = 0; h < p.heads_q; ++h)
          for (int64_t s = 0; s < seq_len_q(p, t, b); ++s)
            lse[lse_index(p, b, h, s)] = l.data[h * p.total_q + t.cu_seqlens_q[b] + s];
    } else {
      throw NpyError((dir / "lse.npy").string() + ": shape " + shape_text(l.shape) + ", the case needs " +
                     shape_text(ours) + (p.q_layout == AF_SEQ_PACKED ? " or " + shape_text(fa) : ""));
    }
  }
  std::vector<float> vo, vl;
  outputs_to_view(p, t, o.data, lse, 0.0f, vo, vl);
  Judged j;
  CheckResult& r = j.result;
  r.kernel = "npy";
  r.backend = "external";
  r.device = "files";
  CompareOptions co;
  co.worst = worst;
  const OracleResult& exact = pc.oracle(opts);
  CheckResult cmp;
  j.ratio_map = compare_output(pc.view(), exact, vo.data(), vl.empty() ? nullptr : vl.data(), cmp, co);
  r.verdict = cmp.verdict;
  r.failure = cmp.failure;
  r.reason = cmp.reason;
  r.worst = std::move(cmp.worst);
  r.max_ratio = cmp.max_ratio;
  r.max_abs_err = cmp.max_abs_err;
  r.baseline_max_ratio = cmp.baseline_max_ratio;
  r.compared = cmp.compared;
  r.failed = cmp.failed;
  r.evidence = std::move(cmp.evidence);
  r.evidence.push_back({"scope", "external output of a " + attnfuzz::layout_name(p) +
                                     " case (rows per sequence, mask aligned per sequence" +
                                     (fa_lse ? ", LSE read as [Hq, total_q]" : "") +
                                     "); oob-read, oob-write and barrier-race need the kernel itself"});
  j.outcome.o = std::move(vo);
  j.outcome.lse = std::move(vl);
  return j;
}

}  // namespace attnfuzz::npy
