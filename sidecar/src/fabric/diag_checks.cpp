// The host checks of `tensorlane diag` that read the NIC's QoS, counters and placement.
#include <algorithm>
#include <cstdio>

#include "fabric/checks.hpp"
#include "fabric/internal.hpp"

namespace tensorlane::sidecar {

namespace {

using S = FindingStatus;

/// "0,0,0,1,0,0,0,0": PFC on `prio` alone, as mlnx_qos --pfc takes it.
std::string pfcList(unsigned prio) {
    std::string out;
    for (unsigned p = 0; p < 8; ++p) {
        out += (p == 0 ? "" : ",") + std::string(p == prio ? "1" : "0");
    }
    return out;
}

/// The settings and the tool that showed them; both empty when neither tool could be run.
QosSettings readQos(const std::string &netdev, const DiagEnvironment &env, std::string *why_not) {
    if (!env.run) {
        *why_not = "no helper programs in this run";
        return {};
    }
    if (auto out = env.run({"mlnx_qos", "-i", netdev})) {
        return parseMlnxQos(*out);
    }
    const auto pfc = env.run({"dcb", "pfc", "show", "dev", netdev, "prio-pfc"});
    const auto app = env.run({"dcb", "-N", "app", "show", "dev", netdev, "dscp-prio"});
    if (!pfc && !app) {
        *why_not = "neither `mlnx_qos -i " + netdev + "` nor `dcb pfc show dev " + netdev +
                   "` could be run";
        return {};
    }
    QosSettings q = parseDcb(pfc.value_or(""), app.value_or(""));
    // iproute2 >= 6.2 shows the trust order; older dcb cannot read it.
    if (const auto trust = env.run({"dcb", "apptrust", "show", "dev", netdev})) {
        const size_t at = trust->find("order ");
        if (at != std::string::npos) {
            const size_t start = at + 6;
            const size_t end = trust->find_first_of(" \n", start);
            q.trust = trust->substr(start, end == std::string::npos ? end : end - start);
        }
    }
    return q;
}

const std::string kQosToolFix =
    "install iproute2 (for `dcb`) or MLNX_OFED (for `mlnx_qos`), then run "
    "`scripts/roce-setup.sh --config FILE`";

}  // namespace

void checkQos(const config::Config &cfg, const CheckTarget &t, const DiagEnvironment &env,
              std::vector<Finding> *out) {
    const config::FabricConfig &f = cfg.fabric;
    const unsigned prio = f.pfc_priority;
    if (t.netdev.empty()) {
        for (const char *c : {"trust", "dscp_map", "pfc"}) {
            out->push_back(make(c, S::kWarn, "could not be read: no netdev was found for the port",
                                "set [fabric] netdev in the file"));
        }
        return;
    }
    const std::string &nd = t.netdev;
    std::string why_not;
    const QosSettings q = readQos(nd, env, &why_not);
    const std::string from = q.source.empty() ? "" : " (" + q.source + ")";
    const bool mlnx = q.source == "mlnx_qos";

    // trust
    const std::string want_trust = config::toString(f.trust);
    if (!q.trust) {
        out->push_back(
            make("trust", S::kWarn,
                 "trust mode could not be read" +
                     (why_not.empty() ? from + ": it does not show it" : ": " + why_not) +
                     "; the file wants trust " + want_trust,
                 q.source == "dcb" ? "check with `mlnx_qos -i " + nd +
                                         "` or iproute2 >= 6.2 `dcb apptrust show dev " + nd + "`"
                                   : kQosToolFix));
    } else if (*q.trust != want_trust) {
        out->push_back(make("trust", S::kFail,
                            nd + " trusts " + *q.trust + from + " but the file says trust = \"" +
                                want_trust + "\": packets land on the wrong priority",
                            mlnx ? "mlnx_qos -i " + nd + " --trust " + want_trust
                                 : "dcb apptrust set dev " + nd + " order " + want_trust));
    } else {
        out->push_back(make("trust", S::kOk, nd + " trusts " + *q.trust + from));
    }

    // dscp_map
    if (f.trust == config::TrustMode::kPcp) {
        out->push_back(make("dscp_map", S::kOk,
                            "trust pcp: the priority comes from the VLAN PCP, the DSCP map is not "
                            "used"));
    } else if (!q.dscp_to_prio) {
        out->push_back(make(
            "dscp_map", S::kWarn,
            "the DSCP->priority map could not be read" + (why_not.empty() ? from : ": " + why_not),
            kQosToolFix));
    } else {
        const int got = (*q.dscp_to_prio)[t.dscp];
        const std::string fix = mlnx ? "mlnx_qos -i " + nd + " --dscp2prio set," +
                                           std::to_string(t.dscp) + "," + std::to_string(prio)
                                     : "dcb app replace dev " + nd + " dscp-prio " +
                                           std::to_string(t.dscp) + ":" + std::to_string(prio);
        if (got == static_cast<int>(prio)) {
            out->push_back(make(
                "dscp_map", S::kOk,
                "DSCP " + std::to_string(t.dscp) + " -> priority " + std::to_string(prio) + from));
        } else if (got == -1) {
            out->push_back(make("dscp_map", S::kWarn,
                                "no entry for DSCP " + std::to_string(t.dscp) + from +
                                    ": the driver's default applies (mlx5: DSCP >> 3 = priority " +
                                    std::to_string(t.dscp >> 3) + "); the file wants priority " +
                                    std::to_string(prio),
                                fix));
        } else if (got == -2) {
            out->push_back(
                make("dscp_map", S::kFail,
                     "DSCP " + std::to_string(t.dscp) + " maps to several priorities" + from, fix));
        } else {
            out->push_back(make("dscp_map", S::kFail,
                                "DSCP " + std::to_string(t.dscp) + " -> priority " +
                                    std::to_string(got) + from +
                                    ", but [fabric] pfc_priority = " + std::to_string(prio) +
                                    ": RoCE traffic misses its lossless "
                                    "class",
                                fix));
        }
    }

    // pfc
    if (!q.pfc) {
        out->push_back(make("pfc", S::kWarn,
                            "PFC could not be read" + (why_not.empty() ? from : ": " + why_not),
                            kQosToolFix));
        return;
    }
    std::vector<std::string> others;
    for (unsigned p = 0; p < 8; ++p) {
        if ((*q.pfc)[p] && p != prio) {
            others.push_back(std::to_string(p));
        }
    }
    const std::string pfc_fix =
        mlnx ? "mlnx_qos -i " + nd + " --pfc " + pfcList(prio)
             : "dcb pfc set dev " + nd + " prio-pfc all:off " + std::to_string(prio) + ":on";
    if (!(*q.pfc)[prio]) {
        out->push_back(make("pfc", S::kWarn,
                            "PFC is off on priority " + std::to_string(prio) + from +
                                ": RoCE runs lossy and every drop costs a retransmission timeout"
                                " (fine only on a fabric built for lossy RoCE)",
                            pfc_fix));
    } else if (!others.empty()) {
        out->push_back(make("pfc", S::kWarn,
                            "PFC is on priority " + std::to_string(prio) + " and also on " +
                                join(others) + from +
                                ": only the RoCE priority should be "
                                "lossless (pause frames on others can spread congestion)",
                            pfc_fix));
    } else {
        out->push_back(
            make("pfc", S::kOk, "PFC on priority " + std::to_string(prio) + " alone" + from));
    }
}

void checkEcn(const config::Config &cfg, const SysfsRoot &root, const CheckTarget &t,
              std::vector<Finding> *out) {
    const unsigned prio = cfg.fabric.pfc_priority;
    if (t.netdev.empty()) {
        out->push_back(make("ecn", S::kWarn, "could not be read: no netdev was found for the port",
                            "set [fabric] netdev in the file"));
        return;
    }
    const std::string base = "class/net/" + t.netdev + "/ecn/";
    const std::string np_path = base + "roce_np/enable/" + std::to_string(prio);
    const std::string rp_path = base + "roce_rp/enable/" + std::to_string(prio);
    const auto np = root.read(np_path);
    const auto rp = root.read(rp_path);
    if (!cfg.fabric.ecn) {
        out->push_back(make("ecn", S::kOk,
                            "ecn = false in the file: packets are not ECN-capable, DCQCN is not "
                            "used (NIC: notification point " +
                                np.value_or("unreadable") + ", reaction point " +
                                rp.value_or("unreadable") + ")"));
        return;
    }
    if (!np || !rp) {
        out->push_back(make(
            "ecn", S::kWarn,
            "ECN (DCQCN) for priority " + std::to_string(prio) + " could not be read: " +
                root.pathOf(np_path) + " or roce_rp is " + "missing (not an mlx5 netdev?)",
            "check the driver's congestion control settings for priority " + std::to_string(prio)));
        return;
    }
    std::vector<std::string> off;
    std::string fix;
    if (*np != "1") {
        off.push_back("notification point (roce_np)");
        fix += "echo 1 > " + root.pathOf(np_path);
    }
    if (*rp != "1") {
        off.push_back("reaction point (roce_rp)");
        fix += (fix.empty() ? "" : "; ") + std::string("echo 1 > ") + root.pathOf(rp_path);
    }
    if (!off.empty()) {
        out->push_back(make("ecn", S::kWarn,
                            "ECN is on in the file but the NIC's " + join(off, " and ") +
                                " is off for priority " + std::to_string(prio) +
                                ": congestion is not slowed down by CNPs",
                            fix));
        return;
    }
    out->push_back(
        make("ecn", S::kOk,
             "DCQCN notification and reaction points on for priority " + std::to_string(prio)));
}

void checkCounters(const config::Config &cfg, const SysfsRoot &root, const CheckTarget &t,
                   const DiagEnvironment &env, std::vector<Finding> *out) {
    if (t.device.empty()) {
        out->push_back(make("counters", S::kWarn, "no device: counters not read",
                            "fix the device finding first"));
    } else {
        const std::string base =
            "class/infiniband/" + t.device + "/ports/" + std::to_string(t.port) + "/hw_counters/";
        static constexpr const char *kCongestion[] = {"np_cnp_sent", "np_ecn_marked_roce_packets",
                                                      "rp_cnp_handled"};
        static constexpr const char *kErrors[] = {"out_of_sequence", "packet_seq_err",
                                                  "local_ack_timeout_err"};
        std::vector<std::string> shown;
        std::vector<std::string> missing;
        std::vector<std::string> bad;
        auto readOne = [&](const char *name, bool is_error) {
            const auto v = root.read(base + name);
            if (!v || v->empty() || v->find_first_not_of("0123456789") != std::string::npos) {
                missing.push_back(name);
                return;
            }
            shown.push_back(std::string(name) + "=" + *v);
            if (is_error && *v != "0") {
                bad.push_back(std::string(name) + "=" + *v);
            }
        };
        for (const char *c : kCongestion) {
            readOne(c, false);
        }
        for (const char *c : kErrors) {
            readOne(c, true);
        }
        std::string detail = shown.empty()
                                 ? "no hw_counters could be read under " + root.pathOf(base)
                                 : join(shown, " ");
        if (!missing.empty() && !shown.empty()) {
            detail += " (unreadable: " + join(missing) + ")";
        }
        if (shown.empty()) {
            out->push_back(make("counters", S::kWarn, detail,
                                "load the driver's RDMA counters (mlx5_ib exposes hw_counters)"));
        } else if (!bad.empty()) {
            out->push_back(
                make("counters", S::kWarn,
                     detail + ": " + join(bad) + " since boot mean drops or timeouts on the path",
                     "check PFC on priority " + std::to_string(cfg.fabric.pfc_priority) +
                         " end to end (NIC and every switch port) and the pause counters; watch "
                         "growth with `watch -d grep . " +
                         root.pathOf(base) + "*`"));
        } else {
            out->push_back(make("counters", S::kOk, detail));
        }
    }

    // PFC pause frames as ethtool reports them.
    if (t.netdev.empty()) {
        out->push_back(make("pause", S::kWarn, "no netdev: pause counters not read",
                            "set [fabric] netdev in the file"));
        return;
    }
    const auto stats = env.run ? env.run({"ethtool", "-S", t.netdev}) : std::nullopt;
    if (!stats) {
        out->push_back(
            make("pause", S::kWarn,
                 "pause counters could not be read: `ethtool -S " + t.netdev + "` could not be run",
                 "apt-get install ethtool"));
        return;
    }
    const auto counters = parsePauseCounters(*stats);
    if (counters.empty()) {
        out->push_back(make(
            "pause", S::kWarn, "`ethtool -S " + t.netdev + "` shows no pause counters",
            "check the driver's statistics names (`ethtool -S " + t.netdev + " | grep -i pause`)"));
        return;
    }
    std::vector<std::string> shown;
    const std::string prio = "prio" + std::to_string(cfg.fabric.pfc_priority) + "_";
    for (const auto &[name, value] : counters) {
        // The RoCE priority's counters always, the others only when not zero.
        if (name.find(prio) != std::string::npos || value != 0) {
            shown.push_back(name + "=" + std::to_string(value));
        }
    }
    out->push_back(make("pause", S::kOk,
                        shown.empty()
                            ? "all " + std::to_string(counters.size()) + " pause counters are 0"
                            : join(shown, " ")));
}

void checkPcie(const SysfsRoot &root, const CheckTarget &t, std::vector<Finding> *out) {
    const std::vector<GpuInfo> gpus = listNvidiaGpus(root);
    if (gpus.empty()) {
        out->push_back(make("pcie", S::kOk,
                            "no NVIDIA GPU visible under " + root.pathOf("bus/pci/devices") +
                                ": host memory only"));
        return;
    }
    const auto dev = t.device.empty() ? std::nullopt : readDevice(root, t.device);
    if (!dev || dev->pci_path.empty()) {
        out->push_back(
            make("pcie", S::kWarn,
                 std::to_string(gpus.size()) +
                     " GPU(s) but the NIC's PCI path is "
                     "unknown (no device, or its device link does not resolve)",
                 "fix the device finding first; `ls -l /sys/class/infiniband/*/device`"));
        return;
    }
    std::vector<std::string> parts;
    PciDistance best = PciDistance::kUnknown;
    for (const GpuInfo &g : gpus) {
        const PciDistance d = g.pci_path.empty() ? PciDistance::kUnknown
                                                 : pciDistance(root, g.pci_path, dev->pci_path);
        parts.push_back("GPU " + g.bdf + " " + toString(d));
        if (static_cast<int>(d) < static_cast<int>(best)) {
            best = d;
        }
    }
    const std::string detail = dev->name + " (" +
                               dev->pci_path.substr(dev->pci_path.rfind('/') + 1) +
                               "): " + join(parts) + " (as nvidia-smi topo -m)";
    if (best == PciDistance::kPix || best == PciDistance::kPxb) {
        out->push_back(make("pcie", S::kOk, detail));
    } else {
        out->push_back(make("pcie", S::kWarn,
                            detail + ": no GPU shares a PCIe switch with the NIC, so GPUDirect "
                                     "traffic crosses the CPU",
                            "use the NIC nearest the workers' GPUs ([fabric] device), or pin "
                            "workers to GPUs under " +
                                dev->name + "'s PCIe switch"));
    }
}

void checkGpuDirect(const SysfsRoot &root, const DiagEnvironment &env, std::vector<Finding> *out) {
    int major = 0;
    int minor = 0;
    const bool kernel_known = std::sscanf(env.kernel_release.c_str(), "%d.%d", &major, &minor) == 2;
    // dma-buf MRs: kernel 5.12 (ib_umem_dmabuf) and rdma-core 34 (ibv_reg_dmabuf_mr).
    const bool kernel_ok = kernel_known && (major > 5 || (major == 5 && minor >= 12));
    const bool verbs_ok = env.has_reg_dmabuf_mr.value_or(false);
    const bool peermem = root.exists("module/nvidia_peermem") || root.exists("module/nv_peer_mem");
    const bool gpus = !listNvidiaGpus(root).empty();
    const std::string kernel_text =
        "kernel " + (env.kernel_release.empty() ? std::string("unknown") : env.kernel_release) +
        (kernel_ok ? " (>= 5.12)" : " (dma-buf MRs need >= 5.12)");
    const std::string verbs_text =
        !env.has_reg_dmabuf_mr ? "libibverbs.so.1 not found"
                               : (verbs_ok ? "libibverbs has ibv_reg_dmabuf_mr"
                                           : "libibverbs lacks ibv_reg_dmabuf_mr (rdma-core < 34)");
    const std::string peermem_text =
        peermem ? "nvidia-peermem loaded" : "nvidia-peermem not loaded";
    const std::string detail = kernel_text + ", " + verbs_text + ", " + peermem_text;
    if (!gpus) {
        // Nothing to register: say what the host offers, not that GPU memory works.
        out->push_back(make("dmabuf", S::kOk,
                            "not applicable: no NVIDIA GPU visible (host memory only); " + detail));
    } else if (kernel_ok && verbs_ok) {
        out->push_back(make("dmabuf", S::kOk, "GPU memory registers as dma-buf: " + detail));
    } else if (peermem) {
        out->push_back(make("dmabuf", S::kWarn,
                            "no dma-buf MRs; GPU memory falls back to nvidia-peermem: " + detail,
                            "upgrade to kernel >= 5.12 and rdma-core >= 34 for dma-buf"));
    } else {
        out->push_back(make("dmabuf", gpus ? S::kFail : S::kWarn,
                            std::string(gpus ? "GPU memory cannot be registered"
                                             : "GPU memory could not be registered (no GPU seen)") +
                                ": neither dma-buf nor nvidia-peermem: " + detail,
                            "modprobe nvidia-peermem, or upgrade to kernel >= 5.12 and "
                            "rdma-core >= 34"));
    }
}

void checkMemlock(const config::Config &cfg, const DiagEnvironment &env,
                  std::vector<Finding> *out) {
    const std::string fix =
        "systemd: LimitMEMLOCK=infinity in the unit; a shell: `ulimit -l unlimited`; "
        "Kubernetes: run the sidecar privileged or with IPC_LOCK";
    if (!env.memlock_bytes) {
        out->push_back(make("memlock", S::kWarn, "RLIMIT_MEMLOCK could not be read", fix));
        return;
    }
    const uint64_t v = *env.memlock_bytes;
    if (v == UINT64_MAX) {
        out->push_back(make("memlock", S::kOk, "memlock unlimited"));
        return;
    }
    const std::string text = "memlock " + config::formatBytes(v);
    if (env.cap_ipc_lock.value_or(false)) {
        out->push_back(
            make("memlock", S::kOk,
                 text + ", lifted by CAP_IPC_LOCK (memory registration is not limited)"));
        return;
    }
    if (v >= cfg.limits.registered_bytes) {
        out->push_back(make("memlock", S::kOk,
                            text + " >= [limits] registered_bytes " +
                                config::formatBytes(cfg.limits.registered_bytes)));
        return;
    }
    out->push_back(make("memlock", S::kWarn,
                        text + " < [limits] registered_bytes " +
                            config::formatBytes(cfg.limits.registered_bytes) +
                            " and no CAP_IPC_LOCK: registering memory pins it and fails past the "
                            "limit",
                        fix));
}

}  // namespace tensorlane::sidecar
