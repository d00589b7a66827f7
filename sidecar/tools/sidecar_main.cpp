// tensorlane-sidecar: the per-node daemon. Thin: parse the command line, load the config, run
// the engine in the foreground (systemd and Kubernetes run it so), log to stderr.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/engine.hpp"
#include "tensorlane/sidecar/metrics.hpp"
#include "tensorlane/sidecar/startup.hpp"
#include "tensorlane/sidecar/version.hpp"

namespace {

tensorlane::sidecar::Engine *g_engine = nullptr;

void onSignal(int) {
    if (g_engine) {
        g_engine->stop();
    }
}

int checkConfig(const std::string &path, bool json) {
    auto result = tensorlane::config::parseFile(path);
    if (!result.ok()) {
        // When only the key file is wrong, still show what the file resolves to (derived
        // traffic class, transport): that is what the operator is checking.
        auto structural = tensorlane::config::parseFile(path, {.check_key_file = false});
        if (structural.ok()) {
            auto choice = tensorlane::config::resolveTransport(
                *structural.config, tensorlane::sidecar::SysfsRoot::fromEnvironment().path());
            std::cout << (json ? tensorlane::config::describeJson(*structural.config, choice)
                               : tensorlane::config::describeText(*structural.config, choice))
                      << "\n";
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
    if (json) {
        using Json = nlohmann::ordered_json;
        Json j = Json::parse(tensorlane::config::describeJson(*result.config, report.transport));
        Json startup = Json::parse(tensorlane::sidecar::startupJson(report));
        j["fabric_selection"] = startup["fabric_selection"];
        startup.erase("fabric_selection");
        j["startup"] = std::move(startup);
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
    // The endpoint's address, as the start checks it (only a port in use is left for then).
    const tensorlane::sidecar::Status metrics =
        tensorlane::sidecar::checkMetricsListen(*result.config);
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
    spdlog::shutdown();  // writes out what the asynchronous loggers still hold
    return 0;
}
