// Helpers shared by the config tests.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "tensorlane/config/config.hpp"

namespace tensorlane::config::testing {

/// Parses `text` as "test.toml" without the key file check (its path is host-specific).
inline ParseResult parse(std::string_view text) {
    return parseString(text, "test.toml", ParseOptions{.check_key_file = false});
}

/// The errors of a result, one text() per line, for failure messages.
inline std::string allErrors(const ParseResult &r) {
    std::string out;
    for (const auto &e : r.errors) {
        out += e.text() + "\n";
    }
    return out;
}

/// Expects exactly one error and returns it (a default Error when there is none).
inline Error onlyError(const ParseResult &r) {
    EXPECT_FALSE(r.ok());
    EXPECT_FALSE(r.config.has_value());
    EXPECT_EQ(r.errors.size(), 1u) << allErrors(r);
    return r.errors.empty() ? Error{} : r.errors.front();
}

/// A directory under TMPDIR removed with everything in it when the test ends.
class TempDir {
public:
    TempDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "tl-config-XXXXXX").string();
        if (::mkdtemp(tmpl.data()) == nullptr) {
            ADD_FAILURE() << "mkdtemp failed";
        }
        path_ = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir &) = delete;
    TempDir &operator=(const TempDir &) = delete;

    const std::filesystem::path &path() const { return path_; }

    /// Writes `content` to `rel` (creating parent directories) with `mode`; returns the path.
    std::string write(const std::string &rel, std::string_view content, mode_t mode = 0600) const {
        const std::filesystem::path p = path_ / rel;
        std::filesystem::create_directories(p.parent_path());
        std::ofstream(p, std::ios::binary) << content;
        // chmod, not the umask-filtered create mode, so the permission tests get exact bits.
        ::chmod(p.c_str(), mode);
        return p.string();
    }

private:
    std::filesystem::path path_;
};

}  // namespace tensorlane::config::testing
