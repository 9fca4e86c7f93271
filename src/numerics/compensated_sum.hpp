// Neumaier's compensated summation: a sum of many doubles within a few ulps
// of the exact sum, whatever their order and magnitudes (compare's figures;
// its oracle's math.fsum is the exact sum, rounded once).
#pragma once

#include <cmath>

namespace mx2nv {

struct CompensatedSum {
  double sum = 0, compensation = 0;
  void add(double x) {
    const double t = sum + x;
    compensation += std::fabs(sum) >= std::fabs(x) ? (sum - t) + x : (x - t) + sum;
    sum = t;
  }
  double value() const { return sum + compensation; }
};

}  // namespace mx2nv
