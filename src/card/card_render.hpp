// The card's text from its facts (docs/reference/model-card.md §4, §5): a
// pure function, so the same inputs give the same bytes.
#pragma once

#include "card/evidence.hpp"
#include "card/source_card.hpp"
#include "gate/gate.hpp"
#include "model/target_format.hpp"
#include "report/report.hpp"

#include <string>
#include <vector>

namespace mx2nv {

struct CardFacts {
  EvidenceKind kind = EvidenceKind::Verify;
  TargetFormat format = TargetFormat::CompressedTensors;  // DST's, from its finished record and config
  const Report* report = nullptr;  // the verify or requantize report
  const GateResult* gate = nullptr;  // gate on DST at TP `tp`, runtimes not asked
  SourceCard source;             // .present false: SRC has no README.md
  std::string base_model;        // written to the front matter ("" = none)
  bool base_given = false;       // --base-model
  std::string snapshot_repo, snapshot_rev;  // §2.1 on provenance.source ("" = not a snapshot)
  std::string companion_repo, companion_rev;
  std::string repo_id;
  std::optional<std::string> gpu_log;
  unsigned tp = 1;
  bool trust_remote_code = false;
  std::vector<std::string> license_files;  // DST companions named LICENSE*, ... (byte order)
  std::string version;                     // this mx2nv's
};

std::string render_card(const CardFacts& facts);

// The front matter's tags: nvfp4, the format's (compressed-tensors or
// modelopt), mx2nv, then requantized when any module is lossy.
std::vector<std::string> card_tags(const CardFacts& facts);

// Parts of the body (card_sections.cpp).
std::string render_gate_and_load(const CardFacts& f);
std::string render_trailer(const CardFacts& f);  // Companion .. License

// Report numbers written exactly (§5.0), as the report's JSON has them: an
// integer in plain digits, a double as Python's repr, an infinite one as inf
// (the report's "inf").
std::string number_text(std::uint64_t value);
std::string number_text(double value);
std::string table_row(const std::vector<std::string>& cells);

}  // namespace mx2nv
