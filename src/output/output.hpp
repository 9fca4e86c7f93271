// The face of output/: where a command's own output files go, checked before
// any work (report_file.hpp).
#pragma once

#include "output/report_file.hpp"
