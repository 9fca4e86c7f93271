#include "gate/gate.hpp"

#include "checkpoint/reader.hpp"
#include "checkpoint/argument_check.hpp"
#include "common/error.hpp"
#include "common/parallel.hpp"
#include "common/printable.hpp"
#include "gate/expert_table.hpp"
#include "model/modules.hpp"
#include "numerics/formats.hpp"
#include "safetensors/file_names.hpp"
#include "sys/heap.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <span>

namespace mx2nv {
namespace {

constexpr std::uint64_t kChunkRows = 1024;  // rows of scales (and packed bytes) read at a time
constexpr std::size_t kNamedExamples = 5;
struct Reader {
  const Checkpoint* ck = nullptr;
  void read(const ExpertTensor& t, std::uint64_t offset, std::span<std::byte> out) const {
    ck->files->open(t.shard)->read_at(t.start + offset, out);
  }
  const std::string& file(const ExpertTensor& t) const { return ck->shards[t.shard].file; }
};

double e4m3_scale(std::uint8_t b) { return e4m3_value(b); }

bool block_active(const std::byte* p) {  // 8 packed bytes = 16 E2M1 codes
  for (int i = 0; i < 8; ++i) {
    const auto v = std::to_integer<std::uint8_t>(p[i]);
    if ((v & 0x07) != 0 || (v & 0x70) != 0) return true;
  }
  return false;
}

// Pass 1 over a module's block scales: the largest, the suspects, NaN refused.
void scan_scales(ExpertModule& m, std::string_view name, const Reader& io) {
  std::vector<std::byte> buf(static_cast<std::size_t>(std::min(m.rows, kChunkRows) * m.blocks));
  for (std::uint64_t row = 0; row < m.rows; row += kChunkRows) {
    const std::uint64_t n = std::min(kChunkRows, m.rows - row);
    const auto bytes = static_cast<std::size_t>(n * m.blocks);
    io.read(m.scale, row * m.blocks, {buf.data(), bytes});
    for (std::size_t i = 0; i < bytes; ++i) {
      const auto b = std::to_integer<std::uint8_t>(buf[i]);
      if ((b & 0x7F) == 0x7F) {
        fail_input("{}: tensor \"{}{}\" row {} block {}: block scale is NaN", io.file(m.scale), name, kScaleSuffix,
                   row + i / m.blocks, i % m.blocks);
      }
      const double v = e4m3_scale(b);
      if (v < 0) ++m.negative;
      m.max_scale = std::max(m.max_scale, v);
      if (v > 0 && v < std::ldexp(1.0, kE4M3MinNormalPow2)) ++m.suspects;
    }
  }
}

// Pass 2, only for modules with suspects: which suspect blocks are active,
// below 2^-6 (fp16) and below 2^-6 / sf (bf16).
std::pair<std::uint64_t, std::uint64_t> count_active_small(const ExpertModule& m, double sf, const Reader& io) {
  std::uint64_t fp16 = 0, bf16 = 0;
  const std::uint64_t rows = std::min(m.rows, kChunkRows);
  std::vector<std::byte> scales(static_cast<std::size_t>(rows * m.blocks));
  std::vector<std::byte> packed(static_cast<std::size_t>(rows * m.blocks * 8));
  for (std::uint64_t row = 0; row < m.rows; row += kChunkRows) {
    const std::uint64_t n = std::min(kChunkRows, m.rows - row);
    const auto ns = static_cast<std::size_t>(n * m.blocks);
    io.read(m.scale, row * m.blocks, {scales.data(), ns});
    io.read(m.packed, row * m.blocks * 8, {packed.data(), ns * 8});
    for (std::size_t i = 0; i < ns; ++i) {
      const double v = e4m3_scale(std::to_integer<std::uint8_t>(scales[i]));
      if (v <= 0 || v >= std::ldexp(1.0, kE4M3MinNormalPow2) || !block_active(&packed[i * 8])) continue;
      ++fp16;
      if (v * sf < std::ldexp(1.0, kE4M3MinNormalPow2)) ++bf16;
    }
  }
  return {fp16, bf16};
}

// vLLM's bf16 rescale for one bank (vLLM 0.34.0 marlin_utils_fp4.py:36-55, :375-377).
double bank_scale_factor(double max_scale) {
  if (max_scale <= 0 || max_scale >= 448) return 1.0;
  return std::exp2(std::floor(std::log2(448.0 / max_scale)));
}

// The runtimes' own selectors on the first MoE layer (every layer has the
// same scheme in the checkpoints gate judges: one shape, one config group).
void ask_own_selectors(const GateOptions& o, const Json& config, const std::vector<ExpertLayer>& layers, GateResult& r) {
  if (o.ask.when == AskRuntimes::Never) {
    r.not_asked = "asking the runtimes was turned off";
    return;
  }
  if (layers.empty()) {
    r.not_asked = "no routed experts to ask about";
    return;
  }
  std::vector<Runtime> runtimes;
  for (const auto& v : r.verdicts) {
    if (std::find(runtimes.begin(), runtimes.end(), v.backend->runtime) == runtimes.end()) {
      runtimes.push_back(v.backend->runtime);
    }
  }
  r.expert_layer = layers.front().prefix;
  r.asked = ask_runtimes(o.ask, *quantization_config_of(config), r.expert_layer, layers.front().names, runtimes);
  for (auto& opinion : r.asked.opinions) {
    RuntimeCheck c;
    // The scheme rule is per runtime: every backend and dtype of it agrees.
    for (const auto& v : r.verdicts) {
      if (v.backend->runtime == opinion.runtime) c.gate_selects = v.scheme_selected;
    }
    c.agreement = agreement(opinion, c.gate_selects);
    c.opinion = std::move(opinion);
    r.checks.push_back(std::move(c));
  }
  r.asked.opinions.clear();  // moved into checks
}

bool is_power_of_two(float v) {
  int e = 0;
  return std::frexp(static_cast<double>(v), &e) == 0.5;
}

// The multiplier g a module's stored global stands for (multiplier_of_stored).
double multiplier(const Experts& x, const ExpertModule& m) { return multiplier_of_stored(x.format, m.global_value); }

// Every module's global: positive and finite; the range of the multipliers
// g, and which are no powers of two.
void add_global_facts(const Experts& x, ScaleFacts& s) {
  bool first = true;
  for_each_module(x, [&](const ExpertModule& m) {
    if (!std::isfinite(m.global_value) || m.global_value <= 0) {
      fail_input("\"{}{}\" = {} is not positive and finite", x.name(m), format_names(x.format).global,
                 m.global_value);
    }
    const double g = multiplier(x, m);
    s.min_multiplier = first ? g : std::min(s.min_multiplier, g);
    s.max_multiplier = first ? g : std::max(s.max_multiplier, g);
    first = false;
    if (!is_power_of_two(m.global_value)) {
      ++s.modules_not_pow2;
      if (s.multipliers_not_pow2.size() < kNamedExamples) s.multipliers_not_pow2.emplace_back(x.name(m));
    }
    s.negative_scales += m.negative;
  });
}

// The experts whose gate and up globals differ (bit for bit), in one walk of
// the pairs: how many, the first few named; returns, per layer, whether it
// holds such an expert (Humming makes every w1/w3 global of that layer a
// per-channel scale).
std::vector<bool> add_pair_facts(const Experts& x, ScaleFacts& s) {
  std::vector<bool> mixed(x.layers.size(), false);
  for (std::size_t l = 0; l < x.layers.size(); ++l) {
    for (const auto& [e, slots] : x.layers[l].experts) {
      const float a = module_at(x, slots, W1).global_value;
      const float b = module_at(x, slots, W3).global_value;
      if (std::memcmp(&a, &b, 4) == 0) continue;
      if (s.gate_up_differ++ < kNamedExamples) s.gate_up_differ_first.push_back(fmt::format("{}.{}", x.layers[l].prefix, e));
      mixed[l] = true;
    }
  }
  return mixed;
}

// The w1/w3 multipliers of the mixed layers: their range, and which are no
// powers of two.
void add_channel_facts(const Experts& x, const std::vector<bool>& mixed, ScaleFacts& s) {
  bool first_channel = true;
  for_each_module(x, [&](const ExpertModule& m) {
    if (m.role == W2 || !mixed[m.layer]) return;
    const double g = multiplier(x, m);
    s.channel_min_multiplier = first_channel ? g : std::min(s.channel_min_multiplier, g);
    s.channel_max_multiplier = first_channel ? g : std::max(s.channel_max_multiplier, g);
    first_channel = false;
    if (!is_power_of_two(m.global_value)) {
      if (s.channel_not_pow2++ == 0) s.channel_not_pow2_example = x.name(m);
    }
  });
}

// Active blocks with scales below 2^-6 (fp16), and below 2^-6 after vLLM's
// bf16 rescale, whose factor is per bank: per layer, w13 (every expert's w1
// and w3) and w2. Only modules with suspects are read again.
void add_small_scale_facts(const Experts& x, const Reader& io, unsigned threads, ScaleFacts& s) {
  const auto bank = [](const ExpertModule& m) { return m.layer * 2 + (m.role == W2 ? 1 : 0); };
  std::vector<double> bank_max(x.layers.size() * 2, 0.0);
  for (const auto& m : x.modules) {
    double& mx = bank_max[bank(m)];
    mx = std::max(mx, m.max_scale);
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> small(x.modules.size());
  parallel_for(x.modules.size(), threads, [&](std::size_t i) {
    const ExpertModule& m = x.modules[i];
    if (m.suspects) small[i] = count_active_small(m, bank_scale_factor(bank_max[bank(m)]), io);
  });
  for (const auto& [fp16, bf16] : small) {
    s.active_below_fp16 += fp16;
    s.active_below_bf16 += bf16;
  }
}

// What one rank holds; null figures where the split is refused.
Json per_rank_json(const RankShare& share) {
  if (share.problem) {
    return {{"experts", nullptr}, {"intermediate", nullptr}, {"padded_intermediate", nullptr},
            {"routed_expert_bytes", nullptr}};
  }
  return {{"experts", share.experts},
          {"intermediate", share.intermediate},
          {"padded_intermediate", share.padded_intermediate},
          {"routed_expert_bytes", static_cast<std::uint64_t>(share.bytes)}};
}

}  // namespace

bool GateResult::disagreed() const {
  return std::any_of(checks.begin(), checks.end(), [](const RuntimeCheck& c) { return c.agreement == Agreement::Disagrees; });
}

int GateResult::exit_code() const { return blocked() || disagreed() ? kExitRefusedOrMismatch : kExitOk; }

std::string_view GateResult::result() const {
  const auto any = [&](Verdict::Kind k) {
    return std::any_of(verdicts.begin(), verdicts.end(), [&](const Verdict& v) { return v.kind == k; });
  };
  if (any(Verdict::Blocked)) return "BLOCKED";
  if (any(Verdict::Unknown)) return "UNKNOWN";
  if (any(Verdict::Unverified)) return "UNVERIFIED";
  return "RUN";
}

bool GateResult::blocked() const {
  return std::any_of(verdicts.begin(), verdicts.end(), [](const Verdict& v) { return v.kind == Verdict::Blocked; });
}

GateResult run_gate(const GateOptions& o) {
  GateResult result;
  result.checkpoint = fs::absolute(o.checkpoint).lexically_normal().string();
  check_converted_argument({Command::Gate, o.checkpoint, std::nullopt});
  // Only the expert modules' tensors are kept from each header as it streams
  // by, as fixed records: memory follows the module count, not the
  // checkpoint's size or every tensor's name.
  // The layout decides which names are the experts' (model/target_format.hpp).
  const fs::path hf = o.checkpoint / std::string(kModelOptConfigFileName);
  std::error_code ec;
  const TargetFormat format = target_format_of(read_text_file(o.checkpoint / std::string(kConfigFileName), kMaxConfigBytes),
                                               fs::is_regular_file(fs::symlink_status(hf, ec)));
  result.format = format;
  ExpertCollector collect(format);
  const auto keep = [&](std::size_t shard, std::string_view, const ShardHeader& header) { collect.add(shard, header); };
  Checkpoint ck = open_checkpoint(o.checkpoint, CheckpointRole::Target, o.threads, keep);  // an mx2nv output may hold .mx2nv/
  // The index was checked against the shards; gate reads by the records it
  // kept, so the index's names go now (their pages back to the system).
  if (ck.index) ck.index->forget_tensors();
  release_free_heap();
  const Reader io{&ck};
  const Json config = parse_strict_json(ck.config_text, "config.json").value;
  const std::vector<SchemeFacts> schemes = scheme_facts(config);
  result.architecture = architecture_of(config);

  Experts experts = collect.finish();
  check_nvfp4(experts);
  result.dims = expert_dims(experts);
  ScaleFacts& s = result.scales;
  s.block_scales_read = !o.quick;
  parallel_for(experts.modules.size(), o.threads, [&](std::size_t i) {
    ExpertModule& m = experts.modules[i];
    std::byte le[4];
    io.read(m.global, 0, le);
    std::memcpy(&m.global_value, le, 4);
    if (!o.quick) scan_scales(m, experts.name(m), io);
  });
  add_global_facts(experts, s);
  add_channel_facts(experts, add_pair_facts(experts, s), s);
  if (!o.quick) add_small_scale_facts(experts, io, o.threads, s);

  const ModelOptScheme modelopt = format == TargetFormat::ModelOpt ? modelopt_scheme(config) : ModelOptScheme{};
  std::vector<std::string> layers;
  for (const ExpertLayer& l : experts.layers) layers.push_back(l.prefix);
  for (const RuntimeBackend* b : runtime_backends(format)) {
    if (o.runtime && *o.runtime != b->runtime) continue;
    for (const ActivationDtype d : o.dtypes) {
      result.verdicts.push_back(
          judge_backend(*b, d, {o.tp, o.ep}, result.architecture, schemes, result.dims, s, modelopt, layers));
    }
  }
  if (format == TargetFormat::ModelOpt) {
    // The probe asks compressed-tensors' selectors; ModelOpt's are judged from their code above.
    result.not_asked = "the runtime probe asks compressed-tensors' scheme selectors; a ModelOpt checkpoint's are judged "
                       "from the pinned releases' code";
  } else {
    ask_own_selectors(o, config, experts.layers, result);
  }
  return result;
}

Json gate_to_json(const GateResult& r) {
  Json j;
  // Every string that can hold a path, a name from the checkpoint or the
  // probe's text goes through json_text(), as in every report.
  const auto texts = [](const auto& strings) {
    Json out = Json::array();
    for (const auto& s : strings) out.push_back(json_text(s));
    return out;
  };
  j["checkpoint"] = json_text(r.checkpoint);
  j["result"] = r.result();
  j["format"] = choice_name(r.format);
  j["architecture"] = r.architecture.empty() ? Json(nullptr) : Json(json_text(r.architecture));
  j["dims"] = {{"hidden", r.dims.hidden},
               {"intermediate", r.dims.intermediate},
               {"experts", r.dims.experts},
               {"moe_layers", r.dims.layers}};
  j["scales"] = {{"gate_up_globals_differ", r.scales.gate_up_differ},
                 {"gate_up_globals_differ_first", texts(r.scales.gate_up_differ_first)},
                 {"min_global_multiplier", r.scales.min_multiplier},
                 {"max_global_multiplier", r.scales.max_multiplier},
                 {"globals_not_power_of_two", r.scales.modules_not_pow2},
                 {"per_channel_globals",  // w1/w3 of layers with a differing pair (Humming)
                  {{"min_multiplier", r.scales.channel_min_multiplier},
                   {"max_multiplier", r.scales.channel_max_multiplier},
                   {"not_power_of_two", r.scales.channel_not_pow2}}},
                 {"active_blocks_below_2^-6_fp16", r.scales.active_below_fp16},
                 {"active_blocks_below_2^-6_bf16_after_rescale", r.scales.active_below_bf16},
                 {"negative_block_scales", r.scales.negative_scales}};
  if (!r.scales.block_scales_read) {  // gate --quick: the facts of the block scales are unknown, not zero
    j["quick"] = true;
    for (const char* key : {"active_blocks_below_2^-6_fp16", "active_blocks_below_2^-6_bf16_after_rescale",
                            "negative_block_scales"}) {
      j["scales"][key] = nullptr;
    }
  }
  j["verdicts"] = Json::array();
  for (const auto& v : r.verdicts) {
    j["verdicts"].push_back({{"runtime", choice_name(v.backend->runtime)},
                             {"version", v.backend->version},
                             {"backend", choice_name(v.backend->backend)},
                             {"gpus", v.backend->gpus},
                             {"dtype", choice_name(v.dtype)},
                             {"tp", v.tp},
                             {"ep", v.ep},
                             {"model_class", v.model_class.empty() ? Json(nullptr) : Json(v.model_class)},
                             {"per_rank", per_rank_json(v.share)},
                             {"verdict", verdict_name(v.kind)},
                             {"reasons", texts(v.reasons)},
                             {"notes", texts(v.notes)}});
  }
  j["tp_table"] = tp_table_json(r.dims, r.format);
  Json asked = {{"asked", r.not_asked.empty()},
                {"not_asked", json_text(r.not_asked)},
                {"python", json_text(r.asked.python)},
                {"python_version", json_text(r.asked.python_version)},
                {"layer", json_text(r.expert_layer)},
                {"disagreement", r.disagreed()},
                {"runtimes", Json::array()}};
  for (const auto& c : r.checks) {
    const RuntimeOpinion& op = c.opinion;
    asked["runtimes"].push_back({{"runtime", choice_name(op.runtime)},
                                 {"outcome", answer_name(op.answer)},
                                 {"version", json_text(op.version)},
                                 {"pinned", json_text(op.pinned)},
                                 {"version_differs", op.version_differs()},
                                 {"selected", json_text(op.selected)},
                                 {"selects_nvfp4a16", op.selects_nvfp4a16},
                                 {"gate_selects_nvfp4a16", c.gate_selects},
                                 {"agreement", agreement_name(c.agreement)},
                                 {"reason", json_text(op.reason)}});
  }
  j["runtime_selectors"] = std::move(asked);
  j["exit_code"] = r.exit_code();
  return j;
}

}  // namespace mx2nv
