// The report a card is written from, and the refusals that keep a card from
// claiming what the report does not prove (docs/reference/model-card.md §6,
// rules 2 to 7; the fingerprints, rule 8, are compared in card.cpp).
#pragma once

#include "model/target_format.hpp"
#include "report/report.hpp"
#include "sys/file.hpp"

#include <string>

namespace mx2nv {

enum class EvidenceKind { Verify, Requantize };

struct Evidence {
  EvidenceKind kind = EvidenceKind::Verify;
  Report report;      // read by report_from_json: every field of its type
  std::string bytes;  // the report's bytes (its sha256 goes to card.json)
};

// Reads and checks the report: a regular file of at most 64 MiB, strict JSON,
// a report of this mx2nv's schema (report_from_json), of the right command
// with an ok outcome, naming SRC and DST as `source` and `target` resolve
// now. `text`: the report given as JSON text instead of a file. Every
// refusal is a usage error (exit 2) that names the key it is about.
Evidence read_evidence(EvidenceKind kind, const fs::path& report, const std::string* text, const fs::path& source,
                       const fs::path& target);

// The window mode recorded in DST/.mx2nv/finished.json must be the report's
// (verify) or "requantize" (a requantize report). Returns the format the
// record names (the layout convert wrote DST in).
TargetFormat check_finished_mode(const Evidence& e, const fs::path& target);

}  // namespace mx2nv
