// The engine's connected clients: every Session by id, the order the request path visits them,
// and the ones closed and waiting to be torn down. Owned by the engine; the control server adds
// and tears down sessions, the request pipeline and the region lifecycle find them. Engine
// thread only.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "session.hpp"

namespace tensorlane::sidecar {

class SessionTable {
public:
    using Map = std::unordered_map<SessionId, std::unique_ptr<Session>>;

    SessionTable() = default;
    SessionTable(const SessionTable &) = delete;
    SessionTable &operator=(const SessionTable &) = delete;

    /// The session, or nullptr (it was torn down, or never was).
    Session *find(SessionId id) {
        auto it = sessions_.find(id);
        return it == sessions_.end() ? nullptr : it->second.get();
    }
    const Session *find(SessionId id) const {
        auto it = sessions_.find(id);
        return it == sessions_.end() ? nullptr : it->second.get();
    }
    /// A fresh id for a new session (never reused).
    SessionId nextId() { return next_id_++; }
    /// Adds a new session, last in the request path's order.
    Session &add(std::unique_ptr<Session> s) {
        Session &ref = *s;
        active_.push_back(s.get());
        sessions_.emplace(ref.id, std::move(s));
        return ref;
    }
    /// Marks `s` closing with `reason` (the first reason stays) and queues it for teardown:
    /// nothing is served for it from now on, and it is torn down between two loop turns.
    void close(Session &s, std::string reason) {
        if (s.closing) {
            return;
        }
        s.closing = true;
        s.close_reason = std::move(reason);
        closed_.push_back(s.id);
    }
    bool anyClosed() const { return !closed_.empty(); }
    /// The sessions close() queued since the last call.
    std::vector<SessionId> takeClosed() {
        std::vector<SessionId> ids;
        ids.swap(closed_);
        return ids;
    }
    /// Removes and destroys the session (its fds close, its segment is unmapped).
    void erase(SessionId id) {
        auto it = sessions_.find(id);
        if (it == sessions_.end()) {
            return;
        }
        active_.erase(std::remove(active_.begin(), active_.end(), it->second.get()), active_.end());
        sessions_.erase(it);
    }
    /// Every session, in the request path's order. Only add() and erase() change it, so an
    /// index loop over it survives handlers that close sessions.
    const std::vector<Session *> &active() const { return active_; }
    size_t size() const { return sessions_.size(); }
    Map::const_iterator begin() const { return sessions_.begin(); }
    Map::const_iterator end() const { return sessions_.end(); }
    /// Destroys every session (the engine's teardown).
    void clear() {
        active_.clear();
        sessions_.clear();
    }

private:
    Map sessions_;
    std::vector<Session *> active_;
    std::vector<SessionId> closed_;
    SessionId next_id_ = 1;
};

}  // namespace tensorlane::sidecar
