#include "destination/index_writer.hpp"

#include "common/stream_hash.hpp"
#include "plan/target_layout.hpp"

#include <algorithm>
#include <utility>

namespace mx2nv {

WrittenIndex write_target_index(const SourceCheckpoint& source, const Plan& plan, std::uint64_t total_size,
                                Destination& out) {
  WrittenIndex w{out.begin(std::string(kIndexFileName)), 0, 0, total_size};
  StreamHash hash;
  render_target_index(source, plan.modules, total_size, [&](std::string_view piece) {
    w.file.file.write_at(w.bytes, std::as_bytes(std::span(piece)));
    hash.update(std::as_bytes(std::span(piece)));
    w.bytes += piece.size();
  });
  w.hash = hash.digest();
  return w;
}

std::optional<std::uint64_t> early_index_total(const SourceCheckpoint& source, const Plan& plan) {
  const Checkpoint& ck = source.checkpoint;
  if (!ck.index || ck.index->tensors.size() == 0) return std::nullopt;  // none, or its names were dropped
  if (std::any_of(plan.modules.begin(), plan.modules.end(),
                  [](const ModulePlan& m) { return m.treatment == Treatment::Bf16; })) {
    return std::nullopt;
  }
  return target_totals(ck.tensor_bytes(), ck.tensor_count(), source.modules).tensor_bytes;
}

BackgroundIndex::BackgroundIndex(const SourceCheckpoint& source, const Plan& plan, std::uint64_t total_size,
                                 Destination& out)
    : thread_([this, &source, &plan, total_size, &out] {
        try {
          result_ = write_target_index(source, plan, total_size, out);
        } catch (...) {
          error_ = std::current_exception();
        }
      }) {}

BackgroundIndex::~BackgroundIndex() {
  if (thread_.joinable()) thread_.join();
}

WrittenIndex BackgroundIndex::take() {
  if (thread_.joinable()) thread_.join();
  if (error_) std::rethrow_exception(error_);
  return std::move(*result_);
}

}  // namespace mx2nv
