// runDiag: the fabric selection step by step, then the host checks, as findings.
#include <dlfcn.h>
#include <sys/resource.h>
#include <sys/utsname.h>

#include <algorithm>
#include <fstream>

#include "fabric/checks.hpp"
#include "fabric/internal.hpp"
#include "tensorlane/sidecar/diag.hpp"

namespace tensorlane::sidecar {

namespace {

using S = FindingStatus;

/// Unused entries are most of a real table (mlx5 has 255); they are counted, not listed.
std::string gidTableText(const std::vector<GidEntry> &table) {
    std::string out;
    size_t empty = 0;
    for (const GidEntry &e : table) {
        if (e.problem == "empty") {
            ++empty;
            continue;
        }
        out += out.empty() ? "" : ", ";
        out += std::to_string(e.index) + " ";
        if (e.gid && e.problem.empty()) {
            out += e.gid->address() + " " + toString(e.version) + " " +
                   (e.netdev.empty() ? std::string("(netdev unreadable)") : e.netdev);
        } else {
            out += "(" + e.problem + ")";
        }
    }
    if (empty != 0) {
        out += (out.empty() ? "" : ", ") + std::to_string(empty) + " empty";
    }
    return out.empty() ? "no entries" : out;
}

std::string stageName(SelectStage s) {
    switch (s) {
        case SelectStage::kDevice:
            return "device";
        case SelectStage::kPort:
            return "port";
        case SelectStage::kGid:
            return "gid";
        case SelectStage::kMtu:
            return "mtu";
        case SelectStage::kTrafficClass:
            return "traffic_class";
        case SelectStage::kDone:
            break;
    }
    return "done";
}

/// The finding of one selection step: ok/detail when it passed, the error when it failed,
/// "not checked" when an earlier step failed.
Finding stepFinding(const char *check, SelectStage step, SelectStage failed_at,
                    const std::string &error, std::string ok_detail, std::string fail_fix) {
    if (static_cast<int>(failed_at) > static_cast<int>(step)) {
        return make(check, S::kOk, std::move(ok_detail));
    }
    if (failed_at == step) {
        return make(check, S::kFail, error, std::move(fail_fix));
    }
    return make(check, S::kWarn, "not checked: the " + stageName(failed_at) + " check failed",
                "fix the " + stageName(failed_at) + " finding first");
}

bool hasCapIpcLock() {
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("CapEff:", 0) == 0) {
            const uint64_t caps = std::stoull(line.substr(7), nullptr, 16);
            constexpr int kCapIpcLock = 14;  // linux/capability.h
            return (caps >> kCapIpcLock & 1) != 0;
        }
    }
    return false;
}

}  // namespace

const char *toString(FindingStatus s) {
    switch (s) {
        case FindingStatus::kOk:
            return "ok";
        case FindingStatus::kWarn:
            return "warn";
        case FindingStatus::kFail:
            return "fail";
    }
    return "fail";
}

bool DiagReport::failed() const {
    return std::any_of(findings.begin(), findings.end(),
                       [](const Finding &f) { return f.status == FindingStatus::kFail; });
}

DiagEnvironment DiagEnvironment::host() {
    DiagEnvironment env;
    env.run = [](const std::vector<std::string> &argv) -> std::optional<std::string> {
        CommandOutput r = runCommand(argv);
        if (!r.ok()) {
            return std::nullopt;
        }
        return std::move(r.out);
    };
    rlimit lim{};
    if (::getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
        env.memlock_bytes = lim.rlim_cur == RLIM_INFINITY ? UINT64_MAX : lim.rlim_cur;
    }
    env.cap_ipc_lock = hasCapIpcLock();
    utsname u{};
    if (::uname(&u) == 0) {
        env.kernel_release = u.release;
    }
    // dlopen rather than linking: diag must run where rdma-core is absent, and say so.
    if (void *h = ::dlopen("libibverbs.so.1", RTLD_LAZY | RTLD_LOCAL)) {
        env.has_reg_dmabuf_mr = ::dlsym(h, "ibv_reg_dmabuf_mr") != nullptr;
        ::dlclose(h);
    }
    return env;
}

namespace {

// The peer probe needs the running sidecar (its sessions to the peers): `tensorlane diag` sets
// probe_peer; the sidecar's own preflight, which runs before it has any, does not.
void addPeerFindings(const config::Config &cfg, const DiagEnvironment &env,
                     std::vector<Finding> *out) {
    if (cfg.peers.empty()) {
        return;
    }
    if (env.probe_peer) {
        for (const config::PeerConfig &p : cfg.peers) {
            out->push_back(env.probe_peer(p));
        }
    } else {
        out->push_back(make("peers", FindingStatus::kOk,
                            std::to_string(cfg.peers.size()) +
                                " peer(s) configured; `tensorlane diag` probes each with a "
                                "write with immediate while the sidecar runs",
                            ""));
    }
}

// The etcd directory's state, from the running sidecar where `tensorlane diag` can ask it. It
// matters over any transport, so both the tcp and the verbs paths of runDiag add it.
void addDirectoryFinding(const config::Config &cfg, const DiagEnvironment &env,
                         std::vector<Finding> *out) {
    if (cfg.directory.kind != config::DirectoryKind::kEtcd) {
        return;
    }
    if (env.probe_directory) {
        out->push_back(env.probe_directory());
    } else {
        out->push_back(make("directory", FindingStatus::kOk,
                            "etcd directory, cluster '" + cfg.directory.cluster +
                                "'; `tensorlane diag` shows its state while the sidecar runs",
                            ""));
    }
}

}  // namespace

DiagReport runDiag(const config::Config &cfg, const SysfsRoot &root, const DiagEnvironment &env) {
    const config::FabricConfig &f = cfg.fabric;
    DiagReport r;
    r.config_source = cfg.source;
    r.sysfs_root = root.path();
    r.transport = config::resolveTransport(cfg, root.path());
    std::vector<Finding> &out = r.findings;
    const bool verbs = r.transport.kind == config::TransportKind::kVerbs;

    if (f.transport == config::TransportKind::kTcp) {
        out.push_back(make("transport", S::kOk,
                           "transport = \"tcp\" in the file: the sidecar does not use the RDMA "
                           "NIC"));
    } else if (!verbs) {
        out.push_back(make("transport", S::kWarn,
                           "transport auto resolves to tcp: " + r.transport.reason,
                           "bring an RDMA port up (see the findings below) or set transport = "
                           "\"tcp\" to say tcp is meant"));
    } else {
        out.push_back(make("transport", S::kOk, "verbs: " + r.transport.reason));
    }

    // devices
    const std::vector<DeviceInfo> devices = listDevices(root);
    if (!verbs && (f.transport == config::TransportKind::kTcp || devices.empty())) {
        // Issue 24: on a tcp host the RDMA checks only repeat, a dozen times over, that there
        // is no device (or that it is not used). Said once; what matters over tcp stays.
        if (devices.empty() && f.transport != config::TransportKind::kTcp) {
            out.push_back(make("devices", S::kWarn,
                               "no RDMA device under " + root.pathOf("class/infiniband"),
                               "load the NIC's RDMA driver (`modprobe mlx5_ib`) and check `rdma "
                               "link show`; in a container, mount the host's "
                               "/sys/class/infiniband"));
        }
        out.push_back(make("rdma", S::kOk,
                           std::string("skipped (device, port, gid, roce_version, netdev, mtu, "
                                       "traffic_class, trust, dscp_map, pfc, ecn, counters, "
                                       "pause, dmabuf): ") +
                               (f.transport == config::TransportKind::kTcp
                                    ? "transport = \"tcp\" does not use the RDMA NIC"
                                    : "there is no RDMA device; peers use tcp")));
        r.selection_error = f.transport == config::TransportKind::kTcp
                                ? "not made: transport = \"tcp\""
                                : "not made: " + r.transport.reason;
        CheckTarget none;
        checkPcie(root, none, &out);
        checkMemlock(cfg, env, &out);
        addPeerFindings(cfg, env, &out);
        addDirectoryFinding(cfg, env, &out);
        return r;
    }
    if (devices.empty()) {
        out.push_back(make("devices", S::kFail,
                           "no RDMA device under " + root.pathOf("class/infiniband"),
                           "load the NIC's RDMA driver (`modprobe mlx5_ib`) and check `rdma "
                           "link show`; in a container, mount the host's /sys/class/infiniband"));
    } else {
        std::string detail;
        for (const DeviceInfo &d : devices) {
            detail += detail.empty() ? "" : "; ";
            detail += d.name;
            if (!d.hca_type.empty() || !d.fw_ver.empty()) {
                detail += " (" + d.hca_type + (d.hca_type.empty() || d.fw_ver.empty() ? "" : ", ") +
                          (d.fw_ver.empty() ? "" : "fw " + d.fw_ver) + ")";
            }
            for (const PortInfo &p : d.ports) {
                detail += " port " + std::to_string(p.port) + " " + p.state + " " + p.link_layer;
            }
        }
        out.push_back(make("devices", S::kOk, detail));
    }

    // The selection, one finding per step.
    FabricSelection sel;
    SelectStage stage = SelectStage::kDevice;
    const Status st = selectFabricStaged(cfg, root, &sel, &stage);
    if (st.isOk()) {
        r.selection = sel;
    } else {
        r.selection_error = st.message();
    }
    CheckTarget t;
    t.port = f.port;
    t.device = !sel.device.empty()   ? sel.device
               : f.device != "auto"  ? f.device
               : devices.size() == 1 ? devices.front().name
                                     : std::string();
    t.netdev = sel.netdev;
    const auto dev = t.device.empty() ? std::nullopt : readDevice(root, t.device);
    if (t.netdev.empty() && f.netdev != "auto") {
        t.netdev = f.netdev;
    }
    if (t.netdev.empty() && dev) {
        const std::vector<std::string> nds = portNetdevs(root, *dev, f.port);
        t.netdev = nds.empty() ? "" : nds.front();
    }
    t.dscp = r.selection ? static_cast<uint8_t>(r.selection->traffic_class >> 2) : f.dscp;
    const std::string nd_text = t.netdev.empty() ? std::string("IFACE") : t.netdev;

    out.push_back(stepFinding("device", SelectStage::kDevice, stage, r.selection_error,
                              sel.device_reason,
                              "set [fabric] device (and port) to the RoCE port to use; `rdma "
                              "link show` lists them"));
    {
        const PortInfo *p = dev ? dev->findPort(f.port) : nullptr;
        std::string ok_detail = p == nullptr ? std::string()
                                             : t.device + " port " + std::to_string(f.port) + " " +
                                                   p->state + " (" + p->phys_state +
                                                   (p->rate.empty() ? "" : ", " + p->rate) + "), " +
                                                   p->link_layer;
        out.push_back(stepFinding("port", SelectStage::kPort, stage, r.selection_error,
                                  std::move(ok_detail),
                                  "check the cable and the switch port; `ip link set dev " +
                                      nd_text + " up`; `rdma link show`"));
    }
    {
        const std::string table =
            t.device.empty() ? std::string()
                             : "GID table of " + t.device + " port " + std::to_string(f.port) +
                                   ": " + gidTableText(readGidTable(root, t.device, f.port));
        Finding g = stepFinding("gid", SelectStage::kGid, stage, r.selection_error,
                                sel.gid_reason + (table.empty() ? "" : "; " + table),
                                f.gid_index ? "set [fabric] gid_index = \"auto\" or to a RoCE v2 "
                                              "index of " +
                                                  nd_text + " (`show_gids`)"
                                            : "give " + nd_text +
                                                  " an IPv4 address (`ip addr add "
                                                  "ADDR/LEN dev " +
                                                  nd_text +
                                                  "`) so the kernel adds "
                                                  "its RoCE v2 GID");
        if (g.status == S::kFail && !table.empty()) {
            g.detail += "; " + table;
        }
        out.push_back(std::move(g));
    }
    if (r.selection) {
        out.push_back(make(
            "roce_version", S::kOk,
            "GID " + std::to_string(sel.gid_index) + " is RoCE " + toString(sel.roce_version)));
    } else if (stage == SelectStage::kGid && f.gid_index) {
        const auto table = readGidTable(root, t.device, f.port);
        const auto it = std::find_if(table.begin(), table.end(),
                                     [&](const GidEntry &e) { return e.index == *f.gid_index; });
        const bool v1 = it != table.end() && it->version == RoceVersion::kV1;
        out.push_back(make("roce_version", v1 ? S::kFail : S::kWarn,
                           v1 ? "GID " + std::to_string(*f.gid_index) +
                                    " is RoCE v1 (Ethernet-only, not routable over IP)"
                              : std::string("unknown: no GID selected"),
                           v1 ? "set [fabric] gid_index to a RoCE v2 entry, or \"auto\"" : ""));
    } else {
        out.push_back(make("roce_version", S::kWarn, "unknown: no GID selected"));
    }

    // netdev
    if (!t.netdev.empty()) {
        const NetdevInfo nd = readNetdev(root, t.netdev);
        if (!nd.exists) {
            out.push_back(make("netdev", S::kFail,
                               t.netdev + " does not exist under " + root.pathOf("class/net"),
                               "set [fabric] netdev to the RoCE interface (`ip link show`)"));
        } else if (nd.operstate != "up") {
            out.push_back(
                make("netdev", S::kWarn,
                     t.netdev + " is " +
                         (nd.operstate.empty() ? std::string("of unreadable state") : nd.operstate),
                     "ip link set dev " + t.netdev + " up"));
        } else {
            out.push_back(make("netdev", S::kOk,
                               t.netdev + " up" +
                                   (nd.mtu ? ", MTU " + std::to_string(*nd.mtu) : std::string()) +
                                   (nd.address.empty() ? "" : ", " + nd.address)));
        }
    } else {
        out.push_back(make("netdev", S::kWarn, "no netdev found for the port",
                           "set [fabric] netdev in the file"));
    }

    // mtu
    {
        Finding m = stepFinding(
            "mtu", SelectStage::kMtu, stage, r.selection_error, sel.mtu_reason,
            "ip link set dev " + nd_text + " mtu " + std::to_string(f.mtu + kRoceHeaderBytes));
        if (m.status == S::kOk && (sel.netdev_mtu == 0 || sel.active_mtu < f.mtu)) {
            m.status = S::kWarn;
            m.fix = sel.netdev_mtu == 0
                        ? "check `ip link show " + sel.netdev + "`"
                        : "ip link set dev " + sel.netdev + " mtu " +
                              std::to_string(f.mtu + kRoceHeaderBytes) +
                              " (and on every switch port), or set [fabric] mtu = " +
                              std::to_string(sel.active_mtu);
        }
        out.push_back(std::move(m));
    }

    // traffic_class
    {
        const std::string tc_path = t.device.empty()
                                        ? std::string("class/infiniband/DEV/tc/1/traffic_class")
                                        : readTclassOverride(root, t.device, f.port).rel_path;
        Finding c = stepFinding("traffic_class", SelectStage::kTrafficClass, stage,
                                r.selection_error, sel.tclass_reason,
                                "echo -1 > " + root.pathOf(tc_path) +
                                    " (clear the override), or set [fabric] tclass_override = "
                                    "\"adopt\"");
        if (c.status == S::kOk && r.selection) {
            if (sel.tclass_source == TclassSource::kHostOverride) {
                c.status = S::kWarn;
                c.fix = "set [fabric] dscp/ecn to match (dscp = " +
                        std::to_string(sel.traffic_class >> 2) + "), or clear the override";
            } else if (sel.tclass_reason.find(" is unreadable") != std::string::npos ||
                       sel.tclass_reason.find("not understood") != std::string::npos) {
                c.status = S::kWarn;
                c.fix = "cat " + root.pathOf(tc_path);
            }
        }
        out.push_back(std::move(c));
    }

    checkQos(cfg, t, env, &out);
    checkEcn(cfg, root, t, &out);
    checkCounters(cfg, root, t, env, &out);
    checkPcie(root, t, &out);
    checkGpuDirect(root, env, &out);
    checkMemlock(cfg, env, &out);

    addPeerFindings(cfg, env, &out);
    addDirectoryFinding(cfg, env, &out);

    // A NIC the sidecar does not use cannot stop it: fabric failures become warnings (an
    // unreachable peer stays a failure: it matters over any transport).
    if (!verbs) {
        for (Finding &fd : out) {
            if (fd.status == S::kFail && fd.check != "memlock" && fd.check != "peer") {
                fd.status = S::kWarn;
                fd.detail += " (not fatal: transport is tcp)";
            }
        }
    }
    return r;
}

}  // namespace tensorlane::sidecar
