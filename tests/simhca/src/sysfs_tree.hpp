// Reading and writing the sysfs-shaped tree named by TENSORLANE_SYSFS_ROOT. The layout is that of
// /sys (Documentation/ABI/stable/sysfs-class-infiniband), so one tree describes one host for the
// simulator, the sidecar's fabric discovery and `tensorlane diag`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tensorlane::simhca {

/// The environment variable naming the tree (unset or empty: no simulated devices).
constexpr const char *kSysfsRootEnv = "TENSORLANE_SYSFS_ROOT";

/// The tree's root, or an empty string when the variable is unset.
[[nodiscard]] std::string sysfsRoot();

/// A file's contents without the trailing newline, or nullopt when it cannot be read.
[[nodiscard]] std::optional<std::string> readTrimmed(const std::string &path);

/// Replaces a file's contents through a temporary and rename(2), so readers never see a torn
/// value (sysfs attributes are read whole).
bool writeAtomically(const std::string &path, const std::string &contents);

/// The names in a directory, sorted, without "." and ".."; empty when it cannot be read.
[[nodiscard]] std::vector<std::string> listDirectory(const std::string &path);

/// Parses a leading decimal or 0x-prefixed integer ("4: ACTIVE" gives 4).
[[nodiscard]] std::optional<uint64_t> parseLeadingInt(const std::string &s);

}  // namespace tensorlane::simhca
