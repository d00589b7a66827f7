// The checks the sidecar makes before it starts, shared with `tensorlane-sidecar --check-config`
// so that whatever start would refuse, the check refuses too: the peer key, the transport and
// the fabric it needs, and the preflight ([fabric] preflight).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/diag.hpp"
#include "tensorlane/sidecar/fabric.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

/// What checkStartup found.
struct StartupReport {
    /// resolveTransport's answer for this host.
    config::TransportChoice transport;
    /// What remote peers will use: verbs, or tcp when auto falls back.
    config::TransportKind peer_transport = config::TransportKind::kTcp;
    /// The fabric selection, when the transport resolves to verbs and it succeeded.
    std::optional<FabricSelection> fabric;
    /// selectFabric's error, when the transport resolves to verbs and it failed.
    std::string fabric_error;
    /// Whether the preflight (runDiag) ran: when the transport resolves to verbs.
    bool preflight_ran = false;
    /// Its findings.
    std::vector<Finding> preflight;
    /// Each of these stops the sidecar.
    std::vector<std::string> errors;
    /// Logged at start; the sidecar starts anyway.
    std::vector<std::string> warnings;

    bool ok() const { return errors.empty(); }
    /// kInvalid with every error, "; "-joined; ok when there is none.
    [[nodiscard]] Status status() const;
};

/// Runs the start checks against `root` and `env` (tests pass fixtures). Never throws.
StartupReport checkStartup(const config::Config &cfg, const SysfsRoot &root,
                           const DiagEnvironment &env);
/// The same on this host: SysfsRoot::fromEnvironment() and DiagEnvironment::host().
StartupReport checkStartup(const config::Config &cfg);

/// Logs the selection and its reasons (info), the warnings (warn) and the errors (error) on
/// the "tensorlane.sidecar.fabric" logger.
void logStartupReport(const StartupReport &report);
/// The report as text for --check-config: a "[fabric selection]" block when there is one.
/// No final newline; empty when there is nothing to show.
std::string startupText(const StartupReport &report);
/// The report as a JSON object: ok, peer_transport, fabric_selection (selectionJson, or null
/// when the transport is not verbs), preflight findings, errors, warnings. No final newline.
std::string startupJson(const StartupReport &report);

}  // namespace tensorlane::sidecar
