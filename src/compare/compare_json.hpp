// compare's JSON document (--json, --report FILE, Python's mx2nv.compare),
// schema in docs/compare.md: format, activations, totals, projections,
// modules, missing_in_other, extra_in_other, unquantized_in_other, exit_code.
// Totals are formed from the modules' sums; rel_rmse and cosine as
// compare/compare.hpp defines them.
#pragma once

#include "compare/compare.hpp"

#include <functional>
#include <string>
#include <string_view>

namespace mx2nv {

// "A16" (no module has an input scale), "A4" (every quantized module has
// one), "mixed" otherwise.
std::string compare_activations(const CompareResult& result);

// The totals of the modules whose projection is `projection` (gate, up,
// down, other); empty: all.
CompareSums compare_totals(const CompareResult& result, std::string_view projection = {});

// The document as text in pieces, in order: one line per top-level key and
// per module, so no more than one module's text is held at a time.
void write_compare_json(const CompareResult& result, const std::function<void(std::string_view)>& out);
// The same, whole (the Python package).
std::string compare_json_text(const CompareResult& result);

}  // namespace mx2nv
