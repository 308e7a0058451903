// npy_cli.cpp - attn-check --npy / --npy-emit: options, spec resolution, judging through the Runner, exit
// codes.
#include "npy/npy_cli.h"

#include <cstdio>

#include "npy/external.h"
#include "npy/sequences.h"

namespace fs = std::filesystem;

namespace attnfuzz::npy {

void add_npy_options(CLI::App& app, NpyOptions& o) {
  using namespace cli;
  auto* g = "External outputs (NPY; examples/npy/README.md)";
  auto* dir =
      app.add_option(
             "--npy", o.dir,
             "judge outputs computed elsewhere: DIR with q.npy k.npy v.npy o.npy [lse.npy] [case.json], or "
             "an --npy-emit directory whose variants hold o.npy")
          ->group(g)
          ->check(CLI::ExistingDirectory);
  auto* q = app.add_option("--q", o.q, "q file [B,Sq,Hq,D] (with --k --v --o, instead of --npy)")
                ->group(g)
                ->check(existing_file());
  auto* k = app.add_option("--k", o.k, "k file [B,Sk,Hkv,D]")->group(g)->check(existing_file());
  auto* v = app.add_option("--v", o.v, "v file [B,Sk,Hkv,Dv]")->group(g)->check(existing_file());
  auto* out = app.add_option("--o", o.o, "output file [B,Sq,Hq,Dv]")->group(g)->check(existing_file());
  auto* lse = app.add_option("--lse", o.lse, "optional LSE file [B,Hq,Sq] (natural log)")
                  ->group(g)
                  ->check(existing_file());
  auto* meta = app.add_option("--npy-meta", o.meta,
                              "JSON sidecar: layout, mask, scale, kv_heads, compute_dtype, bf16_raw (default "
                              "DIR/case.json; flags win)")
                   ->group(g)
                   ->check(existing_file());
  app.add_option("--layout", o.layout, "bshd ([B,S,H,D], default) | bhsd ([B,H,S,D]); lse is always [B,H,Sq]")
      ->group(g)
      ->check(CLI::IsMember({"bshd", "bhsd"}));
  app.add_option(
         "--compute-dtype", o.compute_dtype,
         "precision the kernel computed in: fp32 | fp16 | bf16 (default: from q's dtype); picks the bound; "
         "with --npy-emit, the values are rounded to it and stored as float16 / float32")
      ->group(g)
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  app.add_option("--compute-model", o.compute_model,
                 "how an fp16 / bf16 kernel computed: fused (fp32 scores and softmax statistics, P rounded before "
                 "P.V: FlashAttention-style) | unfused (scores rounded to the dtype: math-style; default, the "
                 "wider bound); picks the bound")
      ->group(g)
      ->check(CLI::IsMember({"fused", "unfused"}));
  app.add_flag("--bf16-raw", o.bf16_raw, "16-bit integer NPY arrays hold bfloat16 bits (read and --npy-emit)")
      ->group(g);
  auto* emit =
      app.add_option(
             "--npy-emit", o.emit,
             "write the case's q/k/v (and its metamorphic variants: keys permuted, masked keys NaN/Inf, "
             "other rows changed) with a manifest to DIR, for an external kernel")
          ->group(g)
          ->check(non_empty());
  // --q --k --v --o [--lse] go together; --npy DIR instead of them; --npy-emit writes, so reads nothing.
  for (CLI::Option* x : {q, k, v}) x->needs(out);
  out->needs(q)->needs(k)->needs(v);
  lse->needs(out);
  for (CLI::Option* x : {q, k, v, out, lse}) dir->excludes(x);
  for (CLI::Option* x : {dir, q, k, v, out, lse, meta}) emit->excludes(x);
}

std::string check_npy_combination(const NpyOptions& o) {
  const bool judging = !o.dir.empty() || !o.o.empty();
  if (!o.meta.empty() && !judging) return "--npy-meta needs --npy DIR or --o FILE";
  if (!o.compute_model.empty() && !judging) return "--compute-model needs --npy DIR or --o FILE";
  if (!judging && o.emit.empty()) {
    if (!o.layout.empty()) return "--layout needs --npy, --o or --npy-emit";
    if (!o.compute_dtype.empty()) return "--compute-dtype needs --npy, --o or --npy-emit";
    if (o.bf16_raw) return "--bf16-raw needs --npy, --o or --npy-emit";
  }
  return {};
}

bool npy_mode(const NpyOptions& o) { return !o.dir.empty() || !o.o.empty(); }

namespace {

int input_error(const std::string& msg) {
  std::fprintf(stderr, "attn-check: %s\n", msg.c_str());
  return 2;
}

std::string quote(const std::string& s) {
  if (!s.empty() &&
      s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@") ==
          std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

int run_npy(const NpyOptions& o, const SharedCaseFlags& f, Session& s, const CommonOptions& common) {
  try {
    Overrides ov;
    if (!o.layout.empty()) {
      Layout l;
      if (!parse_layout(o.layout, l))
        return input_error("--layout must be bshd or bhsd, not '" + o.layout + "'");
      ov.layout = l;
    }
    if (!o.compute_dtype.empty()) {
      auto d = parse_compute_dtype(o.compute_dtype);
      if (!d) return input_error("--compute-dtype must be fp32, fp16 or bf16, not '" + o.compute_dtype + "'");
      ov.compute_dtype = *d;
    }
    if (!o.compute_model.empty()) ov.compute_model = parse_compute_model(o.compute_model);  // checked by CLI11
    if (f.mask_given) ov.mask = f.mask;
    if (f.scale_given) {
      try {
        size_t used = 0;
        ov.scale = std::stof(f.scale, &used);
        if (used != f.scale.size()) throw std::invalid_argument("trailing text");
      } catch (const std::exception&) {
        return input_error("--scale '" + f.scale + "' is not a number");
      }
    }
    if (f.kv_heads > 0) ov.kv_heads = f.kv_heads;
    ov.bf16_raw = o.bf16_raw;
    if (!o.dir.empty() && !o.o.empty()) return input_error("--npy DIR and --o FILE are exclusive");
    OracleOptions oo = s.run.oracle;
    std::string replay = "attn-check " + (o.dir.empty() ? std::string() : "--npy " + quote(o.dir));
    if (o.dir.empty())
      for (const auto& [flag, val] : {std::pair<const char*, const std::string*>{"--q", &o.q},
                                      {"--k", &o.k},
                                      {"--v", &o.v},
                                      {"--o", &o.o},
                                      {"--lse", &o.lse},
                                      {"--npy-meta", &o.meta}})
        if (!val->empty()) replay += std::string(" ") + flag + " " + quote(*val);
    for (const auto& [flag, val] : {std::pair<const char*, const std::string*>{"--layout", &o.layout},
                                    {"--compute-dtype", &o.compute_dtype},
                                    {"--compute-model", &o.compute_model}})
      if (!val->empty()) replay += std::string(" ") + flag + " " + quote(*val);
    if (f.mask_given) replay += " --mask " + quote(f.mask);
    if (f.scale_given) replay += " --scale " + quote(f.scale);
    if (o.bf16_raw) replay += " --bf16-raw";

    Runner runner(s, common);
    std::error_code ec;
    // --pass bwd / fwdbwd: the gradients must be there to judge (a forward check alone would exit 0).
    const bool want_bwd = has_backward(case_pass(common));
    const std::string pass_flag = "--pass " + common.pass;
    if (want_bwd && o.dir.empty())
      return input_error(pass_flag + ": --q/--k/--v/--o judge the forward only: give --npy DIR with do.npy, dq.npy, "
                         "dk.npy and dv.npy");
    if (!o.dir.empty() && is_sequence_dir(o.dir)) {  // a varlen / KV-cache / paged case (npy/sequences.h)
      for (const char* g : {"do.npy", "dq.npy", "dk.npy", "dv.npy"})
        if (want_bwd || fs::exists(fs::path(o.dir) / g, ec))
          return input_error(o.dir + ": a sequence layout is judged forward only" +
                             (want_bwd ? " (drop " + pass_flag + ")" : " (" + std::string(g) + " is not read)"));
      Case c;
      Judged j = judge_sequence_dir(o.dir, oo, s.run.worst, c);
      runner.begin(1);
      runner.record(c, std::move(j), "attn-check --npy " + quote(o.dir));
      return runner.finish();
    }
    if (!o.dir.empty() && fs::exists(fs::path(o.dir) / kManifestName, ec)) {
      if (want_bwd)
        return input_error(pass_flag + ": " + o.dir + " is an --npy-emit directory of forward variants");
      auto results = evaluate_manifest(o.dir, ov, oo, s.run.worst);
      runner.begin(static_cast<int64_t>(results.size()));
      for (auto& r : results) {
        Case c = case_of(r.ext);
        c.label = r.name;
        runner.record(c, std::move(r.judged), replay);
        for (const auto& n : r.notes)
          if (!common.quiet) std::printf("note: %s\n", n.c_str());
      }
      return runner.finish();
    }
    Files files;
    fs::path sidecar = o.meta;
    if (!o.dir.empty()) {
      files = files_in(o.dir);
      if (sidecar.empty()) sidecar = fs::path(o.dir) / "case.json";
    } else {
      if (o.q.empty() || o.k.empty() || o.v.empty())
        return input_error("--o needs --q, --k and --v (or use --npy DIR)");
      files = {o.q, o.k, o.v, o.o, o.lse};
    }
    if (!o.meta.empty() && !fs::exists(o.meta, ec)) return input_error(o.meta + ": cannot open the file");
    if (want_bwd && files.dq.empty())
      return input_error(pass_flag + ": " + o.dir + " has no do.npy, dq.npy, dk.npy, dv.npy: no gradients to judge");
    const External e = load_external(files, resolve_spec(sidecar, ov));
    Judged j = judge_external(e, oo, s.run.worst);
    runner.begin(1);
    runner.record(case_of(e), std::move(j), replay);
    return runner.finish();
  } catch (const NpyError& e) {
    return input_error(e.what());
  } catch (const std::invalid_argument& e) {
    return input_error(e.what());
  }
}

int run_npy_emit(const NpyOptions& o, const Case& c, const std::string& command_line) {
  try {
    Layout l = Layout::kBSHD;
    if (!o.layout.empty() && !parse_layout(o.layout, l))
      return input_error("--layout must be bshd or bhsd, not '" + o.layout + "'");
    int32_t cd = AF_DTYPE_F32;
    if (!o.compute_dtype.empty()) {
      auto d = parse_compute_dtype(o.compute_dtype);
      if (!d) return input_error("--compute-dtype must be fp32, fp16 or bf16, not '" + o.compute_dtype + "'");
      cd = *d;
    }
    if (has_sequences(c.problem)) {  // varlen / KV cache / paged: the layout's tensors and int32 arrays
      if (!o.layout.empty() || !o.compute_dtype.empty() || o.bf16_raw)
        return input_error("--npy-emit of a sequence layout writes float32 tensors in their layout: no --layout, "
                           "--compute-dtype or --bf16-raw");
      emit_sequence_case(c, o.emit, command_line);
      std::printf("wrote %s to %s: q.npy k.npy v.npy, the int32 arrays and case.json\nnext: write o.npy (and "
                  "optionally lse.npy) into it, then run\n  attn-check --npy %s\n",
                  describe(c).c_str(), o.emit.c_str(), quote(o.emit).c_str());
      return 0;
    }
    const auto names = emit_variants(c, cd, l, o.bf16_raw, o.emit, command_line);
    std::printf("wrote %zu variant(s) of %s to %s: ", names.size(), describe(c).c_str(), o.emit.c_str());
    for (size_t i = 0; i < names.size(); ++i) std::printf("%s%s", i ? ", " : "", names[i].c_str());
    std::printf(
        "\nnext: write o.npy (and optionally lse.npy) into each variant directory, then run\n  attn-check "
        "--npy %s\n",
        quote(o.emit).c_str());
    return 0;
  } catch (const NpyError& e) {
    return input_error(e.what());
  } catch (const std::invalid_argument& e) {
    return input_error(e.what());
  }
}

}  // namespace attnfuzz::npy
