#include "keygen_cmd.hpp"

#include <iostream>
#include <memory>
#include <string>

#include "tensorlane/config/key_file.hpp"

namespace tensorlane::tools {

void addKeygenCommand(CLI::App &app) {
    struct Options {
        std::string path;
        bool force = false;
    };
    auto opts = std::make_shared<Options>();
    auto *cmd = app.add_subcommand(
        "keygen",
        "write a new peer key file: 32 random bytes as tensorlane-key-v1:<64 hex digits>, "
        "mode 0600");
    cmd->add_option("FILE", opts->path, "the key file, e.g. /etc/tensorlane/peer.key")->required();
    cmd->add_flag("--force", opts->force,
                  "replace an existing file (every peer then needs the new one)");
    cmd->callback([opts] {
        const std::string error = config::writeNewKeyFile(opts->path, opts->force);
        if (!error.empty()) {
            std::cerr << "tensorlane keygen: " << error << "\n";
            throw CLI::RuntimeError(1);
        }
        std::cout << "tensorlane keygen: wrote a new peer key to " << opts->path << " (mode 0600)\n"
                  << "copy this file to every node that lists this one under [[peers]]; "
                     "[security] peer_key_file names it\n";
        throw CLI::Success();
    });
}

}  // namespace tensorlane::tools
