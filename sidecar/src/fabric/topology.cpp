// Devices, ports and netdevs from sysfs, and the PCIe distance between two PCI functions.
#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "fabric/internal.hpp"
#include "tensorlane/sidecar/fabric.hpp"

namespace tensorlane::sidecar {

namespace {

/// "4: ACTIVE" -> "ACTIVE"; "5: LinkUp" -> "LinkUp" (ib_port_state / phys state number, name).
std::string stateName(const std::optional<std::string> &raw) {
    if (!raw) {
        return "unreadable";
    }
    const size_t colon = raw->find(':');
    std::string s = colon == std::string::npos ? *raw : raw->substr(colon + 1);
    const size_t first = s.find_first_not_of(" \t");
    return first == std::string::npos ? std::string("empty") : s.substr(first);
}

/// Path components of "devices/pci0000:00/0000:00:01.0/0000:03:00.0".
std::vector<std::string> components(const std::string &path) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= path.size()) {
        const size_t slash = path.find('/', start);
        const size_t end = slash == std::string::npos ? path.size() : slash;
        if (end > start) {
            out.push_back(path.substr(start, end - start));
        }
        if (slash == std::string::npos) {
            break;
        }
        start = slash + 1;
    }
    return out;
}

}  // namespace

const PortInfo *DeviceInfo::findPort(uint32_t port) const {
    for (const PortInfo &p : ports) {
        if (p.port == port) {
            return &p;
        }
    }
    return nullptr;
}

std::optional<DeviceInfo> readDevice(const SysfsRoot &root, const std::string &name) {
    const std::string base = "class/infiniband/" + name;
    if (!root.exists(base)) {
        return std::nullopt;
    }
    DeviceInfo d;
    d.name = name;
    d.node_guid = root.read(base + "/node_guid").value_or("");
    d.fw_ver = root.read(base + "/fw_ver").value_or("");
    d.hca_type = root.read(base + "/hca_type").value_or("");
    d.pci_path = root.resolve(base + "/device").value_or("");
    for (const std::string &p : root.list(base + "/ports")) {
        char *end = nullptr;
        const unsigned long num = std::strtoul(p.c_str(), &end, 10);
        if (p.empty() || *end != '\0' || num == 0 || num > 255) {
            continue;
        }
        const std::string pb = base + "/ports/" + p;
        PortInfo port;
        port.port = static_cast<uint32_t>(num);
        port.state = stateName(root.read(pb + "/state"));
        port.phys_state = stateName(root.read(pb + "/phys_state"));
        port.link_layer = root.read(pb + "/link_layer").value_or("");
        port.rate = root.read(pb + "/rate").value_or("");
        d.ports.push_back(std::move(port));
    }
    return d;
}

bool isPciFunctionPath(const std::string &rel) {
    if (rel.rfind("devices/", 0) != 0) {
        return false;
    }
    const std::string_view last = std::string_view(rel).substr(rel.rfind('/') + 1);
    // "0000:03:00.0": 4 hex, ':', 2 hex, ':', 2 hex, '.', one function digit 0-7.
    if (last.size() != 12 || last[4] != ':' || last[7] != ':' || last[10] != '.' ||
        last[11] < '0' || last[11] > '7') {
        return false;
    }
    for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9}) {
        if (std::isxdigit(static_cast<unsigned char>(last[i])) == 0) {
            return false;
        }
    }
    return true;
}

uint64_t rateMbps(const std::string &rate) {
    // ib_sysfs's rate_show(): "%d%s Gb/sec (%dX %s)", the fraction ".5" for SDR's 2.5.
    char *end = nullptr;
    const double gbps = std::strtod(rate.c_str(), &end);
    if (end == rate.c_str() || !(gbps > 0) || gbps > 1e5 || std::strncmp(end, " Gb/sec", 7) != 0) {
        return 0;
    }
    return static_cast<uint64_t>(gbps * 1000 + 0.5);
}

std::vector<DeviceInfo> listDevices(const SysfsRoot &root) {
    std::vector<DeviceInfo> out;
    for (const std::string &name : root.list("class/infiniband")) {
        if (auto d = readDevice(root, name)) {
            out.push_back(std::move(*d));
        }
    }
    return out;
}

NetdevInfo readNetdev(const SysfsRoot &root, const std::string &name) {
    NetdevInfo n;
    n.name = name;
    const std::string base = "class/net/" + name;
    n.exists = !name.empty() && name.find('/') == std::string::npos && root.exists(base);
    if (!n.exists) {
        return n;
    }
    if (const auto mtu = root.read(base + "/mtu")) {
        char *end = nullptr;
        const unsigned long v = std::strtoul(mtu->c_str(), &end, 10);
        if (!mtu->empty() && *end == '\0' && v > 0 && v <= 1u << 20) {
            n.mtu = static_cast<uint32_t>(v);
        }
    }
    n.operstate = root.read(base + "/operstate").value_or("");
    n.address = root.read(base + "/address").value_or("");
    n.pci_path = root.resolve(base + "/device").value_or("");
    return n;
}

bool isOverlayNetdev(std::string_view name) {
    // Interfaces that container runtimes, CNI plugins and hypervisors create: a GID on them
    // belongs to a container's or a VM's address, never to the host's fabric address.
    static constexpr std::array<std::string_view, 18> kPrefixes = {
        "docker", "br-",  "cni",   "flannel", "cali",  "veth", "vxlan",     "cilium_", "lxc",
        "weave",  "tunl", "virbr", "genev",   "kube-", "vnet", "nodelocal", "podman",  "cbr"};
    return std::any_of(kPrefixes.begin(), kPrefixes.end(),
                       [name](std::string_view p) { return name.substr(0, p.size()) == p; });
}

std::vector<std::string> portNetdevs(const SysfsRoot &root, const DeviceInfo &device,
                                     uint32_t port) {
    std::vector<std::string> physical;
    std::vector<std::string> others;
    if (!device.pci_path.empty()) {
        for (const std::string &nd : root.list("class/net")) {
            if (root.resolve("class/net/" + nd + "/device") != device.pci_path) {
                continue;
            }
            // Two ports on one PCI function (mlx4): dev_port is the 0-based port.
            if (const auto dev_port = root.read("class/net/" + nd + "/dev_port");
                dev_port && device.ports.size() > 1 && *dev_port != std::to_string(port - 1)) {
                continue;
            }
            physical.push_back(nd);
        }
    }
    for (const GidEntry &e : readGidTable(root, device.name, port)) {
        if (!e.netdev.empty() && !isOverlayNetdev(e.netdev) &&
            std::find(physical.begin(), physical.end(), e.netdev) == physical.end() &&
            std::find(others.begin(), others.end(), e.netdev) == others.end()) {
            others.push_back(e.netdev);
        }
    }
    physical.insert(physical.end(), others.begin(), others.end());
    return physical;
}

const char *toString(PciDistance d) {
    switch (d) {
        case PciDistance::kPix:
            return "PIX";
        case PciDistance::kPxb:
            return "PXB";
        case PciDistance::kPhb:
            return "PHB";
        case PciDistance::kNode:
            return "NODE";
        case PciDistance::kSys:
            return "SYS";
        case PciDistance::kUnknown:
            break;
    }
    return "unknown";
}

PciDistance pciDistance(const SysfsRoot &root, const std::string &a, const std::string &b) {
    const std::vector<std::string> pa = components(a);
    const std::vector<std::string> pb = components(b);
    // devices/pciDDDD:BB/<bridge>.../<function>: at least the root bus and the function.
    if (pa.size() < 3 || pb.size() < 3 || pa[0] != "devices" || pb[0] != "devices") {
        return PciDistance::kUnknown;
    }
    if (pa[1] != pb[1]) {
        // Different host bridges: within one NUMA node (NODE) or across the SMP link (SYS).
        const auto na = root.read(a + "/numa_node");
        const auto nb = root.read(b + "/numa_node");
        // -1 (or nothing) means the kernel does not know: single-node machines report it.
        const bool known = na && nb && *na != "-1" && *nb != "-1";
        return known && *na != *nb ? PciDistance::kSys : PciDistance::kNode;
    }
    // Same host bridge: count the bridges below the deepest one both paths share.
    size_t common = 2;
    while (common < pa.size() - 1 && common < pb.size() - 1 && pa[common] == pb[common]) {
        ++common;
    }
    if (common == 2) {
        return PciDistance::kPhb;  // only the host bridge in common
    }
    const size_t below_a = pa.size() - 1 - common;
    const size_t below_b = pb.size() - 1 - common;
    // Under one switch each side has one downstream port of its own (or none): PIX.
    return below_a <= 1 && below_b <= 1 ? PciDistance::kPix : PciDistance::kPxb;
}

std::vector<GpuInfo> listNvidiaGpus(const SysfsRoot &root) {
    std::vector<GpuInfo> out;
    for (const std::string &bdf : root.list("bus/pci/devices")) {
        const std::string base = "bus/pci/devices/" + bdf;
        const auto vendor = root.read(base + "/vendor");
        const auto cls = root.read(base + "/class");
        // Class 0x0302xx (3D controller: data-centre GPUs) or 0x0300xx (VGA), NVIDIA 0x10de.
        if (!vendor || *vendor != "0x10de" || !cls ||
            (cls->rfind("0x0302", 0) != 0 && cls->rfind("0x0300", 0) != 0)) {
            continue;
        }
        GpuInfo g;
        g.bdf = bdf;
        g.pci_path = root.resolve(base).value_or("");
        out.push_back(std::move(g));
    }
    return out;
}

}  // namespace tensorlane::sidecar
