// tensorlane-sidecar: the per-node daemon. Thin: parse the command line, load the config, run
// the engine in the foreground (systemd and Kubernetes run it so), log to stderr.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <utility>

#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/engine.hpp"
#include "tensorlane/sidecar/metrics.hpp"
#include "tensorlane/sidecar/startup.hpp"
#include "tensorlane/sidecar/trace.hpp"
#include "tensorlane/sidecar/version.hpp"

namespace {

tensorlane::sidecar::Engine *g_engine = nullptr;

void onSignal(int) {
    if (g_engine) {
        g_engine->stop();
    }
}

using Json = nlohmann::ordered_json;

/// One config error for `--check-config --json`: where, which key, what is wrong, what to do.
Json errorJson(const tensorlane::config::Error &e) {
    return Json{{"file", e.file},   {"line", e.line},      {"column", e.column},
                {"key", e.key},     {"message", e.text()}, {"expected", e.expected},
                {"found", e.found}, {"fix", e.fix()}};
}

/// The key and the next step for one of the start checks' errors (they are sentences that begin
/// with what they are about: checkStartup in sidecar/src/fabric/startup.cpp).
std::pair<std::string, std::string> startupErrorFix(const std::string &e) {
    const auto starts = [&e](std::string_view p) { return e.rfind(p, 0) == 0; };
    if (starts("[security] peer_key_file") || starts("[[peers]]")) {
        return {starts("[[peers]]") ? "peers.key_file" : "security.peer_key_file",
                "write the key with `tensorlane keygen FILE` (mode 0600), the same file on every "
                "node"};
    }
    if (starts("[fabric] transport")) {
        return {"fabric.transport",
                "make the RDMA port usable (`tensorlane diag --config FILE` says how), or set "
                "[fabric] transport = \"tcp\""};
    }
    if (starts("preflight")) {
        return {"fabric.preflight",
                "do what the finding's fix says, or set [fabric] preflight = \"warn\""};
    }
    return {"", "see startup.preflight and fabric_selection"};
}

int checkConfig(const std::string &path, bool json) {
    auto result = tensorlane::config::parseFile(path);
    if (!result.ok()) {
        // When only the key file is wrong, still show what the file resolves to (derived
        // traffic class, transport): that is what the operator is checking.
        auto structural = tensorlane::config::parseFile(path, {.check_key_file = false});
        std::optional<tensorlane::config::TransportChoice> choice;
        if (structural.ok()) {
            choice = tensorlane::config::resolveTransport(
                *structural.config, tensorlane::sidecar::SysfsRoot::fromEnvironment().path());
        }
        if (json) {
            // One document on stdout whatever went wrong, so that a tool reading it always has
            // something to parse: the errors, and the resolved values where the file has them.
            Json j =
                choice ? Json::parse(tensorlane::config::describeJson(*structural.config, *choice))
                       : Json{{"source", path}};
            j["ok"] = false;
            Json errors = Json::array();
            for (const auto &e : result.errors) {
                errors.push_back(errorJson(e));
            }
            j["errors"] = std::move(errors);
            std::cout << j.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
        } else if (choice) {
            std::cout << tensorlane::config::describeText(*structural.config, *choice) << "\n";
        }
        for (const auto &e : result.errors) {
            std::cerr << e.text() << "\n";
        }
        std::cerr << path << ": " << result.errors.size() << " error(s)\n";
        return 2;
    }
    // The same checks the sidecar makes at start (key content, transport, fabric, preflight),
    // so that a file that passes here does not fail there.
    const tensorlane::sidecar::StartupReport report =
        tensorlane::sidecar::checkStartup(*result.config);
    // The endpoint's address, as the start checks it (only a port in use is left for then).
    const tensorlane::sidecar::Status metrics =
        tensorlane::sidecar::checkMetricsListen(*result.config);
    if (json) {
        Json j = Json::parse(tensorlane::config::describeJson(*result.config, report.transport));
        Json startup = Json::parse(tensorlane::sidecar::startupJson(report));
        j["fabric_selection"] = startup["fabric_selection"];
        startup.erase("fabric_selection");
        j["startup"] = std::move(startup);
        // The same two keys as a file with errors has: ok is what the exit status says.
        j["ok"] = report.ok() && metrics.isOk();
        Json errors = Json::array();
        if (!metrics.isOk()) {
            errors.push_back({{"file", path},
                              {"line", 0},
                              {"column", 0},
                              {"key", "metrics.listen"},
                              {"message", metrics.message()},
                              {"fix", "give [metrics] listen an address this host can serve"}});
        }
        for (const auto &e : report.errors) {
            const auto [key, fix] = startupErrorFix(e);
            errors.push_back({{"file", path},
                              {"line", 0},
                              {"column", 0},
                              {"key", key},
                              {"message", e},
                              {"fix", fix}});
        }
        j["errors"] = std::move(errors);
        std::cout << j.dump(2) << "\n";
    } else {
        std::cout << tensorlane::config::describeText(*result.config, report.transport);
        const std::string fabric = tensorlane::sidecar::startupText(report);
        std::cout << (fabric.empty() ? "" : "\n" + fabric) << "\n";
    }
    for (const auto &w : report.warnings) {
        std::cerr << path << ": warning: " << w << "\n";
    }
    for (const auto &e : report.errors) {
        std::cerr << path << ": " << e << "\n";
    }
    if (!metrics.isOk()) {
        std::cerr << path << ": " << metrics.message() << "\n";
    }
    if (!report.ok() || !metrics.isOk()) {
        std::cerr << path << ": " << report.errors.size() + (metrics.isOk() ? 0 : 1)
                  << " error(s): the sidecar would refuse to start\n";
        return 2;
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    CLI::App app{"tensorlane-sidecar: moves tensors between nodes for the workers of this node"};
    std::string config_path;
    std::string check_path;
    bool json = false;
    std::string log_level = "info";
    app.add_option("--config", config_path, "the node's TOML configuration")
        ->check(CLI::ExistingFile);
    app.add_option("--check-config", check_path,
                   "validate FILE and run the start checks (peer key, transport, fabric selection, "
                   "preflight); print the resolved configuration; exit 0 (ok) or 2 (errors)");
    app.add_flag("--json", json, "with --check-config: print JSON");
    app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
    app.set_version_flag("--version", tensorlane::sidecar::versionText("tensorlane-sidecar"),
                         "print the release, commit, wire protocol versions and built-in parts");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError &e) {
        // --help prints and exits 0; every usage error exits 2 (CLI11's own codes are > 100).
        return app.exit(e) == 0 ? 0 : 2;
    }
    if (!check_path.empty()) {
        return checkConfig(check_path, json);
    }
    if (config_path.empty()) {
        std::cerr << "tensorlane-sidecar: --config FILE is required (or --check-config FILE)\n";
        return 2;
    }
    spdlog::set_level(spdlog::level::from_str(log_level));
    auto parsed = tensorlane::config::parseFile(config_path);
    if (!parsed.ok()) {
        for (const auto &e : parsed.errors) {
            std::cerr << e.text() << "\n";
        }
        return 2;
    }
    // What --check-config checks, refused here the same way (and logged: the fabric selection
    // and its reasons, the preflight's warnings).
    const tensorlane::sidecar::StartupReport report =
        tensorlane::sidecar::checkStartup(*parsed.config);
    tensorlane::sidecar::logStartupReport(report);
    if (!report.ok()) {
        spdlog::shutdown();  // the asynchronous loggers write out the reasons first
        std::cerr << "tensorlane-sidecar: refusing to start: " << report.status().message() << "\n";
        return 1;
    }
    // Before the engine's threads start; said in the log once the engine's logger is up.
    const std::string trace = tensorlane::sidecar::startTrace(parsed.config->node.name);
    tensorlane::sidecar::Status st;
    auto engine = tensorlane::sidecar::Engine::create(*parsed.config, &st);
    if (!engine) {
        std::cerr << "tensorlane-sidecar: " << st.message() << "\n";
        return 1;
    }
    st = engine->start();
    if (!st.isOk()) {
        std::cerr << "tensorlane-sidecar: " << st.message() << "\n";
        return 1;
    }
    if (!trace.empty()) {
        spdlog::get("tensorlane.sidecar")->info("tracing steps into {}.{}", trace, ::getpid());
    }
    g_engine = engine.get();
    struct sigaction sa {};
    sa.sa_handler = onSignal;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);
    engine->run();
    g_engine = nullptr;
    spdlog::get("tensorlane.sidecar")->info("stopped");
    engine.reset();
    tensorlane::sidecar::writeTrace();
    spdlog::shutdown();  // writes out what the asynchronous loggers still hold
    return 0;
}
