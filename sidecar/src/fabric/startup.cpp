// checkStartup: one function for "would the sidecar start?", used by the sidecar at start and
// by --check-config, so the two cannot disagree.
#include "tensorlane/sidecar/startup.hpp"

#include <nlohmann/json.hpp>

#include "fabric/internal.hpp"
#include "key_file_status.hpp"

namespace tensorlane::sidecar {

namespace {

/// Whether this build has the verbs transport (it has: sidecar/src/transport/verbs). Kept as a
/// switch so --check-config and start agree on what a build without it would refuse.
constexpr bool kVerbsTransportBuilt = true;

std::string findingText(const Finding &f) {
    return "preflight " + f.check + ": " + f.detail +
           (f.fix.empty() ? "" : " (fix: " + f.fix + ")");
}

}  // namespace

Status StartupReport::status() const {
    if (errors.empty()) {
        return Status::ok();
    }
    std::string msg;
    for (const std::string &e : errors) {
        msg += msg.empty() ? e : "; " + e;
    }
    return {Code::kInvalid, msg};
}

StartupReport checkStartup(const config::Config &cfg, const SysfsRoot &root,
                           const DiagEnvironment &env) {
    StartupReport r;
    const bool has_peers = cfg.hasPeers();
    const bool explicit_verbs = cfg.fabric.transport == config::TransportKind::kVerbs;

    // The peer key: the parser checks the file's existence and mode; its content (length) is
    // checked here, as the peer manager reads it at start (the same reader, the same words).
    // An etcd directory's peers all use the shared key.
    bool shared_key_used = cfg.directory.kind == config::DirectoryKind::kEtcd;
    for (const auto &peer : cfg.peers) {
        config::KeyBytes key;
        if (peer.key_file.empty()) {
            shared_key_used = true;
        } else if (Status s = readPeerKeyFile(peer.key_file, &key); !s.isOk()) {
            r.errors.push_back("[[peers]] '" + peer.name + "' key_file: " + s.message());
        }
    }
    if (shared_key_used) {
        config::KeyBytes key;
        if (Status s = readPeerKeyFile(cfg.security.peer_key_file, &key); !s.isOk()) {
            r.errors.push_back("[security] peer_key_file: " + s.message());
        }
    }

    r.transport = config::resolveTransport(cfg, root.path());
    r.peer_transport = r.transport.kind;
    if (r.transport.kind == config::TransportKind::kVerbs) {
        FabricSelection sel;
        if (Status s = selectFabric(cfg, root, &sel); s.isOk()) {
            r.fabric = std::move(sel);
        } else {
            r.fabric_error = s.message();
        }
        if (!r.fabric) {
            if (!has_peers) {
                r.warnings.push_back("the RDMA fabric is unusable (" + r.fabric_error +
                                     "); no [[peers]] are configured, so it is not needed");
            } else if (explicit_verbs) {
                r.errors.push_back("[fabric] transport = \"verbs\", but the fabric is unusable: " +
                                   r.fabric_error);
            } else {
                r.warnings.push_back("transport auto: an RDMA port is up but unusable (" +
                                     r.fabric_error + "): peers use tcp");
                r.peer_transport = config::TransportKind::kTcp;
            }
        }
        if (has_peers && !kVerbsTransportBuilt &&
            r.peer_transport == config::TransportKind::kVerbs) {
            if (explicit_verbs) {
                r.errors.push_back(
                    "[fabric] transport = \"verbs\": the verbs (RoCE) transport is not in this "
                    "build yet; set transport = \"tcp\" or \"auto\"");
            } else {
                r.warnings.push_back("transport auto found an RDMA device (" + r.transport.reason +
                                     "), but the verbs transport is not in this build yet: peers "
                                     "use tcp");
                r.peer_transport = config::TransportKind::kTcp;
            }
        }
        if (!has_peers) {
            r.peer_transport = config::TransportKind::kTcp;  // no remote peer uses any transport
        }

        // Preflight: the diag findings, fatal when [fabric] preflight = "fail".
        const DiagReport diag = runDiag(cfg, root, env);
        r.preflight_ran = true;
        r.preflight = diag.findings;
        const bool fatal = cfg.fabric.preflight == config::Preflight::kFail;
        for (const Finding &f : diag.findings) {
            if (f.status == FindingStatus::kFail && fatal) {
                r.errors.push_back(findingText(f) + " ([fabric] preflight = \"fail\")");
            } else if (f.status != FindingStatus::kOk) {
                r.warnings.push_back(findingText(f));
            }
        }
    }
    return r;
}

StartupReport checkStartup(const config::Config &cfg) {
    return checkStartup(cfg, SysfsRoot::fromEnvironment(), DiagEnvironment::host());
}

void logStartupReport(const StartupReport &report) {
    spdlog::logger &log = fabricLog();
    if (report.fabric) {
        const FabricSelection &s = *report.fabric;
        log.info("fabric: {}", s.summary());
        log.info("fabric: {}", s.device_reason);
        log.info("fabric: {}", s.gid_reason);
        log.info("fabric: {}", s.mtu_reason);
        log.info("fabric: {}", s.tclass_reason);
    }
    for (const std::string &w : report.warnings) {
        log.warn("{}", w);
    }
    for (const std::string &e : report.errors) {
        log.error("{}", e);
    }
}

std::string startupText(const StartupReport &report) {
    if (report.transport.kind != config::TransportKind::kVerbs) {
        return {};
    }
    std::string out = "\n[fabric selection]\n";
    if (!report.fabric) {
        out += "error = " + report.fabric_error + "\n";
    } else {
        const FabricSelection &s = *report.fabric;
        out += "device = " + s.device + " port " + std::to_string(s.port) + " (" + s.device_reason +
               ")\n";
        out += "netdev = " + s.netdev + "\n";
        out += "port_state = " + s.port_state + "\n";
        out += "gid_index = " + std::to_string(s.gid_index) + " (" + s.gid_reason + ")\n";
        out += "gid = " + s.gid_text + " (" + s.gid.address() + ")\n";
        out += "roce_version = " + std::string(toString(s.roce_version)) + "\n";
        out += "path_mtu = " + std::to_string(s.path_mtu) + " (" + s.mtu_reason + ")\n";
        out += "traffic_class = " + std::to_string(s.traffic_class) + " (" +
               toString(s.tclass_source) + ": " + s.tclass_reason + ")\n";
    }
    out += "peer_transport = " + std::string(config::toString(report.peer_transport)) + "\n";
    if (report.preflight_ran) {
        size_t counts[3] = {0, 0, 0};
        for (const Finding &f : report.preflight) {
            ++counts[static_cast<int>(f.status)];
        }
        out += "preflight = " + std::to_string(counts[0]) + " ok, " + std::to_string(counts[1]) +
               " warn, " + std::to_string(counts[2]) + " fail (details: tensorlane diag)\n";
    }
    out.pop_back();
    return out;
}

std::string startupJson(const StartupReport &report) {
    using OrderedJson = nlohmann::ordered_json;
    OrderedJson j;
    j["ok"] = report.ok();
    j["peer_transport"] = config::toString(report.peer_transport);
    j["fabric_selection"] =
        report.transport.kind == config::TransportKind::kVerbs
            ? OrderedJson::parse(selectionJson(report.fabric, report.fabric_error))
            : OrderedJson(nullptr);
    OrderedJson pf = OrderedJson::array();
    for (const Finding &f : report.preflight) {
        pf.push_back({{"check", f.check},
                      {"status", toString(f.status)},
                      {"detail", f.detail},
                      {"fix", f.fix}});
    }
    j["preflight"] = std::move(pf);
    j["errors"] = report.errors;
    j["warnings"] = report.warnings;
    return j.dump(2, ' ', false, OrderedJson::error_handler_t::replace);
}

}  // namespace tensorlane::sidecar
