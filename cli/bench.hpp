#pragma once
#include <string>
#include <vector>

namespace flashvk::cli {

/// `flashvk bench`: GPU time (timestamp queries, median of --repeat runs after a warm-up),
/// GFLOP/s and device memory per variant, printed as a table and optionally written as JSON.
int cmd_bench(const std::vector<std::string>& argv);

}  // namespace flashvk::cli
