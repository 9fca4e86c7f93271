// A front end that reaches past plan/'s face (cmake/check_layers.cmake refuses it).
#include "plan/overspan.hpp"
#include "plan/plan.hpp"
