// `tensorlane bench`: write latency and bandwidth through the sidecars, with baselines.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace tensorlane::tools {

/// Adds the `bench` subcommand to `app`; `*run` is set to what runs it once parsed.
void addBenchCommand(CLI::App &app, std::function<int()> *run);

}  // namespace tensorlane::tools
