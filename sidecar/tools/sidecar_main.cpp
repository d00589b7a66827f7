// tensorlane-sidecar: the per-node daemon. Thin: parse the command line, load the config, run
// the engine in the foreground (systemd and Kubernetes run it so), log to stderr.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/engine.hpp"

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
            auto choice = tensorlane::config::resolveTransport(*structural.config);
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
    auto choice = tensorlane::config::resolveTransport(*result.config);
    std::cout << (json ? tensorlane::config::describeJson(*result.config, choice)
                       : tensorlane::config::describeText(*result.config, choice))
              << "\n";
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
                   "validate FILE, print the resolved configuration, exit 0 (ok) or 2 (errors)");
    app.add_flag("--json", json, "with --check-config: print JSON");
    app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError &e) {
        return app.exit(e);
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
