// tensorlane: the operator's command line (status, bench, diag, keygen).
#include <CLI/CLI.hpp>
#include <functional>
#include <iostream>

#include "bench.hpp"
#include "diag_cmd.hpp"
#include "keygen_cmd.hpp"
#include "status_cmd.hpp"
#include "tensorlane/sidecar/version.hpp"

int main(int argc, char **argv) {
    CLI::App app{"tensorlane: inspect and measure the tensorlane sidecars"};
    // At most one verb; none is answered below with the list of verbs (CLI11's own message,
    // "A subcommand is required", names none of them).
    app.require_subcommand(0, 1);
    app.footer("Run `tensorlane VERB --help` for what a verb takes.");
    app.set_version_flag("--version", tensorlane::sidecar::versionText("tensorlane"),
                         "print the release, commit, wire protocol versions and built-in parts");

    std::function<int()> run_status;
    tensorlane::tools::addStatusCommand(app, &run_status);
    std::function<int()> run_bench;
    tensorlane::tools::addBenchCommand(app, &run_bench);
    std::function<int()> run_diag;
    tensorlane::tools::addDiagCommand(app, &run_diag);
    tensorlane::tools::addKeygenCommand(app);

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError &e) {
        // --help prints and exits 0; every usage error exits 2 (CLI11's own codes are > 100).
        return app.exit(e) == 0 ? 0 : 2;
    }
    if (run_status) {
        return run_status();
    }
    if (run_bench) {
        return run_bench();
    }
    if (run_diag) {
        return run_diag();
    }
    std::cerr << "tensorlane: a verb is required:";
    for (const CLI::App *sub : app.get_subcommands({})) {
        std::cerr << " " << sub->get_name();
    }
    std::cerr << "\nRun `tensorlane --help` or `tensorlane VERB --help` for more.\n";
    return 2;
}
