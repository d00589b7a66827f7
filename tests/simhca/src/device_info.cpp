#include "device_info.hpp"

#include <arpa/inet.h>

#include <cstring>

#include "sysfs_tree.hpp"

namespace tensorlane::simhca {
namespace {

uint64_t parseGuid(const std::string &s) {
    // sysfs prints GUIDs as four groups of four hex digits separated by colons.
    uint64_t v = 0;
    for (char c : s) {
        if (c == ':') {
            continue;
        }
        const int d = (c >= '0' && c <= '9')   ? c - '0'
                      : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                      : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                               : -1;
        if (d < 0) {
            return 0;
        }
        v = (v << 4) | static_cast<uint64_t>(d);
    }
    return v;
}

// "100 Gb/sec (4X EDR)" as ib_port_rate_show() (drivers/infiniband/core/sysfs.c) prints it.
void parseRate(const std::string &rate, PortInfo &port) {
    struct Width {
        const char *text;
        uint8_t value;
    };
    static constexpr Width kWidths[] = {
        {"(1X", 1}, {"(2X", 16}, {"(4X", 2}, {"(8X", 4}, {"(12X", 8}};
    for (const auto &w : kWidths) {
        if (rate.find(w.text) != std::string::npos) {
            port.active_width = w.value;
        }
    }
    struct Speed {
        const char *text;
        uint8_t value;
    };
    static constexpr Speed kSpeeds[] = {{"SDR", 1},   {"DDR", 2},  {"QDR", 4},  {"FDR10", 8},
                                        {"FDR)", 16}, {"EDR", 32}, {"HDR", 64}, {"NDR", 128}};
    for (const auto &s : kSpeeds) {
        if (rate.find(s.text) != std::string::npos) {
            port.active_speed = s.value;
        }
    }
}

}  // namespace

std::optional<uint32_t> GidEntry::ipv4() const {
    static constexpr uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (!valid || std::memcmp(gid.raw, kPrefix, sizeof(kPrefix)) != 0) {
        return std::nullopt;
    }
    uint32_t be;
    std::memcpy(&be, gid.raw + 12, 4);
    return ntohl(be);
}

ibv_mtu roceActiveMtu(int netdev_mtu) {
    const int room = netdev_mtu - (40 + 8 + 12 + 4 + 28 + 4);
    if (room >= 4096) {
        return IBV_MTU_4096;
    }
    if (room >= 2048) {
        return IBV_MTU_2048;
    }
    if (room >= 1024) {
        return IBV_MTU_1024;
    }
    if (room >= 512) {
        return IBV_MTU_512;
    }
    return IBV_MTU_256;
}

int mtuBytes(ibv_mtu mtu) {
    return 128 << static_cast<int>(mtu);
}

std::optional<ibv_gid> parseGid(const std::string &s) {
    ibv_gid gid{};
    unsigned groups[8];
    if (std::sscanf(s.c_str(), "%4x:%4x:%4x:%4x:%4x:%4x:%4x:%4x", &groups[0], &groups[1],
                    &groups[2], &groups[3], &groups[4], &groups[5], &groups[6], &groups[7]) != 8) {
        return std::nullopt;
    }
    for (int i = 0; i < 8; ++i) {
        gid.raw[2 * i] = static_cast<uint8_t>(groups[i] >> 8);
        gid.raw[2 * i + 1] = static_cast<uint8_t>(groups[i]);
    }
    return gid;
}

std::optional<DeviceInfo> loadDeviceInfo(const std::string &root, const std::string &name) {
    DeviceInfo dev;
    dev.name = name;
    dev.dir = root + "/class/infiniband/" + name;
    const auto node_guid = readTrimmed(dev.dir + "/node_guid");
    if (!node_guid) {
        return std::nullopt;
    }
    dev.node_guid = parseGuid(*node_guid);
    dev.sys_image_guid = parseGuid(readTrimmed(dev.dir + "/sys_image_guid").value_or(*node_guid));
    dev.fw_ver = readTrimmed(dev.dir + "/fw_ver").value_or("0.0.0");
    dev.vendor_id = static_cast<uint32_t>(
        parseLeadingInt(readTrimmed(dev.dir + "/device/vendor").value_or("0")).value_or(0));
    dev.vendor_part_id = static_cast<uint32_t>(
        parseLeadingInt(readTrimmed(dev.dir + "/device/device").value_or("0")).value_or(0));
    dev.hw_ver = static_cast<uint32_t>(
        parseLeadingInt(readTrimmed(dev.dir + "/hw_rev").value_or("0")).value_or(0));
    for (int p = 1;; ++p) {
        const std::string pdir = dev.dir + "/ports/" + std::to_string(p);
        const auto state = readTrimmed(pdir + "/state");
        if (!state) {
            break;
        }
        PortInfo port;
        port.state = static_cast<ibv_port_state>(parseLeadingInt(*state).value_or(1));
        port.phys_state = static_cast<uint8_t>(
            parseLeadingInt(readTrimmed(pdir + "/phys_state").value_or("3")).value_or(3));
        port.ethernet = readTrimmed(pdir + "/link_layer").value_or("Ethernet") == "Ethernet";
        parseRate(readTrimmed(pdir + "/rate").value_or(""), port);
        const size_t ngids = listDirectory(pdir + "/gids").size();
        port.gids.resize(ngids);
        for (size_t i = 0; i < ngids; ++i) {
            GidEntry &g = port.gids[i];
            const auto text = readTrimmed(pdir + "/gids/" + std::to_string(i));
            const auto type = readTrimmed(pdir + "/gid_attrs/types/" + std::to_string(i));
            const auto gid = text ? parseGid(*text) : std::nullopt;
            static constexpr ibv_gid kZero{};
            if (gid && type && !type->empty() &&
                std::memcmp(gid->raw, kZero.raw, sizeof(kZero.raw)) != 0) {
                g.gid = *gid;
                g.valid = true;
                g.roce_v2 = *type == "RoCE v2";
                g.ndev = readTrimmed(pdir + "/gid_attrs/ndevs/" + std::to_string(i)).value_or("");
                if (port.netdev.empty()) {
                    port.netdev = g.ndev;
                }
            }
        }
        if (!port.netdev.empty()) {
            port.netdev_mtu = static_cast<int>(
                parseLeadingInt(
                    readTrimmed(root + "/class/net/" + port.netdev + "/mtu").value_or("1500"))
                    .value_or(1500));
        }
        port.active_mtu = roceActiveMtu(port.netdev_mtu);
        if (const auto tc = readTrimmed(dev.dir + "/tc/" + std::to_string(p) + "/traffic_class")) {
            const size_t eq = tc->find('=');
            const auto v = parseLeadingInt(eq == std::string::npos ? *tc : tc->substr(eq + 1));
            if (v && *v <= 255) {
                port.tclass_override = static_cast<int>(*v);
            }
        }
        dev.ports.push_back(std::move(port));
    }
    if (dev.ports.empty()) {
        return std::nullopt;
    }
    return dev;
}

}  // namespace tensorlane::simhca
