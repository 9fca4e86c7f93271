// `mx2nv verify --merge`: joins the partial reports of `verify --shards I/N`
// (run on many machines) into the report of one whole verify. Pure logic on
// the JSON reports: they must be verify reports of the same SRC, DST, window
// and tool version, split the same N ways, with every part I in [0, N)
// present exactly once (or one whole report). Counts add up, the largest
// error wins, differences are joined without repeats. Any part in error makes
// the whole an error; any mismatch makes it a mismatch.
#pragma once

#include "core/report.hpp"

#include <vector>

namespace mx2nv {

// Throws Error(Usage) for parts that do not make one whole.
Json merge_verify_reports(const std::vector<Json>& parts);

}  // namespace mx2nv
