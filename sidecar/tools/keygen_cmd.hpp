// `tensorlane keygen FILE [--force]`: writes a new peer key file (tensorlane-key-v1, mode 0600).
#pragma once

#include <CLI/CLI.hpp>

namespace tensorlane::tools {

/// Adds the `keygen` subcommand to `app`. It runs from its own parse callback and ends the
/// parse with CLI::Success or CLI::RuntimeError(exit code), which main's `app.exit(e)` returns
/// without printing, so registering it is the only line main needs.
void addKeygenCommand(CLI::App &app);

}  // namespace tensorlane::tools
