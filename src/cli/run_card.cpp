// mx2nv card SRC DST --verify-report R: DST/README.md, the Hugging Face model
// card with the evidence (card/card.hpp; docs/card.md).
#include "card/card.hpp"
#include "cli/standard_output.hpp"
#include "cli/shared_options.hpp"
#include "cli/subcommand.hpp"
#include "common/printable.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

namespace mx2nv::cli {
namespace {

class CardCommand final : public Subcommand {
 public:
  explicit CardCommand(CLI::App& mx2nv)
      : Subcommand(mx2nv, Command::Card, "write DST/README.md: a Hugging Face model card from a verify report of DST") {
    add_source("the MXFP4 source checkpoint", true);
    add_target("DST", "the converted checkpoint (or requantize's output)", true);
    app_->add_option("--verify-report", verify_, "the report of `mx2nv verify SRC DST --report R`");
    app_->add_option("--requantize-report", requantize_, "the report of `mx2nv requantize SRC DST --report R`");
    app_->add_option("--base-model", base_model_, "ORG/NAME of the source on the Hub (default: from a hub-cache SRC)");
    app_->add_option("--companion", companion_, "ORG/NAME[@40-hex REV]: the other artifact (requantized or lossless)");
    app_->add_option("--tp", options_.tp, "tensor-parallel degree of the gate table and load commands (default 1), 1-1024")
        ->type_name("N")->check(CLI::Range(1u, 1024u).description(""));
    app_->add_option("--repo-id", repo_id_, "ORG/NAME DST will be published as (in the load commands)");
    app_->add_option("--gpu-check", gpu_check_, "the saved output of scripts/gpu-check.sh");
    add_threads_option();
  }

  int run(CommandRun& state) override {
    note_run(state);
    options_.source = source_;
    options_.target = target_;
    options_.threads = threads_;
    // An option given is passed on as given, an empty value too (the
    // library refuses it): never mistaken for an option not given.
    const auto given = [&](const char* name) { return app_->count(name) > 0; };
    if (given("--verify-report")) options_.verify_report = verify_;
    if (given("--requantize-report")) options_.requantize_report = requantize_;
    if (given("--gpu-check")) options_.gpu_check = gpu_check_;
    if (given("--base-model")) options_.base_model = base_model_;
    if (given("--companion")) options_.companion = companion_;
    if (given("--repo-id")) options_.repo_id = repo_id_;
    const CardResult r = run_card(options_);
    for (const auto& w : r.warnings) err("card: {}\n", printable(w));
    if (r.source_card) out("card: kept SRC's README.md as {}\n", printable((fs::path(target_) / "README.source.md").string()));
    out("card: wrote {} ({} bytes)\n", printable(r.path.string()), r.text.size());
    return 0;
  }

 private:
  CardOptions options_;
  std::string verify_, requantize_, gpu_check_, base_model_, companion_, repo_id_;
};

}  // namespace

std::unique_ptr<Subcommand> add_card(CLI::App& mx2nv) { return std::make_unique<CardCommand>(mx2nv); }

}  // namespace mx2nv::cli
