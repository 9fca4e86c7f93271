// The face of html/: the pages mx2nv writes with --html, for the front ends.
#pragma once

#include "html/compare_page.hpp"
#include "html/html_report.hpp"
