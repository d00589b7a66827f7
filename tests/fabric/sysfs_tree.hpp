// A sysfs-shaped fixture tree in a temporary directory, in the kernel's real layout and formats
// (the simulated HCA reads the same layout), for the fabric tests and the script tests.
#pragma once

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tensorlane::testing {

/// Builds the tree. Paths are relative to the root, as in sysfs ("class/infiniband/mlx5_0").
class SysfsTree {
public:
    /// A fresh tree under TMPDIR, removed with everything in it on destruction (unless kept).
    SysfsTree() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "tl-sysfs-XXXXXX").string();
        if (::mkdtemp(tmpl.data()) == nullptr) {
            throw std::runtime_error("mkdtemp failed");
        }
        root_ = tmpl;
    }
    /// A tree at `dir` (created), kept after destruction: for make_sysfs_fixture.
    explicit SysfsTree(const std::filesystem::path &dir) : root_(dir), keep_(true) {
        std::filesystem::create_directories(root_);
    }
    ~SysfsTree() {
        if (!keep_) {
            std::error_code ec;
            std::filesystem::remove_all(root_, ec);
        }
    }
    SysfsTree(const SysfsTree &) = delete;
    SysfsTree &operator=(const SysfsTree &) = delete;

    const std::filesystem::path &root() const { return root_; }
    std::string rootString() const { return root_.string(); }

    /// Writes a file (sysfs attributes end in a newline).
    void write(const std::string &rel, std::string_view content) const {
        const std::filesystem::path p = root_ / rel;
        std::error_code ec;
        std::filesystem::remove_all(p, ec);
        std::filesystem::create_directories(p.parent_path());
        std::ofstream(p, std::ios::binary) << content << "\n";
    }
    /// A relative symlink at `rel` to `target_rel`, as sysfs links are.
    void link(const std::string &rel, const std::string &target_rel) const {
        const std::filesystem::path p = root_ / rel;
        std::error_code ec;
        std::filesystem::remove_all(p, ec);
        std::filesystem::create_directories(p.parent_path());
        std::filesystem::create_directory_symlink(
            (root_ / target_rel).lexically_relative(p.parent_path()), p);
    }
    /// An entry that exists but cannot be read as a file (a directory), as sysfs entries that
    /// fail with EINVAL in containers.
    void unreadable(const std::string &rel) const {
        std::error_code ec;
        std::filesystem::remove_all(root_ / rel, ec);
        std::filesystem::create_directories(root_ / rel);
    }
    /// A dangling symlink at `rel`.
    void dangling(const std::string &rel) const {
        const std::filesystem::path p = root_ / rel;
        std::error_code ec;
        std::filesystem::remove_all(p, ec);
        std::filesystem::create_directories(p.parent_path());
        std::filesystem::create_symlink("does-not-exist", p);
    }
    void remove(const std::string &rel) const {
        std::error_code ec;
        std::filesystem::remove_all(root_ / rel, ec);
    }

    /// A PCI function at `pci_path` ("devices/pci0000:00/0000:00:01.0/0000:03:00.0") with its
    /// bus/pci/devices/<bdf> link.
    void addPci(const std::string &pci_path, const std::string &vendor = "0x15b3",
                const std::string &cls = "0x020000", int numa = 0) const {
        write(pci_path + "/vendor", vendor);
        write(pci_path + "/class", cls);
        write(pci_path + "/numa_node", std::to_string(numa));
        const std::string bdf = pci_path.substr(pci_path.rfind('/') + 1);
        link("bus/pci/devices/" + bdf, pci_path);
    }
    /// An RDMA device on the PCI function at `pci_path` (empty: no device link).
    void addDevice(const std::string &name, const std::string &pci_path) const {
        const std::string base = "class/infiniband/" + name;
        write(base + "/node_guid", "0c42:a103:0065:1a2b");
        write(base + "/fw_ver", "22.39.1002");
        write(base + "/hca_type", "MT4125");
        write(base + "/node_type", "1: CA");
        if (!pci_path.empty()) {
            if (!std::filesystem::exists(root_ / pci_path)) {
                addPci(pci_path);
            }
            link(base + "/device", pci_path);
        }
    }
    void addPort(const std::string &dev, int port, const std::string &state = "4: ACTIVE",
                 const std::string &phys = "5: LinkUp",
                 const std::string &link_layer = "Ethernet") const {
        const std::string base = portDir(dev, port);
        write(base + "/state", state);
        write(base + "/phys_state", phys);
        write(base + "/link_layer", link_layer);
        write(base + "/rate", "100 Gb/sec (4X EDR)");
    }
    /// One GID table entry; `type` "RoCE v2" or "IB/RoCE v1".
    void addGid(const std::string &dev, int port, int index, const std::string &gid,
                const std::string &type, const std::string &ndev) const {
        const std::string base = portDir(dev, port);
        const std::string i = std::to_string(index);
        write(base + "/gids/" + i, gid);
        write(base + "/gid_attrs/types/" + i, type);
        write(base + "/gid_attrs/ndevs/" + i, ndev);
    }
    /// An unpopulated entry: a zero GID whose attributes fail to read (EINVAL in the kernel).
    void addEmptyGid(const std::string &dev, int port, int index) const {
        const std::string base = portDir(dev, port);
        const std::string i = std::to_string(index);
        write(base + "/gids/" + i, "0000:0000:0000:0000:0000:0000:0000:0000");
        unreadable(base + "/gid_attrs/types/" + i);
        unreadable(base + "/gid_attrs/ndevs/" + i);
    }
    /// A netdev; `pci_path` empty for a virtual one.
    void addNetdev(const std::string &name, const std::string &pci_path, int mtu = 9000,
                   const std::string &operstate = "up") const {
        const std::string base = "class/net/" + name;
        write(base + "/mtu", std::to_string(mtu));
        write(base + "/operstate", operstate);
        write(base + "/address", "0c:42:a1:65:1a:2b");
        if (!pci_path.empty()) {
            link(base + "/device", pci_path);
        }
    }
    void setCounter(const std::string &dev, int port, const std::string &name,
                    uint64_t value) const {
        write(portDir(dev, port) + "/hw_counters/" + name, std::to_string(value));
    }
    void setEcn(const std::string &netdev, int prio, bool np, bool rp) const {
        write("class/net/" + netdev + "/ecn/roce_np/enable/" + std::to_string(prio),
              np ? "1" : "0");
        write("class/net/" + netdev + "/ecn/roce_rp/enable/" + std::to_string(prio),
              rp ? "1" : "0");
    }
    /// The mlx5 host-wide traffic class file: "Global tclass=N", or empty when `value` < 0.
    void setTclassOverride(const std::string &dev, int port, int value) const {
        write("class/infiniband/" + dev + "/tc/" + std::to_string(port) + "/traffic_class",
              value < 0 ? std::string() : "Global tclass=" + std::to_string(value));
    }

    static std::string portDir(const std::string &dev, int port) {
        return "class/infiniband/" + dev + "/ports/" + std::to_string(port);
    }

    /// The NIC of standardHost().
    static constexpr const char *kNicPci =
        "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0";

    /// One ConnectX port up on eth0 (MTU 9000, 10.0.0.2): GIDs 0 fe80 v1, 1 fe80 v2,
    /// 2 10.0.0.2 v1, 3 10.0.0.2 v2, 4-7 empty; counters; ECN on for priority 3.
    void standardHost() const {
        addDevice("mlx5_0", kNicPci);
        addPort("mlx5_0", 1);
        addNetdev("eth0", kNicPci);
        const std::string ll = "fe80:0000:0000:0000:0e42:a1ff:fe65:1a2b";
        const std::string v4 = "0000:0000:0000:0000:0000:ffff:0a00:0002";
        addGid("mlx5_0", 1, 0, ll, "IB/RoCE v1", "eth0");
        addGid("mlx5_0", 1, 1, ll, "RoCE v2", "eth0");
        addGid("mlx5_0", 1, 2, v4, "IB/RoCE v1", "eth0");
        addGid("mlx5_0", 1, 3, v4, "RoCE v2", "eth0");
        for (int i = 4; i < 8; ++i) {
            addEmptyGid("mlx5_0", 1, i);
        }
        for (const char *c : {"np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled",
                              "out_of_sequence", "packet_seq_err", "local_ack_timeout_err"}) {
            setCounter("mlx5_0", 1, c, 0);
        }
        setEcn("eth0", 3, true, true);
        write("module/nvidia_peermem/refcnt", "0");
    }

private:
    std::filesystem::path root_;
    bool keep_ = false;
};

}  // namespace tensorlane::testing
