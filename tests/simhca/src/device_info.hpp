// One simulated device as the tree describes it: node attributes, ports, GID tables and the
// netdev behind each port. Re-read whenever the tree changes.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tensorlane::simhca {

/// One GID table entry (ports/<p>/gids/<i> and gid_attrs/{types,ndevs}/<i>).
struct GidEntry {
    ibv_gid gid{};         ///< the GID as gids/<i> shows it
    bool valid = false;    ///< non-zero GID with a type
    bool roce_v2 = false;  ///< "RoCE v2" (else "IB/RoCE v1")
    std::string ndev;
    /// The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), host order; nullopt otherwise.
    [[nodiscard]] std::optional<uint32_t> ipv4() const;
};

/// One port (ports/<p>/...).
struct PortInfo {
    ibv_port_state state = IBV_PORT_DOWN;  ///< ports/<p>/state
    uint8_t phys_state = 3;                ///< 5: LinkUp, 3: Disabled
    bool ethernet = true;
    uint8_t active_width = 2;   ///< IB_WIDTH_4X
    uint8_t active_speed = 32;  ///< EDR
    std::string netdev;
    int netdev_mtu = 1500;              ///< class/net/<netdev>/mtu
    ibv_mtu active_mtu = IBV_MTU_1024;  ///< roceActiveMtu(netdev_mtu)
    /// The host-wide traffic class of tc/<port>/traffic_class ("Global tclass=N" as
    /// MLNX_OFED shows it, or "N"); -1 when not set. It replaces the GRH traffic class of every
    /// QP on the port, as on mlx5.
    int tclass_override = -1;
    std::vector<GidEntry> gids;  ///< the GID table, empty entries included
};

/// A device (class/infiniband/<name>).
struct DeviceInfo {
    std::string name;             ///< class/infiniband/<name>
    std::string dir;              ///< class/infiniband/<name> under the root
    uint64_t node_guid = 0;       ///< host order
    uint64_t sys_image_guid = 0;  ///< host order
    std::string fw_ver = "0.0.0";
    uint32_t vendor_id = 0;       ///< device/vendor
    uint32_t vendor_part_id = 0;  ///< device/device
    uint32_t hw_ver = 0;          ///< hw_rev
    std::vector<PortInfo> ports;  ///< ports[0] is port 1
};

/// The largest IB MTU a RoCE port carries over a netdev MTU: the netdev MTU less the RoCE
/// headers (GRH 40 + UDP 8 + BTH 12 + XRC ETH 4 + AtomicETH 28 + ICRC 4), as iboe_get_mtu()
/// in include/rdma/ib_addr.h computes it.
[[nodiscard]] ibv_mtu roceActiveMtu(int netdev_mtu);

/// Bytes in an IB MTU enum value.
[[nodiscard]] int mtuBytes(ibv_mtu mtu);

/// Loads class/infiniband/<name> from the tree at root; nullopt when it is not a device.
[[nodiscard]] std::optional<DeviceInfo> loadDeviceInfo(const std::string &root,
                                                       const std::string &name);

/// Parses a GID as sysfs prints it (eight groups of four hex digits).
[[nodiscard]] std::optional<ibv_gid> parseGid(const std::string &s);

}  // namespace tensorlane::simhca
