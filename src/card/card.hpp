// mx2nv card: DST/README.md, a Hugging Face model card that says exactly
// what was done and what was proven, from a verify (or requantize) report of
// these very files (docs/card.md; the full rules: docs/reference/model-card.md).
// Every refusal is a usage error (exit 2) raised before anything is written.
#pragma once

#include "sys/file.hpp"

#include <optional>
#include <string>
#include <vector>

namespace mx2nv {

struct CardOptions {
  fs::path source, target;
  // Exactly one: the evidence. `report_text`, when set, is the report's JSON
  // text (the Python API's Report object) and `verify_report` / 
  // `requantize_report` only say which kind it is.
  std::optional<fs::path> verify_report, requantize_report;
  std::optional<std::string> report_text;
  // Options not given are nullopt; a given option is used as given or
  // refused (an empty value is a usage error, never "not given").
  std::optional<std::string> base_model;  // --base-model ORG/NAME (nullopt = infer from a hub-cache SRC)
  std::optional<std::string> companion;   // --companion ORG/NAME[@REV]
  std::optional<std::string> repo_id;     // --repo-id ORG/NAME
  std::optional<fs::path> gpu_check;      // --gpu-check LOG
  unsigned tp = 1;
  unsigned threads = 1;
};

struct CardResult {
  fs::path path;            // DST/README.md
  bool source_card = false;  // DST/README.source.md written (SRC has README.md)
  std::string sha256;       // of the card's bytes
  std::string text;         // the card
  std::vector<std::string> inherited, dropped, not_inherited;  // SRC card keys
  std::string source_card_problem;                              // "" when read (or absent)
  // The front matter written, in order: (key, value) with value a JSON
  // string or list of strings.
  std::vector<std::pair<std::string, std::vector<std::string>>> front_matter;
  std::vector<std::string> list_keys;  // keys of front_matter whose value is a list
  std::vector<std::string> warnings;                            // stderr lines, without "card: "
};

// Validates a repo id as huggingface_hub's validate_repo_id does (2.4.0
// utils/_validators.py:95-150): letters, digits, -_. ; at most one '/';
// parts of 1-96 characters; no "--" or ".."; no leading or trailing '-' or
// '.'; not ending in ".git".
bool valid_repo_id(std::string_view id);

CardResult run_card(const CardOptions& options);

}  // namespace mx2nv
