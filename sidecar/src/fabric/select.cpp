// selectFabric: the config's [fabric] table resolved against what sysfs shows.
#include <algorithm>
#include <optional>
#include <utility>

#include "fabric/internal.hpp"
#include "tensorlane/sidecar/fabric.hpp"

namespace tensorlane::sidecar {

std::string join(const std::vector<std::string> &items, const char *sep) {
    std::string out;
    for (const std::string &s : items) {
        out += out.empty() ? s : sep + s;
    }
    return out;
}

namespace {

std::string portName(const std::string &device, uint32_t port) {
    return device + " port " + std::to_string(port);
}

/// "mlx5_0 port 1 (eth0) ACTIVE" for error messages that list candidates.
std::string describePort(const SysfsRoot &root, const DeviceInfo &d, uint32_t port) {
    const PortInfo *p = d.findPort(port);
    const std::vector<std::string> nds = portNetdevs(root, d, port);
    return portName(d.name, port) + (nds.empty() ? "" : " (" + join(nds) + ")") + " " +
           (p != nullptr ? p->state : std::string("missing"));
}

Status pickDevice(const config::Config &cfg, const SysfsRoot &root,
                  const std::vector<DeviceInfo> &devices, DeviceInfo *out, std::string *reason) {
    const config::FabricConfig &f = cfg.fabric;
    const uint32_t port = f.port;
    const bool want_netdev = f.netdev != "auto";
    if (f.device != "auto") {
        const auto it = std::find_if(devices.begin(), devices.end(),
                                     [&](const DeviceInfo &d) { return d.name == f.device; });
        if (it == devices.end()) {
            std::vector<std::string> names;
            for (const DeviceInfo &d : devices) {
                names.push_back(d.name);
            }
            return {Code::kNotFound, "[fabric] device = \"" + f.device + "\": no such RDMA device" +
                                         (names.empty() ? std::string(" (there is none)")
                                                        : " (found: " + join(names) + ")")};
        }
        if (it->findPort(port) == nullptr) {
            std::vector<std::string> ports;
            for (const PortInfo &p : it->ports) {
                ports.push_back(std::to_string(p.port));
            }
            return {Code::kNotFound, "[fabric] port = " + std::to_string(port) + ": " + it->name +
                                         " has no such port (ports: " +
                                         (ports.empty() ? std::string("none") : join(ports)) + ")"};
        }
        *out = *it;
        *reason = it->name + " is set in the file";
        return Status::ok();
    }
    std::vector<const DeviceInfo *> candidates;
    std::vector<std::string> seen;
    for (const DeviceInfo &d : devices) {
        if (d.findPort(port) == nullptr) {
            seen.push_back(d.name + " has no port " + std::to_string(port));
            continue;
        }
        seen.push_back(describePort(root, d, port));
        if (want_netdev) {
            const std::vector<std::string> nds = portNetdevs(root, d, port);
            if (std::find(nds.begin(), nds.end(), f.netdev) == nds.end()) {
                continue;
            }
        }
        candidates.push_back(&d);
    }
    const std::string on = want_netdev ? " on netdev " + f.netdev : std::string();
    if (candidates.empty()) {
        return {Code::kNotFound, "device auto: no RDMA device has port " + std::to_string(port) +
                                     on + " (" + join(seen, "; ") + ")"};
    }
    if (candidates.size() == 1) {
        *out = *candidates.front();
        *reason = devices.size() == 1
                      ? "device auto: " + out->name + " is the only RDMA device"
                      : "device auto: " + out->name + " is the only device with port " +
                            std::to_string(port) + on;
        return Status::ok();
    }
    std::vector<const DeviceInfo *> active;
    for (const DeviceInfo *d : candidates) {
        if (d->findPort(port)->active()) {
            active.push_back(d);
        }
    }
    if (active.size() == 1) {
        *out = *active.front();
        *reason = "device auto: " + out->name + " port " + std::to_string(port) +
                  " is the only ACTIVE port" + on + " of " + std::to_string(candidates.size()) +
                  " devices";
        return Status::ok();
    }
    std::vector<std::string> listed;
    for (const DeviceInfo *d : active.empty() ? candidates : active) {
        listed.push_back(describePort(root, *d, port));
    }
    return {Code::kInvalid,
            "device auto is ambiguous: " +
                (active.empty() ? std::string("no port is ACTIVE")
                                : std::to_string(active.size()) + " ports are ACTIVE") +
                on + " (" + join(listed, "; ") + "); set [fabric] device" +
                (want_netdev ? std::string() : std::string(" or netdev")) + " to choose one"};
}

}  // namespace

uint32_t roceActiveMtu(uint32_t netdev_mtu) {
    if (netdev_mtu < kRoceHeaderBytes + 256) {
        return 0;
    }
    const uint32_t payload = netdev_mtu - kRoceHeaderBytes;
    for (uint32_t ib = 4096; ib >= 256; ib /= 2) {
        if (payload >= ib) {
            return ib;
        }
    }
    return 0;
}

const char *toString(TclassSource s) {
    return s == TclassSource::kHostOverride ? "host_override" : "config";
}

TclassOverride readTclassOverride(const SysfsRoot &root, const std::string &device, uint32_t port) {
    TclassOverride t;
    t.rel_path = "class/infiniband/" + device + "/tc/" + std::to_string(port) + "/traffic_class";
    t.file_present = root.present(t.rel_path);
    if (!t.file_present) {
        return t;
    }
    const std::optional<std::string> text = root.read(t.rel_path);
    if (!text) {
        t.problem = "unreadable";
        return t;
    }
    // mlx5 prints "Global tclass=N" when a global class is set (nothing when it is not),
    // followed by per-destination rules on later lines; only the global one applies to all QPs.
    const std::string key = "Global tclass=";
    const size_t at = text->find(key);
    if (at == std::string::npos) {
        if (text->find_first_not_of(" \t\r\n") != std::string::npos &&
            text->find("tclass=") == std::string::npos) {
            t.problem = "not understood: \"" + text->substr(0, 60) + "\"";
        }
        return t;
    }
    size_t i = at + key.size();
    int v = 0;
    size_t digits = 0;
    while (i < text->size() && (*text)[i] >= '0' && (*text)[i] <= '9' && digits < 4) {
        v = v * 10 + ((*text)[i] - '0');
        ++i;
        ++digits;
    }
    if (digits == 0 || v > 255) {
        t.problem = "not understood: \"" + text->substr(at, 40) + "\"";
        return t;
    }
    t.value = static_cast<uint8_t>(v);
    return t;
}

std::string FabricSelection::summary() const {
    return portName(device, port) + " (" + netdev + ", " + port_state + "), GID " +
           std::to_string(gid_index) + " " + gid.address() + " RoCE " + toString(roce_version) +
           ", path MTU " + std::to_string(path_mtu) + ", traffic class " +
           std::to_string(traffic_class) + " (" + toString(tclass_source) + ")";
}

Status selectFabricStaged(const config::Config &cfg, const SysfsRoot &root,
                          FabricSelection *partial, SelectStage *stage) {
    const config::FabricConfig &f = cfg.fabric;
    *stage = SelectStage::kDevice;
    const std::vector<DeviceInfo> devices = listDevices(root);
    if (devices.empty()) {
        return {Code::kNotFound, "no RDMA device under " + root.pathOf("class/infiniband") +
                                     " (is the NIC's RDMA driver loaded? `rdma link show`)"};
    }
    FabricSelection &s = *partial;
    s = FabricSelection{};
    DeviceInfo dev;
    if (Status st = pickDevice(cfg, root, devices, &dev, &s.device_reason); !st.isOk()) {
        return st;
    }
    s.device = dev.name;
    s.port = f.port;
    s.pci_path = isPciFunctionPath(dev.pci_path) ? root.pathOf(dev.pci_path) : std::string();
    *stage = SelectStage::kPort;
    const PortInfo &port = *dev.findPort(f.port);
    const std::string where = portName(dev.name, f.port);
    if (!port.link_layer.empty() && port.link_layer != "Ethernet") {
        return {Code::kInvalid, where + " has link layer " + port.link_layer +
                                    ", not Ethernet: tensorlane speaks RoCE (set [fabric] device "
                                    "to a RoCE device)"};
    }
    if (!port.active()) {
        return {Code::kPeer, where + " is " + port.state + " (physical state " + port.phys_state +
                                 "), not ACTIVE: check the cable and the switch port (`ip link "
                                 "show`, `rdma link show`)"};
    }
    s.port_state = port.state;
    s.rate_mbps = rateMbps(port.rate);
    s.netdev = f.netdev != "auto" ? f.netdev : std::string();
    *stage = SelectStage::kGid;

    // The netdev, and the GID on it.
    const std::vector<GidEntry> table = readGidTable(root, dev.name, f.port);
    const std::vector<std::string> netdevs = portNetdevs(root, dev, f.port);
    GidChoice choice;
    if (f.netdev != "auto") {
        if (!readNetdev(root, f.netdev).exists) {
            return {Code::kNotFound, "[fabric] netdev = \"" + f.netdev +
                                         "\": no such interface under " + root.pathOf("class/net")};
        }
        if (std::find(netdevs.begin(), netdevs.end(), f.netdev) == netdevs.end()) {
            return {Code::kInvalid, "[fabric] netdev = \"" + f.netdev + "\" is not a netdev of " +
                                        where + " (" +
                                        (netdevs.empty() ? std::string("it names none")
                                                         : "its netdevs: " + join(netdevs)) +
                                        ")"};
        }
        s.netdev = f.netdev;
        const Status st = f.gid_index ? checkGidIndex(table, *f.gid_index, s.netdev, &choice)
                                      : chooseGid(table, s.netdev, &choice);
        if (!st.isOk()) {
            return {st.code(), where + ": " + st.message()};
        }
    } else if (f.gid_index) {
        if (Status st = checkGidIndex(table, *f.gid_index, "", &choice); !st.isOk()) {
            return {st.code(), where + ": " + st.message()};
        }
        s.netdev = std::find_if(table.begin(), table.end(), [&](const GidEntry &e) {
                       return e.index == choice.index;
                   })->netdev;
    } else {
        // netdev auto: the port's own interface first (same PCI function), then the others its
        // GID table names (a VLAN or a bond), the first with a usable GID.
        // A link-local GID only when no netdev of the port has a routable one.
        std::optional<std::pair<std::string, GidChoice>> link_local;
        for (const std::string &nd : netdevs) {
            GidChoice c;
            if (!chooseGid(table, nd, &c).isOk()) {
                continue;
            }
            const auto e = std::find_if(table.begin(), table.end(),
                                        [&](const GidEntry &g) { return g.index == c.index; });
            if (!e->gid->isLinkLocal()) {
                s.netdev = nd;
                choice = std::move(c);
                break;
            }
            if (!link_local) {
                link_local.emplace(nd, std::move(c));
            }
        }
        if (s.netdev.empty() && link_local) {
            s.netdev = link_local->first;
            choice = std::move(link_local->second);
        }
        if (s.netdev.empty()) {
            GidChoice unused;
            const Status st = chooseGid(table, netdevs.empty() ? "" : netdevs.front(), &unused);
            return {Code::kNotFound,
                    where + ": " +
                        (netdevs.empty() ? std::string("no netdev found (no GID names one and no "
                                                       "interface is on its PCI function)")
                                         : st.message()) +
                        "; give the interface an IPv4 address (`ip addr add ADDR/LEN dev " +
                        (netdevs.empty() ? std::string("IFACE") : netdevs.front()) +
                        "`) so the kernel adds its RoCE v2 GID"};
        }
    }
    const GidEntry &entry = *std::find_if(
        table.begin(), table.end(), [&](const GidEntry &e) { return e.index == choice.index; });
    s.gid_index = choice.index;
    s.gid = *entry.gid;
    s.gid_text = entry.gid->text();
    s.roce_version = entry.version;
    s.gid_reason = choice.reason;
    *stage = SelectStage::kMtu;

    // MTU: what the port reports for its netdev, and the file's value clamped to it.
    const NetdevInfo nd = readNetdev(root, s.netdev);
    if (nd.mtu) {
        s.netdev_mtu = *nd.mtu;
        s.active_mtu = roceActiveMtu(*nd.mtu);
        if (s.active_mtu == 0) {
            return {Code::kInvalid, s.netdev + " has MTU " + std::to_string(*nd.mtu) +
                                        ": too small for RoCE (at least " +
                                        std::to_string(256 + kRoceHeaderBytes) + ")"};
        }
        s.path_mtu = std::min(f.mtu, s.active_mtu);
        s.mtu_reason = "path MTU " + std::to_string(s.path_mtu) + " = min([fabric] mtu " +
                       std::to_string(f.mtu) + ", active MTU " + std::to_string(s.active_mtu) +
                       " of " + s.netdev + " MTU " + std::to_string(*nd.mtu) + " less " +
                       std::to_string(kRoceHeaderBytes) + " bytes of RoCEv2 headers)";
        if (s.active_mtu < f.mtu) {
            s.mtu_reason += "; clamped: raise " + s.netdev + "'s MTU to at least " +
                            std::to_string(f.mtu + kRoceHeaderBytes) + " for " +
                            std::to_string(f.mtu);
        }
    } else {
        s.path_mtu = f.mtu;
        s.mtu_reason =
            "path MTU " + std::to_string(f.mtu) + " from [fabric] mtu: " + s.netdev +
            "'s MTU is unreadable; the verbs transport clamps it to the port's active MTU";
    }

    *stage = SelectStage::kTrafficClass;
    // Traffic class: ours, unless the host-wide override says otherwise.
    const uint8_t ours = cfg.trafficClass();
    const std::string ours_text = std::to_string(ours) + " (dscp " + std::to_string(f.dscp) +
                                  " << 2 | ecn " + (f.ecn ? "2" : "0") + ")";
    const TclassOverride host = readTclassOverride(root, dev.name, f.port);
    s.traffic_class = ours;
    s.tclass_source = TclassSource::kConfig;
    if (!host.file_present) {
        s.tclass_reason = "traffic class " + ours_text + " from the file; no host-wide override";
    } else if (!host.problem.empty()) {
        s.tclass_reason = "traffic class " + ours_text + " from the file; the host-wide override " +
                          root.pathOf(host.rel_path) + " is " + host.problem;
    } else if (!host.value) {
        s.tclass_reason = "traffic class " + ours_text + " from the file; the host-wide override " +
                          root.pathOf(host.rel_path) + " is not set";
    } else if (*host.value == ours) {
        s.tclass_reason = "traffic class " + ours_text + " from the file, equal to the host-wide " +
                          "override in " + root.pathOf(host.rel_path);
    } else if (f.tclass_override == config::TclassOverride::kAdopt) {
        s.traffic_class = *host.value;
        s.tclass_source = TclassSource::kHostOverride;
        s.tclass_reason = "traffic class " + std::to_string(*host.value) + " (dscp " +
                          std::to_string(*host.value >> 2) + ") adopted from the host-wide " +
                          "override in " + root.pathOf(host.rel_path) +
                          " (tclass_override = " + "\"adopt\"); the file's " + ours_text +
                          " is not used";
    } else {
        return {Code::kInvalid,
                "the host-wide traffic class in " + root.pathOf(host.rel_path) + " is " +
                    std::to_string(*host.value) + " (dscp " + std::to_string(*host.value >> 2) +
                    ") but the file gives " + ours_text +
                    "; the driver applies the host value to every QP, so ours would be ignored. "
                    "Clear it (`echo -1 > " +
                    root.pathOf(host.rel_path) +
                    "`), make [fabric] dscp/ecn match it, or set [fabric] " +
                    "tclass_override = \"adopt\""};
    }
    *stage = SelectStage::kDone;
    return Status::ok();
}

Status selectFabric(const config::Config &cfg, const SysfsRoot &root, FabricSelection *out) {
    FabricSelection s;
    SelectStage stage = SelectStage::kDevice;
    Status st = selectFabricStaged(cfg, root, &s, &stage);
    if (st.isOk()) {
        *out = std::move(s);
    }
    return st;
}

}  // namespace tensorlane::sidecar
