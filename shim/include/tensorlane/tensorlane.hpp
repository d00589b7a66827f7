// Header-only C++ RAII wrapper over the C ABI (tensorlane.h). Errors are values
// (tensorlane::Error), never exceptions, so it can be used in code built without them.
#pragma once

// The wrapper uses std::span and other C++20 parts; say so before they fail to parse. MSVC
// reports __cplusplus as 199711L unless /Zc:__cplusplus, so its own macro is asked there.
#if defined(_MSVC_LANG) ? _MSVC_LANG < 202002L : __cplusplus < 202002L
// Nothing else of the header is read, so the compiler shows this one line, not a page of
// std::span errors.
#error "tensorlane.hpp needs C++20: -std=c++20 (CMake: link tensorlane::shim); C: tensorlane.h"
#else

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tensorlane/tensorlane.h"

namespace tensorlane {

/// A failed call: its status and the shim's detail.
struct Error {
    tl_status status = TL_OK;
    std::string detail;
    const char *name() const { return tl_status_str(status); }
};

/// Either a value or an Error.
template <class T>
class Result {
public:
    Result(T v) : value_(std::move(v)) {}
    Result(Error e) : error_(std::move(e)) {}
    bool ok() const { return value_.has_value(); }
    explicit operator bool() const { return ok(); }
    T &operator*() { return *value_; }
    T *operator->() { return &*value_; }
    const Error &error() const { return error_; }
    tl_status status() const { return ok() ? TL_OK : error_.status; }

private:
    std::optional<T> value_;
    Error error_;
};

inline Error lastError(tl_status s) {
    return Error{s, tl_last_error()};
}

class Client;

/// What a write with a payload, a message or a grouped write carries besides its data
/// (tl_send_opts).
struct SendOptions {
    uint32_t imm = 0;
    std::span<const uint8_t> payload;  ///< at most TL_MAX_PAYLOAD bytes; read during the call
    /// The deadline from submission; 0: none.
    std::chrono::milliseconds timeout{0};
};

/// A notification with all it carries (tl_message), its payload as a vector.
struct Message {
    tl_notification_ex ex{};
    uint32_t kind = TL_NOTIFY_WRITE;  ///< TL_NOTIFY_*
    tl_status status = TL_OK;         ///< a failed group or deadline: why
    uint32_t entries = 0;
    std::vector<uint8_t> payload;
};

/// Who may write an exposed region besides its owner's uid and root (tl_access).
struct Access {
    bool peers = true;           ///< TL_ACCESS_PEERS: offered to the configured peers
    bool any_local = false;      ///< TL_ACCESS_LOCAL_ANY: every admitted local client
    std::vector<uint32_t> uids;  ///< other local uids allowed (at most TL_ACCESS_MAX_IDS)
    std::vector<uint32_t> gids;  ///< local clients with one of these groups
};

/// A registered region; deregistered when destroyed. Move-only.
class Region {
public:
    Region() = default;
    Region(Region &&o) noexcept
        : client_(std::exchange(o.client_, nullptr)),
          id_(std::exchange(o.id_, 0)),
          data_(std::exchange(o.data_, nullptr)),
          bytes_(std::exchange(o.bytes_, 0)) {}
    Region &operator=(Region &&o) noexcept {
        if (this != &o) {
            reset();
            client_ = std::exchange(o.client_, nullptr);
            id_ = std::exchange(o.id_, 0);
            data_ = std::exchange(o.data_, nullptr);
            bytes_ = std::exchange(o.bytes_, 0);
        }
        return *this;
    }
    Region(const Region &) = delete;
    Region &operator=(const Region &) = delete;
    ~Region() { reset(); }

    tl_region id() const { return id_; }
    size_t size() const { return bytes_; }
    /// The bytes of a host region.
    std::span<std::byte> bytes() const { return {static_cast<std::byte *>(data_), bytes_}; }
    /// The region as an array of T (host regions).
    template <class T>
    std::span<T> as() const {
        return {static_cast<T *>(data_), bytes_ / sizeof(T)};
    }
    void *data() const { return data_; }

    /// Makes the region writable under `name` by peers and this node's clients of the
    /// owner's uid (tl_expose).
    Result<bool> expose(const std::string &name) const;
    /// tl_expose_access: writable by whom `access` says (besides the owner's uid and root).
    Result<bool> expose(const std::string &name, const Access &access) const;

    /// Deregisters now (also frees a tl_alloc_host buffer).
    void reset() {
        if (client_ && id_) {
            tl_deregister(client_, id_);
        }
        client_ = nullptr;
        id_ = 0;
        data_ = nullptr;
        bytes_ = 0;
    }

private:
    friend class Client;
    Region(tl_client *c, tl_region id, void *data, size_t bytes)
        : client_(c), id_(id), data_(data), bytes_(bytes) {}
    tl_client *client_ = nullptr;
    tl_region id_ = 0;
    void *data_ = nullptr;
    size_t bytes_ = 0;
};

/// A peer's exposed region, from Client::lookup.
struct Remote {
    tl_remote id = 0;
    uint64_t bytes = 0;
};

/// One write in flight: a future of its status. Waiting consumes it.
class Ticket {
public:
    Ticket() = default;
    /// Waits for the write to end; TL_ETIMEDOUT leaves it pending.
    tl_status wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
        if (!client_) {
            return TL_EINVAL;
        }
        tl_status s = tl_wait(client_, id_, static_cast<int>(timeout.count()));
        if (s != TL_ETIMEDOUT) {
            client_ = nullptr;
        }
        return s;
    }
    /// The status once ended, or nullopt while pending.
    std::optional<tl_status> poll() {
        int done = 0;
        if (!client_) {
            return TL_EINVAL;
        }
        tl_status s = tl_test(client_, id_, &done);
        if (!done && s == TL_OK) {
            return std::nullopt;
        }
        client_ = nullptr;
        return s;
    }
    tl_ticket id() const { return id_; }

private:
    friend class Client;
    Ticket(tl_client *c, tl_ticket t) : client_(c), id_(t) {}
    tl_client *client_ = nullptr;
    tl_ticket id_ = 0;
};

/// One connection to the sidecar; disconnects when destroyed. Move-only.
class Client {
public:
    /// Connects (path empty: $TENSORLANE_SOCKET or the default).
    static Result<Client> connect(const std::string &socket_path = {}) {
        tl_client *c = nullptr;
        tl_status s = tl_connect(socket_path.empty() ? nullptr : socket_path.c_str(), &c);
        if (s != TL_OK) {
            return lastError(s);
        }
        return Client(c);
    }
    Client(Client &&o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
    Client &operator=(Client &&o) noexcept {
        if (this != &o) {
            tl_disconnect(c_);
            c_ = std::exchange(o.c_, nullptr);
        }
        return *this;
    }
    Client(const Client &) = delete;
    Client &operator=(const Client &) = delete;
    ~Client() { tl_disconnect(c_); }

    tl_client *get() const { return c_; }
    std::string nodeName() const { return tl_node_name(c_); }

    /// Host memory shared with the sidecar, registered.
    Result<Region> allocHost(size_t bytes) {
        void *p = nullptr;
        tl_region r = 0;
        tl_status s = tl_alloc_host(c_, bytes, &p, &r);
        if (s != TL_OK) {
            return lastError(s);
        }
        return Region(c_, r, p, bytes);
    }
    /// Registers part of a host buffer (or, with GPU support, device memory).
    Result<Region> registerMemory(void *p, size_t bytes) {
        tl_region r = 0;
        tl_status s = tl_register(c_, p, bytes, &r);
        if (s != TL_OK) {
            return lastError(s);
        }
        return Region(c_, r, p, bytes);
    }
    /// Registers [offset, offset + bytes) of a dma-buf (tl_register_dmabuf; the region has no
    /// pointer: data() is null). The caller keeps `fd`.
    Result<Region> registerDmabuf(int fd, uint64_t offset, uint64_t bytes) {
        tl_region r = 0;
        tl_status s = tl_register_dmabuf(c_, fd, offset, bytes, &r);
        if (s != TL_OK) {
            return lastError(s);
        }
        return Region(c_, r, nullptr, bytes);
    }
    Result<Remote> lookup(const std::string &peer, const std::string &name) {
        Remote out;
        tl_status s = tl_lookup(c_, peer.c_str(), name.c_str(), &out.id, &out.bytes);
        if (s != TL_OK) {
            return lastError(s);
        }
        return out;
    }
    Result<Ticket> write(const Region &src, uint64_t src_off, const Remote &dst, uint64_t dst_off,
                         uint64_t bytes, uint32_t imm) {
        tl_ticket t = 0;
        tl_status s = tl_write(c_, src.id(), src_off, dst.id, dst_off, bytes, imm, &t);
        if (s != TL_OK) {
            return lastError(s);
        }
        return Ticket(c_, t);
    }
    /// tl_write_msg: a write (bytes > 0) or a message (bytes 0) with a payload and deadline.
    Result<Ticket> writeMsg(const Region &src, uint64_t src_off, const Remote &dst,
                            uint64_t dst_off, uint64_t bytes, const SendOptions &o) {
        tl_send_opts opts = toOpts(o);
        tl_ticket t = 0;
        tl_status s = tl_write_msg(c_, src.id(), src_off, dst.id, dst_off, bytes, &opts, &t);
        if (s != TL_OK) {
            return lastError(s);
        }
        return Ticket(c_, t);
    }
    /// tl_write_msg of 0 bytes: the payload alone, notified at `dst_off` of `dst`.
    Result<Ticket> sendMessage(const Remote &dst, uint64_t dst_off, const SendOptions &o) {
        tl_send_opts opts = toOpts(o);
        tl_ticket t = 0;
        tl_status s = tl_write_msg(c_, 0, 0, dst.id, dst_off, 0, &opts, &t);
        if (s != TL_OK) {
            return lastError(s);
        }
        return Ticket(c_, t);
    }
    /// tl_write_group. `statuses` (empty, or one per entry) is written when the ticket ends,
    /// so it must outlive the ticket's wait. `notify` 0: entries[0]'s remote.
    Result<Ticket> writeGroup(std::span<const tl_group_entry> entries, const SendOptions &o,
                              std::span<tl_status> statuses = {}, tl_remote notify = 0) {
        tl_send_opts opts = toOpts(o);
        if (!statuses.empty()) {
            if (statuses.size() != entries.size()) {
                return Error{TL_EINVAL, "writeGroup: one status per entry, or none"};
            }
            opts.entry_status = statuses.data();
        }
        opts.notify = notify;
        tl_ticket t = 0;
        tl_status s = tl_write_group(c_, entries.data(), entries.size(), &opts, &t);
        if (s != TL_OK) {
            return lastError(s);
        }
        return Ticket(c_, t);
    }
    /// tl_wait_message: the next notification with its kind, status and payload.
    Result<Message> waitMessage(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
        tl_message m{};
        tl_status s = tl_wait_message(c_, &m, static_cast<int>(timeout.count()));
        if (s != TL_OK) {
            return lastError(s);
        }
        Message out;
        out.ex = m.ex;
        out.kind = m.kind;
        out.status = m.status;
        out.entries = m.entries;
        out.payload.assign(m.payload, m.payload + m.payload_bytes);
        return out;
    }
    Result<tl_notification> waitNotification(
        std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
        tl_notification n{};
        tl_status s = tl_wait_notification(c_, &n, static_cast<int>(timeout.count()));
        if (s != TL_OK) {
            return lastError(s);
        }
        return n;
    }
    /// tl_wait_notification_ex: the notification with its writer's uid and the drop count.
    Result<tl_notification_ex> waitNotificationEx(
        std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
        tl_notification_ex n{};
        tl_status s = tl_wait_notification_ex(c_, &n, static_cast<int>(timeout.count()));
        if (s != TL_OK) {
            return lastError(s);
        }
        return n;
    }

private:
    explicit Client(tl_client *c) : c_(c) {}
    static tl_send_opts toOpts(const SendOptions &o) {
        tl_send_opts opts{};
        opts.imm = o.imm;
        opts.payload = o.payload.data();
        opts.payload_bytes = static_cast<uint32_t>(o.payload.size());
        opts.timeout_ms = static_cast<int32_t>(o.timeout.count());
        return opts;
    }
    tl_client *c_ = nullptr;
};

inline Result<bool> Region::expose(const std::string &name) const {
    tl_status s = tl_expose(client_, id_, name.c_str());
    if (s != TL_OK) {
        return lastError(s);
    }
    return true;
}

inline Result<bool> Region::expose(const std::string &name, const Access &access) const {
    tl_access a{};
    a.flags = (access.peers ? TL_ACCESS_PEERS : 0u) | (access.any_local ? TL_ACCESS_LOCAL_ANY : 0u);
    a.n_uids = static_cast<uint32_t>(access.uids.size());
    a.uids = access.uids.data();
    a.n_gids = static_cast<uint32_t>(access.gids.size());
    a.gids = access.gids.data();
    tl_status s = tl_expose_access(client_, id_, name.c_str(), &a);
    if (s != TL_OK) {
        return lastError(s);
    }
    return true;
}

}  // namespace tensorlane

#endif  // C++20
