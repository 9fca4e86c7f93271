// mx2nv verify: re-reads SRC and DST and proves every value of DST equals the
// value of SRC, independently of convert's code path (it decodes values with
// the general bit-field decoders and never uses the transcoder's scale map or
// plan). Structure, pass-through bytes, companion files, config rewrite,
// gate/up globals and the window are checked too. Any difference: result
// "mismatch" (exit 1) with the file, tensor, row and group concerned.
#pragma once

#include "common/progress.hpp"
#include "verify/merge.hpp"  // the rest of verify/'s face: verify --merge
#include "numerics/formats.hpp"
#include "plan/shard_selection.hpp"
#include "report/report.hpp"
#include "sys/file.hpp"

#include <optional>

namespace mx2nv {

struct VerifyOptions {
  fs::path source;
  fs::path target;
  Window window = Window::Marlin;
  unsigned threads = 1;
  // --shards I/N: compare the bytes and values of shards I, I+N, ... only (a
  // module belongs to its packed tensor's shard); the whole-checkpoint checks
  // (files, config, index, globals) run in every part. `verify --merge`
  // joins the partial reports.
  std::optional<ShardSelection> shards;
  ProgressCallback progress = {};  // optional; see common/progress.hpp (unit: modules, bytes: both sides' bytes compared)
};

Report verify_checkpoint(const VerifyOptions& options);

}  // namespace mx2nv
