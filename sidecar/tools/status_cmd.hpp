// `tensorlane status [--json] [--watch [--interval S] [--count N]]`: a running sidecar's state
// and counters, once or refreshed like top.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace tensorlane::tools {

/// Adds the `status` verb; `*run` is set when it was given.
void addStatusCommand(CLI::App &app, std::function<int()> *run);

}  // namespace tensorlane::tools
