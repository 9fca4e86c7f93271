// Fuzz target: plan files (`mx2nv plan`, read by every planned step from
// shared storage). Properties: no crash, and a plan accepted is one a step
// can act on as written: SRC and DST absolute and byte-exact (they survive
// writing the plan again), shard names confined to the checkpoint and
// unique, every row's global consistent with its m, treatment and the
// plan's --overspan choice; writing an accepted plan again gives a plan that
// reads back to the same values and checksum. Every input gets one
// verdict: the streaming reader alone accepts the same plan or refuses with
// the same message, and the line reader of the text mx2nv writes accepts
// only a plan the streaming reader accepts.
#include "common/error.hpp"
#include "json/json_stream.hpp"
#include "numerics/formats.hpp"
#include "plan/plan_file.hpp"
#include "safetensors/index.hpp"

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>

namespace {

using namespace mx2nv;

bool same_rows(const PlanFile& a, const PlanFile& b) {
  if (a.modules.size() != b.modules.size() || a.module_names != b.module_names) return false;
  for (std::size_t i = 0; i < a.modules.size(); ++i) {
    const ModulePlan& x = a.modules[i];
    const ModulePlan& y = b.modules[i];
    if (x.treatment != y.treatment || x.m != y.m ||
        std::bit_cast<std::uint32_t>(x.divisor) != std::bit_cast<std::uint32_t>(y.divisor) ||
        x.zero_scales != y.zero_scales || x.span != y.span || x.groups_outside != y.groups_outside ||
        x.canonical_zero_groups != y.canonical_zero_groups || x.marlin_zeroed_groups != y.marlin_zeroed_groups) {
      return false;
    }
  }
  return true;
}

bool same_shards(const PlanFile& a, const PlanFile& b) {
  if (a.shards.size() != b.shards.size()) return false;
  for (std::size_t s = 0; s < a.shards.size(); ++s) {
    const PlannedShard& x = a.shards[s];
    const PlannedShard& y = b.shards[s];
    if (x.file != y.file || x.source_size != y.source_size || x.source_mtime_ns != y.source_mtime_ns ||
        x.source_header_hash != y.source_header_hash || x.plan_hash != y.plan_hash ||
        x.output_data_bytes != y.output_data_bytes || x.output_tensors != y.output_tensors) {
      return false;
    }
  }
  return true;
}

bool same_plan(const PlanFile& a, const PlanFile& b) {
  return a.kind == b.kind && a.source == b.source && a.target == b.target && a.tool_version == b.tool_version &&
         a.window == b.window && a.over_span_choice == b.over_span_choice && a.format == b.format &&
         a.fingerprint == b.fingerprint && same_shards(a, b) && same_rows(a, b);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const MemorySource source(input);
  std::optional<PlanFile> streamed;
  std::string refusal;
  try {
    streamed = plan_file_streamed(source, size, "fuzz");
  } catch (const Error& e) {
    refusal = e.what();
  }
  std::optional<PlanFile> as_written;
  try {
    as_written = plan_file_as_written(source, size, "fuzz");
  } catch (const Error&) {
    std::abort();  // the line reader declines, never refuses
  }
  if (as_written && (!streamed || !same_plan(*as_written, *streamed))) std::abort();
  PlanFile plan;
  try {
    plan = plan_file_from_text(input, "fuzz");
  } catch (const Error& e) {
    if (streamed || refusal != e.what()) std::abort();
    return 0;  // refused: the only other outcome allowed
  }
  if (!streamed || !same_plan(plan, *streamed)) std::abort();
  for (const std::string* path : {&plan.source, &plan.target}) {
    if (path->empty() || path->front() != '/' || path->find('\0') != std::string::npos) std::abort();
  }
  std::set<std::string> files;
  for (const auto& s : plan.shards) {
    if (!is_confined_relative_path(s.file) || !files.insert(s.file).second) std::abort();
  }
  if (plan.shards.empty() || plan.module_names.size() != plan.modules.size()) std::abort();
  for (const auto& m : plan.modules) {
    switch (m.treatment) {
      case Treatment::Exact: {
        const auto divisor = global_divisor_for(m.m);
        if (!divisor || std::bit_cast<std::uint32_t>(*divisor) != std::bit_cast<std::uint32_t>(m.divisor)) std::abort();
        break;
      }
      case Treatment::Requantized:
        if (plan.over_span_choice != OverSpanChoice::Requantize || !(m.divisor > 0)) std::abort();
        break;
      case Treatment::Bf16:
        if (plan.over_span_choice != OverSpanChoice::Bf16) std::abort();
        break;
    }
  }
  // Written again (always in the current format), it reads back the same.
  PlanFile again = plan;
  const std::string text = plan_file_to_text(again);
  try {
    const PlanFile back = plan_file_from_text(text, "again");
    if (back.source != plan.source || back.target != plan.target || back.tool_version != plan.tool_version ||
        back.window != plan.window || back.over_span_choice != plan.over_span_choice || !same_shards(back, plan) ||
        !same_rows(back, plan) || back.fingerprint != again.fingerprint) {
      std::abort();
    }
  } catch (const Error&) {
    std::abort();
  }
  return 0;
}
