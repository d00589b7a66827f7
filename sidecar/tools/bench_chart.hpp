// `tensorlane bench`: a PNG chart of bandwidth and latency against write size, drawn by gnuplot
// (Debian's gnuplot-nox, its pngcairo terminal). The chart is a by-product: when gnuplot is
// missing or fails, the bench says so and still succeeds.
#pragma once

#include <string>
#include <vector>

#include "bench_report.hpp"

namespace tensorlane::tools::bench {

/// What became of the chart.
struct ChartOutcome {
    bool written = false;
    /// One line for the user: where it went, or why there is none and how to get one.
    std::string message;
};

/// The chart's file for `--chart` / `--csv`: `chart` when given; else beside the CSV (its name
/// with .csv replaced by .png, or .png appended); empty when there is neither (or the CSV goes
/// to stdout).
std::string chartPath(const std::string &chart, const std::string &csv);

/// The gnuplot script that draws `results` into `png_path` (data inline, no other file).
std::string gnuplotScript(const std::string &png_path, const RunInfo &info,
                          const std::vector<SizeResult> &results);

/// Draws the chart with the `gnuplot` found in PATH. Writes to a temporary name beside
/// `png_path` and renames it only once it is a PNG, so a failure leaves no partial file.
ChartOutcome writeChart(const std::string &png_path, const RunInfo &info,
                        const std::vector<SizeResult> &results);

}  // namespace tensorlane::tools::bench
