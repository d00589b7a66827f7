// SysfsRoot: the directory every sysfs read of tensorlane is relative to: /sys, or
// $TENSORLANE_SYSFS_ROOT (the tree the simulated HCA reads too), or an explicit directory
// (`tensorlane diag --sysfs-root`, tests' fixture trees). The config's transport resolution and
// the sidecar's fabric discovery both read through it. Files only: no libibverbs.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tensorlane::config {

/// The directory every sysfs read is relative to. Cheap to copy.
class SysfsRoot {
public:
    /// The environment variable that replaces /sys for the sidecar and the simulated HCA.
    static constexpr const char *kEnvVar = "TENSORLANE_SYSFS_ROOT";

    /// Reads below `root` (a directory such as "/sys" or a fixture tree).
    explicit SysfsRoot(std::string root);
    /// $TENSORLANE_SYSFS_ROOT when set and not empty, else /sys.
    static SysfsRoot fromEnvironment();

    /// The root directory itself.
    const std::string &path() const { return root_; }
    /// The absolute path of `rel` ("class/infiniband") below the root.
    std::string pathOf(std::string_view rel) const;
    /// The file's content with trailing whitespace removed; nullopt when it cannot be read:
    /// missing, a directory, a dangling link, or a read that fails (sysfs answers EINVAL for
    /// unpopulated GID attributes, and in containers for entries of other namespaces).
    std::optional<std::string> read(std::string_view rel) const;
    /// Entry names of a directory, sorted (numerically when all are numbers); empty when it is
    /// missing or unreadable.
    std::vector<std::string> list(std::string_view rel) const;
    /// Whether `rel` exists (a dangling link does not).
    bool exists(std::string_view rel) const;
    /// Whether `rel` is itself present, even as a dangling link or an unreadable entry.
    bool present(std::string_view rel) const;
    /// Where a link such as "class/infiniband/mlx5_0/device" leads, as a path relative to the
    /// root ("devices/pci0000:00/0000:00:02.0/0000:03:00.0"); nullopt when it does not resolve
    /// inside the root.
    std::optional<std::string> resolve(std::string_view rel) const;

private:
    std::string root_;
};

}  // namespace tensorlane::config
