// What the fabric code shares between its files and its tests, but not with the rest of the
// sidecar: the logger, running helper programs, PCIe distance, and the QoS read-back parsers.
#pragma once

#include "spdlog_headers.hpp"  // first: fmt under its pragma

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlane/sidecar/fabric.hpp"

namespace tensorlane::sidecar {

/// The "tensorlane.sidecar.fabric" logger (stderr), created on first use.
spdlog::logger &fabricLog();

/// "a, b, c": the items with `sep` between them (messages that list candidates).
std::string join(const std::vector<std::string> &items, const char *sep = ", ");

/// What a helper program (mlnx_qos, dcb, ethtool) printed.
struct CommandOutput {
    /// False when the program is not on PATH.
    bool found = false;
    /// The exit status; -1 when it could not be run or was killed (timeout).
    int exit_code = -1;
    /// Standard output (standard error is discarded), at most 1 MiB.
    std::string out;
    bool ok() const { return found && exit_code == 0; }
};
/// Runs argv[0] found on PATH with a time limit, no shell; stdin is /dev/null. 10 s: mlnx_qos
/// is a Python program, and on a loaded host (or a 2-core CI machine running the tests in
/// parallel) its start alone has taken over 3 s.
CommandOutput runCommand(const std::vector<std::string> &argv, int timeout_ms = 10000);

/// GPU-NIC distance classes, as `nvidia-smi topo -m` prints them.
enum class PciDistance {
    kPix,   ///< at most one PCIe switch between them
    kPxb,   ///< several PCIe switches, no host bridge
    kPhb,   ///< through a PCIe host bridge (the CPU)
    kNode,  ///< across host bridges within one NUMA node
    kSys,   ///< across the SMP interconnect between NUMA nodes
    kUnknown,
};
/// "PIX", "PXB", "PHB", "NODE", "SYS", "unknown".
const char *toString(PciDistance d);
/// The distance between two PCI functions given as root-relative paths
/// ("devices/pci0000:00/0000:00:01.0/0000:03:00.0"); NUMA nodes read from their numa_node.
PciDistance pciDistance(const SysfsRoot &root, const std::string &a, const std::string &b);

/// An NVIDIA GPU seen on the PCI bus.
struct GpuInfo {
    std::string bdf;
    /// As DeviceInfo::pci_path; empty when bus/pci/devices/<bdf> does not resolve.
    std::string pci_path;
};
/// bus/pci/devices/* with vendor 0x10de and class 0x0302xx or 0x0300xx.
std::vector<GpuInfo> listNvidiaGpus(const SysfsRoot &root);

/// A NIC's QoS settings as read back from mlnx_qos or dcb; each nullopt when not shown.
struct QosSettings {
    /// "dscp" or "pcp".
    std::optional<std::string> trust;
    /// DSCP -> priority, for the DSCP values listed (-1: not listed).
    std::optional<std::array<int, 64>> dscp_to_prio;
    /// PFC enabled per priority.
    std::optional<std::array<bool, 8>> pfc;
    /// Which tool it came from ("mlnx_qos", "dcb").
    std::string source;
};
/// Parses `mlnx_qos -i <netdev>` output.
QosSettings parseMlnxQos(std::string_view text);
/// Parses `dcb pfc show dev <nd> prio-pfc` (pfc) and `dcb app show dev <nd> dscp-prio` (app)
/// output; either may be empty.
QosSettings parseDcb(std::string_view pfc_text, std::string_view app_text);

/// Counters of `ethtool -S <netdev>` whose name has "pause" in it, in output order.
std::vector<std::pair<std::string, uint64_t>> parsePauseCounters(std::string_view text);

}  // namespace tensorlane::sidecar

namespace tensorlane::sidecar {

/// How far selectFabric got: the step that failed, or kDone.
enum class SelectStage { kDevice, kPort, kGid, kMtu, kTrafficClass, kDone };
/// selectFabric, keeping what it found before a failure in *partial and the failing step in
/// *stage (diag reports each step as its own finding).
[[nodiscard]] Status selectFabricStaged(const config::Config &cfg, const SysfsRoot &root,
                                        FabricSelection *partial, SelectStage *stage);

}  // namespace tensorlane::sidecar
