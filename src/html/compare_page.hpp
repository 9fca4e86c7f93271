// compare --html FILE: one self-contained page (inline CSS and SVG, no
// script) from a compare result: the totals, a line per projection, a
// layers x experts heatmap of relative RMSE per projection, the worst
// modules, and what is missing, extra or unquantized. Pure: it reads and
// writes no files; the front ends write the page.
#pragma once

#include "compare/compare.hpp"

#include <string>

namespace mx2nv {

std::string render_compare_html(const CompareResult& result);

}  // namespace mx2nv
