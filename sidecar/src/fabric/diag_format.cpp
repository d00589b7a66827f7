// diagText / diagJson / selectionJson: the report for operators and for scripts.
#include <nlohmann/json.hpp>
#include <sstream>

#include "tensorlane/sidecar/diag.hpp"

namespace tensorlane::sidecar {

namespace {

using DiagJson = nlohmann::ordered_json;

FindingStatus worst(const std::vector<Finding> &findings) {
    FindingStatus w = FindingStatus::kOk;
    for (const Finding &f : findings) {
        if (static_cast<int>(f.status) > static_cast<int>(w)) {
            w = f.status;
        }
    }
    return w;
}

/// The selection's keys; null values when there is no selection.
void putSelection(DiagJson &j, const std::optional<FabricSelection> &s) {
    if (!s) {
        for (const char *k : {"device", "port", "netdev", "gid_index", "gid", "gid_address",
                              "roce_version", "traffic_class", "traffic_class_source", "netdev_mtu",
                              "active_mtu", "path_mtu", "port_state"}) {
            j[k] = nullptr;
        }
        return;
    }
    j["device"] = s->device;
    j["port"] = s->port;
    j["netdev"] = s->netdev;
    j["gid_index"] = s->gid_index;
    j["gid"] = s->gid_text;
    j["gid_address"] = s->gid.address();
    j["roce_version"] = toString(s->roce_version);
    j["traffic_class"] = s->traffic_class;
    j["traffic_class_source"] = toString(s->tclass_source);
    j["netdev_mtu"] = s->netdev_mtu;
    j["active_mtu"] = s->active_mtu;
    j["path_mtu"] = s->path_mtu;
    j["port_state"] = s->port_state;
}

}  // namespace

std::string selectionJson(const std::optional<FabricSelection> &selection,
                          const std::string &error) {
    DiagJson j;
    if (!selection) {
        j["error"] = error;
        return j.dump(2, ' ', false, DiagJson::error_handler_t::replace);
    }
    putSelection(j, selection);
    j["reasons"] = {{"device", selection->device_reason},
                    {"gid", selection->gid_reason},
                    {"mtu", selection->mtu_reason},
                    {"traffic_class", selection->tclass_reason}};
    return j.dump(2, ' ', false, DiagJson::error_handler_t::replace);
}

std::string diagJson(const DiagReport &report) {
    DiagJson j;
    j["config"] = report.config_source;
    j["sysfs_root"] = report.sysfs_root;
    j["transport"] = config::toString(report.transport.kind);
    j["transport_reason"] = report.transport.reason;
    putSelection(j, report.selection);
    j["selection_error"] = report.selection ? DiagJson(nullptr) : DiagJson(report.selection_error);
    j["status"] = toString(worst(report.findings));
    DiagJson findings = DiagJson::array();
    for (const Finding &f : report.findings) {
        findings.push_back({{"check", f.check},
                            {"status", toString(f.status)},
                            {"detail", f.detail},
                            {"fix", f.fix}});
    }
    j["findings"] = std::move(findings);
    // Replace invalid UTF-8 (a sysfs file can hold anything) instead of throwing.
    return j.dump(2, ' ', false, DiagJson::error_handler_t::replace);
}

std::string diagText(const DiagReport &report) {
    std::ostringstream os;
    os << "tensorlane diag: " << report.config_source << ", sysfs " << report.sysfs_root << "\n";
    os << "transport: " << config::toString(report.transport.kind) << " ("
       << report.transport.reason << ")\n";
    if (report.selection) {
        os << "selection: " << report.selection->summary() << "\n";
    } else {
        os << "selection: none: " << report.selection_error << "\n";
    }
    os << "\n";
    size_t counts[3] = {0, 0, 0};
    for (const Finding &f : report.findings) {
        ++counts[static_cast<int>(f.status)];
        const char *tag = f.status == FindingStatus::kOk     ? "[ ok ]"
                          : f.status == FindingStatus::kWarn ? "[warn]"
                                                             : "[FAIL]";
        std::string check = f.check;
        check.resize(std::max<size_t>(check.size(), 13), ' ');
        os << tag << " " << check << " " << f.detail << "\n";
        if (!f.fix.empty() && f.status != FindingStatus::kOk) {
            os << "       " << std::string(13, ' ') << " fix: " << f.fix << "\n";
        }
    }
    os << "\n"
       << counts[0] << " ok, " << counts[1] << " warn, " << counts[2] << " fail"
       << (counts[2] != 0 ? " (exit status 1)" : "");
    return os.str();
}

}  // namespace tensorlane::sidecar
