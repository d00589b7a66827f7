// Configs for the fabric tests.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "tensorlane/config/config.hpp"

namespace tensorlane::testing {

/// Parses `fabric_lines` as the [fabric] table of an otherwise default file (no key check).
inline config::Config fabricConfig(std::string_view fabric_lines, std::string_view extra = "") {
    const std::string text = "[node]\nname = \"node-a\"\n\n[fabric]\n" + std::string(fabric_lines) +
                             "\n" + std::string(extra);
    auto r = config::parseString(text, "test.toml", {.check_key_file = false});
    EXPECT_TRUE(r.ok()) << (r.errors.empty() ? "" : r.errors.front().text());
    return r.config.value_or(config::Config{});
}

}  // namespace tensorlane::testing
