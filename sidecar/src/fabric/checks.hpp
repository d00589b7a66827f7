// The host checks of `tensorlane diag` beyond the fabric selection (QoS, ECN, counters, PCIe,
// dma-buf, memlock). Each appends its findings; runDiag() calls them in order.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tensorlane/sidecar/diag.hpp"

namespace tensorlane::sidecar {

/// One finding of a check.
inline Finding make(std::string check, FindingStatus status, std::string detail,
                    std::string fix = {}) {
    return {std::move(check), status, std::move(detail), std::move(fix)};
}

/// What the checks know about the port they look at (the selection's, or the best guess when
/// the selection failed); device and netdev may be empty.
struct CheckTarget {
    std::string device;
    uint32_t port = 1;
    std::string netdev;
    /// The DSCP actually sent: the config's, or the adopted host traffic class >> 2.
    uint8_t dscp = 0;
};

/// trust, dscp_map, pfc: the NIC's QoS read back with mlnx_qos or dcb.
void checkQos(const config::Config &cfg, const CheckTarget &t, const DiagEnvironment &env,
              std::vector<Finding> *out);
/// ecn: mlx5's class/net/<nd>/ecn/roce_{np,rp}/enable/<prio>.
void checkEcn(const config::Config &cfg, const SysfsRoot &root, const CheckTarget &t,
              std::vector<Finding> *out);
/// counters: hw_counters (CNP, ECN marks, sequence errors, ACK timeouts); pause: ethtool -S.
void checkCounters(const config::Config &cfg, const SysfsRoot &root, const CheckTarget &t,
                   const DiagEnvironment &env, std::vector<Finding> *out);
/// pcie: the GPU-NIC distance of every NVIDIA GPU to the device.
void checkPcie(const SysfsRoot &root, const CheckTarget &t, std::vector<Finding> *out);
/// dmabuf: kernel, ibv_reg_dmabuf_mr and nvidia-peermem.
void checkGpuDirect(const SysfsRoot &root, const DiagEnvironment &env, std::vector<Finding> *out);
/// memlock: RLIMIT_MEMLOCK against [limits] registered_bytes.
void checkMemlock(const config::Config &cfg, const DiagEnvironment &env, std::vector<Finding> *out);

}  // namespace tensorlane::sidecar
