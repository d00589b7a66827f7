#include "transport/set.hpp"

#include <algorithm>

#include "net/connection.hpp"

namespace tensorlane::sidecar {

// ----- Transport's defaults (a transport with no sessions to peers)

std::vector<uint8_t> Transport::localBlob(PeerId, SessionSide) {
    return {};
}

Status Transport::openSession(PeerId, SessionSide, const SessionInfo &, uint32_t *channels) {
    *channels = 0;
    return {Code::kInvalid, std::string("the ") + name() + " transport does not reach peers"};
}

void Transport::closeSession(PeerId, SessionSide, Code, const std::string &) {}

void Transport::adoptChannel(PeerId, SessionSide, uint32_t, std::unique_ptr<Connection> conn) {
    conn->close();
}

TransportPeerReport Transport::peerReport(PeerId, ReportDetail) const {
    TransportPeerReport r;
    r.transport = name();
    return r;
}

// ----- TransportSet

void TransportSet::add(std::unique_ptr<Transport> t) {
    Transport *raw = t.get();
    const TransportCaps c = raw->caps();
    owned_.push_back(std::move(t));
    all_.push_back(raw);
    if (c.local && local_ == nullptr) {
        local_ = raw;
    }
    if (c.remote) {
        remote_.push_back(raw);
    }
}

Transport *TransportSet::byWireId(uint32_t id) const {
    for (Transport *t : remote_) {
        if (t->caps().wire_id == id) {
            return t;
        }
    }
    return nullptr;
}

void TransportSet::bind(PeerId peer, Transport *t) {
    if (peer >= bound_.size()) {
        bound_.resize(peer + 1);
    }
    bound_[peer] = Binding{t, {}};
}

void TransportSet::unbind(PeerId peer, std::string why) {
    if (peer >= bound_.size()) {
        bound_.resize(peer + 1);
    }
    bound_[peer] = Binding{nullptr, std::move(why)};
}

void TransportSet::clear() {
    bound_.clear();
    remote_.clear();
    all_.clear();
    local_ = nullptr;
    // The last added first: a remote transport may hold regions the local one also knows.
    while (!owned_.empty()) {
        owned_.pop_back();
    }
}

Status TransportSet::notBound(PeerId peer) const {
    if (peer == kLocalPeer) {
        return {Code::kInternal, "no local transport"};
    }
    if (peer < bound_.size() && !bound_[peer].down_reason.empty()) {
        return {Code::kPeer, bound_[peer].down_reason};
    }
    return {Code::kPeer, "peer " + std::to_string(peer) + " is not a remote peer"};
}

Status TransportSet::registerRegion(Region &r) const {
    for (Transport *t : all_) {
        if (Status s = t->registerRegion(r); !s.isOk()) {
            return s;
        }
    }
    return Status::ok();
}

void TransportSet::deregisterRegion(RegionId r) const {
    for (Transport *t : all_) {
        t->deregisterRegion(r);
    }
}

}  // namespace tensorlane::sidecar
