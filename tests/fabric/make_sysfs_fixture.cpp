// make_sysfs_fixture DIR: writes SysfsTree::standardHost() to DIR (for tests/scripts).
#include <iostream>

#include "sysfs_tree.hpp"

int main(int argc, char **argv) {
    if (argc != 2) {
        std::cerr << "usage: make_sysfs_fixture DIR\n";
        return 2;
    }
    const tensorlane::testing::SysfsTree tree{std::filesystem::path(argv[1])};
    tree.standardHost();
    return 0;
}
