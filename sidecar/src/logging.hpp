// The sidecar's loggers: one named logger per part ("tensorlane.sidecar", "...peer", ...), all
// asynchronous over one stderr sink, so a slow stderr (a pipe nobody reads fast, a journal under
// load) never blocks the engine thread: when the queue is full the oldest messages are dropped,
// never the engine delayed.
#pragma once

#include "spdlog_headers.hpp"  // first: fmt under its pragma

#include <memory>
#include <string_view>

namespace tensorlane::sidecar {

/// "tensorlane.sidecar" for an empty `part`, else "tensorlane.sidecar.<part>"; created on first
/// use (asynchronous, stderr) unless someone registered that name before.
std::shared_ptr<spdlog::logger> sidecarLogger(std::string_view part = {});

/// Writes out every queued message (call before the process exits).
void flushLogs();

}  // namespace tensorlane::sidecar
