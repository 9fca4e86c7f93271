// The face of json/ for the front ends: the JSON document type and its text.
#pragma once

#include "json/strict_json.hpp"
