// `tensorlane diag`: checks this host's RDMA fabric against the config (docs/fabric.md).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace tensorlane::tools {

/// Adds the `diag` subcommand to `app`; `*run` is set to what runs it once parsed.
void addDiagCommand(CLI::App &app, std::function<int()> *run);

}  // namespace tensorlane::tools
