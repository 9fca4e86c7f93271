#include "cli/summary.hpp"

#include "cli/standard_output.hpp"
#include "common/printable.hpp"
#include "html/html.hpp"

#include <fmt/core.h>

#include <algorithm>

namespace mx2nv::cli {

void print_error(const Error& e) { err("mx2nv: {}: {}\n", kind_name(e.kind()), printable(e.what())); }

void print_over_span(const std::vector<OverSpan>& over) {
  for (const auto& o : over) {
    out("  over span: {}: span {} > {}, {} active groups outside the window\n",
        printable(o.module), o.span, o.limit, o.groups_outside);
  }
}

void print_global_conflicts(const std::vector<GlobalConflict>& conflicts, const std::vector<std::string>& names) {
  for (const auto& c : conflicts) {
    out("  global range: {}: block scales need a global exponent in [{}, {}], the window allows [{}, {}]\n",
        printable(c.scale_group), c.needed_min, c.needed_max, c.allowed_min, c.allowed_max);
  }
  for (const auto& name : names) {
    const bool explained =
        std::any_of(conflicts.begin(), conflicts.end(), [&](const auto& c) { return c.scale_group == name; });
    if (!explained) out("  global scale of {} is not a normal FP32 number\n", printable(name));
  }
}

void print_counts(const Report& r) {
  out("  source   {}{}\n", printable(r.provenance.source),
             r.provenance.revision ? fmt::format(" (revision {})", printable(*r.provenance.revision)) : "");
  if (!r.provenance.target.empty()) out("  target   {}\n", printable(r.provenance.target));
  out("  modules  {} quantized modules, {} global scales (gate/up pairs share one), {} shards\n", r.modules,
             r.scale_groups, r.shards);
  out("  copied   {} pass-through tensors, {} companion files, byte for byte\n", r.passthrough_tensors,
             r.companion_files);
  if (r.active_groups && r.zero_groups && *r.active_groups + *r.zero_groups > 0) {
    out("  groups   {} active, {} all-zero", r.active_groups, r.zero_groups);
    if (r.command == Command::Convert && r.canonicalised_zero_groups) {
      out(" ({} zero-group scales canonicalised to 0x00)", r.canonicalised_zero_groups);
    }
    out("\n");
  }
  const auto bytes = [](const Measured<std::uint64_t>& n) { return n ? human_bytes(*n) : std::string("not written"); };
  if (r.source_tensor_bytes) {
    const auto change = r.size_change_percent();
    out("  size     {} -> {} tensor bytes{}\n", human_bytes(*r.source_tensor_bytes), bytes(r.target_tensor_bytes),
               change ? fmt::format(" ({:+.2f}%)", *change) : "");
  }
  if (r.copy_mode && r.written_bytes) {
    out("  output   {} shared with SRC, {} copied, {} written (--copy {})\n", bytes(r.shared_bytes),
               bytes(r.copied_bytes), bytes(r.written_bytes), choice_name(*r.copy_mode));
  }
}

void print_overspan(const Report& r) {
  for (const auto& m : r.requantized) {
    out("  LOSSY    {} requantized: relative RMSE {:.6g}, cosine {:.9f}, max abs error {:.6g}{}\n",
        printable(m.module), m.relative_rmse, m.cosine, m.max_abs_error,
        m.marlin_zeroed_blocks ? fmt::format(", {} block scales below 2^-6 (Marlin zeroes them)",
                                                    m.marlin_zeroed_blocks)
                                      : std::string());
  }
  for (const auto& l : r.bf16_layers) {
    std::string why;
    for (const auto& m : l.refused) why += (why.empty() ? "" : ", ") + printable(m);
    out("  BF16     {}: {} modules written as BF16 weight (exact), +{} bytes; over the window: {}\n",
        printable(l.layer), l.modules.size(), l.bf16_bytes - l.nvfp4_bytes, why.empty() ? "-" : why);
  }
}

void write_report(const std::optional<ReportFile>& file, const Report& report) {
  if (!file) return;
  flush_out();  // the summary first, when the report goes to /dev/stdout too
  file->write_pieces([&](const ReportFile::PieceSink& sink) {
    write_report_json(report, sink);
    sink("\n");
  });
}

void write_html(const std::optional<ReportFile>& file, const Report& report, const Inspection* inspection,
                unsigned threads) {
  if (!file) return;
  flush_out();  // likewise
  file->write(render_html_for(report, inspection, threads));
}

int finish(const Report& r, const std::optional<ReportFile>& report_file, const std::optional<ReportFile>& html_file,
           unsigned threads) {
  write_report(report_file, r);
  write_html(html_file, r, nullptr, threads);
  return r.exit_code();
}

}  // namespace mx2nv::cli
