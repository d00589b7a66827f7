// Fabric discovery: RDMA devices, ports, GID tables, netdevs and the host-wide traffic class,
// read from sysfs alone (no libibverbs), so the same code runs on a host, in a container and
// against a fixture tree. selectFabric() turns a config into the device, port, GID, MTU and
// traffic class the verbs transport uses, each with the reason it was chosen.
//
// Every read goes through one SysfsRoot: /sys, or $TENSORLANE_SYSFS_ROOT (the tree the
// simulated HCA reads too), or an explicit directory (`tensorlane diag --sysfs-root`).
// The layout and file formats are the kernel's (drivers/infiniband/core/sysfs.c):
//   class/infiniband/<dev>/{node_guid,fw_ver,hca_type,node_type,device -> PCI dir}
//   class/infiniband/<dev>/ports/<p>/{state,phys_state,link_layer,rate,gids/<i>}
//   class/infiniband/<dev>/ports/<p>/gid_attrs/{types,ndevs}/<i>
//   class/infiniband/<dev>/tc/<p>/traffic_class        (mlx5: "Global tclass=106" when set)
//   class/net/<netdev>/{mtu,operstate,address,device -> PCI dir}
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlane/config/config.hpp"
#include "tensorlane/config/sysfs.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

/// Every sysfs read of the fabric code goes through one (config/sysfs.hpp, shared with the
/// transport resolution of the config).
using config::SysfsRoot;

/// RoCE version of a GID table entry (gid_attrs/types: "IB/RoCE v1" or "RoCE v2").
enum class RoceVersion { kUnknown, kV1, kV2 };
/// "v1", "v2" or "unknown".
const char *toString(RoceVersion v);

/// One 128-bit GID.
struct Gid {
    /// Network order, as ibv_query_gid returns it.
    std::array<uint8_t, 16> raw{};

    /// Parses the sysfs form "0000:0000:0000:0000:0000:ffff:0a00:0002" (8 groups of 4 hex
    /// digits); the compressed IPv6 form is accepted too.
    static std::optional<Gid> parse(std::string_view text);
    /// The sysfs form: 8 groups of 4 lower-case hex digits.
    std::string text() const;
    /// The address it carries: "10.0.0.2" for IPv4-mapped, else the compressed IPv6 form.
    std::string address() const;
    /// All zero: an unpopulated table entry.
    bool isZero() const;
    /// ::ffff:a.b.c.d, the GID of an IPv4 address.
    bool isIpv4Mapped() const;
    /// fe80::/10: reachable only inside one L2 segment, never routed.
    bool isLinkLocal() const;
};

/// One entry of a port's GID table, with what could be read of it.
struct GidEntry {
    uint32_t index = 0;
    /// nullopt when gids/<i> cannot be read or parsed.
    std::optional<Gid> gid;
    /// From gid_attrs/types/<i>; kUnknown when unreadable or unrecognised.
    RoceVersion version = RoceVersion::kUnknown;
    /// gid_attrs/types/<i> as read ("RoCE v2"); empty when unreadable.
    std::string type_text;
    /// gid_attrs/ndevs/<i>: the netdev the GID belongs to; empty when unreadable.
    std::string netdev;
    /// Why the entry cannot be used at all ("type unreadable", "empty"); empty when usable.
    std::string problem;
};

/// "100 Gb/sec (4X EDR)" or "2.5 Gb/sec (1X SDR)" in Mb/s; 0 when it is not that form.
uint64_t rateMbps(const std::string &rate);

/// Whether a root-relative path leads to a PCI function: "devices/..." ending in a
/// "DDDD:BB:SS.F" address (hex), as a NIC's device link does (a simulated device's device/ is a
/// plain directory instead).
bool isPciFunctionPath(const std::string &rel);

/// One port of an RDMA device.
struct PortInfo {
    uint32_t port = 0;
    /// The state's name ("ACTIVE", "DOWN"); "unreadable" when the file cannot be read.
    std::string state = "unreadable";
    /// The physical state's name ("LinkUp", "Disabled"); "unreadable" likewise.
    std::string phys_state = "unreadable";
    /// "Ethernet" (RoCE) or "InfiniBand"; empty when unreadable.
    std::string link_layer;
    /// "100 Gb/sec (4X EDR)"; empty when unreadable.
    std::string rate;
    /// Exactly ACTIVE ("5: ACTIVE_DEFER" cannot carry traffic yet).
    bool active() const { return state == "ACTIVE"; }
};

/// One RDMA device with its ports.
struct DeviceInfo {
    std::string name;
    std::string node_guid;
    std::string fw_ver;
    std::string hca_type;
    /// The PCI function relative to the root ("devices/pci0000:00/.../0000:03:00.0"); empty
    /// when the device link does not resolve.
    std::string pci_path;
    /// Sorted by number.
    std::vector<PortInfo> ports;
    /// The port numbered `port`, or nullptr.
    const PortInfo *findPort(uint32_t port) const;
};

/// One Ethernet interface.
struct NetdevInfo {
    std::string name;
    /// class/net/<name> exists.
    bool exists = false;
    /// class/net/<name>/mtu; nullopt when unreadable.
    std::optional<uint32_t> mtu;
    /// "up", "down", "unknown"...; empty when unreadable.
    std::string operstate;
    /// The MAC address; empty when unreadable.
    std::string address;
    /// The PCI function (as DeviceInfo::pci_path); empty for virtual interfaces.
    std::string pci_path;
};

/// Every RDMA device under class/infiniband, sorted by name.
std::vector<DeviceInfo> listDevices(const SysfsRoot &root);
/// One device; nullopt when class/infiniband/<name> does not exist.
std::optional<DeviceInfo> readDevice(const SysfsRoot &root, const std::string &name);
/// The GID table of a port, every entry that is present (readable or not), by index.
std::vector<GidEntry> readGidTable(const SysfsRoot &root, const std::string &device, uint32_t port);
/// class/net/<name>.
NetdevInfo readNetdev(const SysfsRoot &root, const std::string &name);
/// The netdevs of a port: those its GID table names, and those on the device's PCI function;
/// overlay interfaces (isOverlayNetdev) left out. The physical one (same PCI function) first.
std::vector<std::string> portNetdevs(const SysfsRoot &root, const DeviceInfo &device,
                                     uint32_t port);
/// Container and overlay interfaces whose GIDs never carry our traffic: docker*, br-*, cni*,
/// flannel*, cali*, veth*, vxlan*, cilium_*, lxc*, weave*, tunl*, virbr*, ...
bool isOverlayNetdev(std::string_view name);

/// The GID index `auto` chose, and why (for the log and for `tensorlane diag`).
struct GidChoice {
    uint32_t index = 0;
    std::string reason;
};
/// Picks the GID index among `table` for `netdev` (empty: any netdev that is not an overlay):
/// RoCE v2 only; IPv4-mapped before global IPv6; link-local only when nothing routable exists;
/// unreadable and empty entries skipped; lowest index within a kind. kNotFound, with what the
/// table holds, when nothing qualifies. Sets *out only on success.
[[nodiscard]] Status chooseGid(const std::vector<GidEntry> &table, std::string_view netdev,
                               GidChoice *out);
/// Checks an index given in the file: present, readable, not empty, RoCE v2, and of `netdev`
/// when that is not empty. kInvalid or kNotFound with the reason. Sets *out only on success.
[[nodiscard]] Status checkGidIndex(const std::vector<GidEntry> &table, uint32_t index,
                                   std::string_view netdev, GidChoice *out);

/// The largest IB MTU (256-4096) a RoCE port reports for a netdev MTU: the netdev's MTU less
/// the RoCEv2 headers (GRH 40 + UDP 8 + BTH 12 + XRC 4 + AtomicETH 28 + ICRC 4 = 96 bytes, as
/// the kernel's iboe_get_mtu() in include/rdma/ib_addr.h); 0 when not even 256 fits.
uint32_t roceActiveMtu(uint32_t netdev_mtu);
/// The RoCEv2 header bytes iboe_get_mtu() subtracts.
inline constexpr uint32_t kRoceHeaderBytes = 96;

/// The host-wide traffic class of a port (mlx5: class/infiniband/<dev>/tc/<port>/traffic_class).
struct TclassOverride {
    /// The file exists (the driver offers the override).
    bool file_present = false;
    /// The global class set ("Global tclass=N"); nullopt when none is set or unreadable.
    std::optional<uint8_t> value;
    /// Set when the file is present but cannot be read or parsed.
    std::string problem;
    /// The file's path below the root, for messages and fixes.
    std::string rel_path;
};
/// Reads the override of one port.
TclassOverride readTclassOverride(const SysfsRoot &root, const std::string &device, uint32_t port);

/// Where the traffic class in use comes from.
enum class TclassSource { kConfig, kHostOverride };
/// "config" or "host_override".
const char *toString(TclassSource s);

/// What the verbs transport uses, with the reasons. Re-select after a GID change or a port
/// flap: the kernel may move a GID to another index.
struct FabricSelection {
    std::string device;
    uint32_t port = 0;
    /// The netdev whose GID is used.
    std::string netdev;
    /// The port's state when read ("ACTIVE").
    std::string port_state;
    /// The port's rate in Mb/s from its sysfs `rate` ("100 Gb/sec (4X EDR)": 100000); 0 when
    /// unreadable. What the NCCL plugin reports as its device's speed.
    uint64_t rate_mbps = 0;
    /// The device's PCI function, absolute ("/sys/devices/pci0000:00/.../0000:03:00.0"); empty
    /// when its device link does not lead to one (a virtual or simulated device on no bus).
    /// What the NCCL plugin gives NCCL as the NIC's pciPath (its GPU-NIC distance, GPUDirect).
    std::string pci_path;
    uint32_t gid_index = 0;
    Gid gid;
    /// The sysfs form of `gid`.
    std::string gid_text;
    RoceVersion roce_version = RoceVersion::kUnknown;
    /// The netdev's MTU; 0 when unreadable.
    uint32_t netdev_mtu = 0;
    /// The IB MTU the port reports for netdev_mtu; 0 when unknown (netdev MTU unreadable).
    uint32_t active_mtu = 0;
    /// min([fabric] mtu, active_mtu); the peer's value is applied later, at bootstrap.
    uint32_t path_mtu = 0;
    /// The GRH traffic class to use: the config's DSCP<<2 | ECN, or the adopted host value.
    uint8_t traffic_class = 0;
    TclassSource tclass_source = TclassSource::kConfig;
    /// Why this device and port, this GID, this MTU, this traffic class.
    std::string device_reason;
    std::string gid_reason;
    std::string mtu_reason;
    std::string tclass_reason;
    /// One line for the log: "mlx5_0 port 1 (eth0), GID 3 ..., path MTU 4096, tclass 106".
    std::string summary() const;
};

/// Picks device, port, netdev, GID, MTU and traffic class for `cfg` from the tree at `root`.
/// Errors (kNotFound: no device, port or GID; kInvalid: a value in the file that the host
/// contradicts; kPeer: the port is not ACTIVE) say what was found and what to change.
/// Re-entrant and side-effect free: call it again to re-read. Sets *out only on success.
[[nodiscard]] Status selectFabric(const config::Config &cfg, const SysfsRoot &root,
                                  FabricSelection *out);

}  // namespace tensorlane::sidecar
