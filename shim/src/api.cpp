// The C ABI: argument checks, then the Client. No exception crosses this boundary.
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "client.hpp"
#include "tensorlane/tensorlane.h"

using tensorlane::ipc::Code;
using tensorlane::shim::Client;
using tensorlane::shim::fail;

namespace tensorlane::shim {
const char *lastError();
}

// The C enum and the wire codes are one list (ipc/status.hpp); keep them so.
static_assert(TL_OK == static_cast<int>(Code::kOk));
static_assert(TL_EINVAL == static_cast<int>(Code::kInvalid));
static_assert(TL_ENOENT == static_cast<int>(Code::kNotFound));
static_assert(TL_EPERM == static_cast<int>(Code::kPermission));
static_assert(TL_ENOMEM == static_cast<int>(Code::kNoMemory));
static_assert(TL_EAGAIN == static_cast<int>(Code::kAgain));
static_assert(TL_ETIMEDOUT == static_cast<int>(Code::kTimedOut));
static_assert(TL_EPEER == static_cast<int>(Code::kPeer));
static_assert(TL_ECONN == static_cast<int>(Code::kConnection));
static_assert(TL_ECUDA == static_cast<int>(Code::kCuda));
static_assert(TL_EINTERNAL == static_cast<int>(Code::kInternal));
static_assert(TL_EDEADLINE == static_cast<int>(Code::kDeadline));
// The layouts the Python binding (shim/python/tensorlane/_lib.py) declares too.
static_assert(sizeof(tl_send_opts) == 56 && sizeof(tl_group_entry) == 40);
static_assert(sizeof(tl_message) == sizeof(tl_notification_ex) + 16 + TL_MAX_PAYLOAD);
static_assert(TL_MAX_PAYLOAD == tensorlane::ipc::kMaxPayload &&
              TL_GROUP_MAX_ENTRIES == tensorlane::ipc::kMaxGroupEntries);
static_assert(sizeof(tl_notification) == 96);
static_assert(sizeof(tl_notification_ex) == 96 + 8 + 8 + 32);
static_assert(sizeof(tl_access) == 32);
static_assert(TL_UID_PEER == tensorlane::ipc::kWriterUidPeer &&
              TL_UID_UNKNOWN == tensorlane::ipc::kWriterUidUnknown);

struct tl_client {
    Client impl;
};

namespace {

template <class F>
tl_status guarded(F &&f) {
    try {
        return f();
    } catch (const std::bad_alloc &) {
        return fail(Code::kNoMemory, "out of memory");
    } catch (const std::exception &e) {
        return fail(Code::kInternal, e.what());
    } catch (...) {
        return fail(Code::kInternal, "unexpected exception");
    }
}

#define TL_REQUIRE_CLIENT(c)                                  \
    do {                                                      \
        if (!(c)) {                                           \
            return fail(Code::kInvalid, "tl_client is NULL"); \
        }                                                     \
    } while (0)

}  // namespace

extern "C" {

TL_API const char *tl_status_str(tl_status s) {
    return tensorlane::ipc::codeName(static_cast<Code>(s));
}

TL_API const char *tl_last_error(void) {
    return tensorlane::shim::lastError();
}

TL_API tl_status tl_connect(const char *socket_path, tl_client **out) {
    if (!out) {
        return fail(Code::kInvalid, "tl_connect: out is NULL");
    }
    return guarded([&] {
        std::string path;
        const char *from = "";
        if (socket_path && *socket_path) {
            path = socket_path;
        } else if (const char *env = std::getenv("TENSORLANE_SOCKET"); env && *env) {
            path = env;
            from = " (the path came from $TENSORLANE_SOCKET)";
        } else {
            path = "/run/tensorlane/sidecar.sock";
            from = " (the default path: neither the call nor $TENSORLANE_SOCKET named a socket)";
        }
        auto *c = new tl_client();
        Code code = c->impl.connect(path);
        if (code != Code::kOk) {
            delete c;
            // Where the path came from is half of what to fix when it is the wrong one.
            tensorlane::shim::setLastErrorText(tensorlane::shim::lastErrorText() + from);
            return static_cast<tl_status>(code);
        }
        *out = c;
        return TL_OK;
    });
}

TL_API void tl_disconnect(tl_client *c) {
    delete c;
}

TL_API tl_status tl_alloc_host(tl_client *c, size_t bytes, void **ptr, tl_region *out) {
    TL_REQUIRE_CLIENT(c);
    if (!ptr || !out) {
        return fail(Code::kInvalid, "tl_alloc_host: ptr and out are required");
    }
    return guarded([&] { return c->impl.allocHost(bytes, ptr, out); });
}

TL_API tl_status tl_register(tl_client *c, void *ptr, size_t bytes, tl_region *out) {
    TL_REQUIRE_CLIENT(c);
    if (!out) {
        return fail(Code::kInvalid, "tl_register: out is NULL");
    }
    return guarded([&] { return c->impl.registerMemory(ptr, bytes, out); });
}

TL_API tl_status tl_register_dmabuf(tl_client *c, int fd, uint64_t offset, uint64_t bytes,
                                    tl_region *out) {
    TL_REQUIRE_CLIENT(c);
    if (!out) {
        return fail(Code::kInvalid, "tl_register_dmabuf: out is NULL");
    }
    return guarded([&] { return c->impl.registerDmabuf(fd, offset, bytes, out); });
}

TL_API tl_status tl_deregister(tl_client *c, tl_region r) {
    TL_REQUIRE_CLIENT(c);
    return guarded([&] { return c->impl.deregister(r); });
}

TL_API tl_status tl_expose(tl_client *c, tl_region r, const char *name) {
    TL_REQUIRE_CLIENT(c);
    return guarded([&] { return c->impl.expose(r, name); });
}

TL_API tl_status tl_expose_access(tl_client *c, tl_region r, const char *name,
                                  const tl_access *access) {
    TL_REQUIRE_CLIENT(c);
    if (!access) {
        return guarded([&] { return c->impl.expose(r, name); });
    }
    return guarded([&] { return c->impl.exposeAccess(r, name, access); });
}

TL_API tl_status tl_lookup(tl_client *c, const char *peer, const char *name, tl_remote *out,
                           uint64_t *bytes) {
    TL_REQUIRE_CLIENT(c);
    return guarded([&] { return c->impl.lookup(peer, name, out, bytes); });
}

TL_API tl_status tl_write(tl_client *c, tl_region src, uint64_t src_off, tl_remote dst,
                          uint64_t dst_off, uint64_t bytes, uint32_t imm, tl_ticket *out) {
    TL_REQUIRE_CLIENT(c);
    tl_write_desc w{src, src_off, dst, dst_off, bytes, imm, 0};
    return guarded([&] { return c->impl.write(&w, 1, out, nullptr); });
}

TL_API tl_status tl_wait(tl_client *c, tl_ticket t, int timeout_ms) {
    TL_REQUIRE_CLIENT(c);
    return guarded([&] { return c->impl.wait(t, timeout_ms); });
}

TL_API tl_status tl_test(tl_client *c, tl_ticket t, int *done) {
    TL_REQUIRE_CLIENT(c);
    return guarded([&] { return c->impl.test(t, done); });
}

TL_API tl_status tl_wait_notification(tl_client *c, tl_notification *out, int timeout_ms) {
    TL_REQUIRE_CLIENT(c);
    return guarded([&] { return c->impl.waitNotification(out, timeout_ms); });
}

TL_API tl_status tl_wait_notification_ex(tl_client *c, tl_notification_ex *out, int timeout_ms) {
    TL_REQUIRE_CLIENT(c);
    return guarded([&] { return c->impl.waitNotificationEx(out, timeout_ms); });
}

TL_API tl_status tl_write_msg(tl_client *c, tl_region src, uint64_t src_off, tl_remote dst,
                              uint64_t dst_off, uint64_t bytes, const tl_send_opts *opts,
                              tl_ticket *out) {
    TL_REQUIRE_CLIENT(c);
    return guarded([&] { return c->impl.writeMsg(src, src_off, dst, dst_off, bytes, opts, out); });
}

TL_API tl_status tl_write_group(tl_client *c, const tl_group_entry *entries, size_t n,
                                const tl_send_opts *opts, tl_ticket *out) {
    TL_REQUIRE_CLIENT(c);
    return guarded([&] { return c->impl.writeGroup(entries, n, opts, out); });
}

TL_API tl_status tl_wait_message(tl_client *c, tl_message *out, int timeout_ms) {
    TL_REQUIRE_CLIENT(c);
    return guarded([&] { return c->impl.waitMessage(out, timeout_ms); });
}

TL_API tl_status tl_nop(tl_client *c, tl_ticket *out) {
    TL_REQUIRE_CLIENT(c);
    return guarded([&] { return c->impl.nop(1, out, nullptr); });
}

TL_API tl_status tl_write_batch(tl_client *c, const tl_write_desc *writes, size_t n, tl_ticket *out,
                                size_t *submitted) {
    TL_REQUIRE_CLIENT(c);
    return guarded([&] { return c->impl.write(writes, n, out, submitted); });
}

TL_API tl_status tl_nop_batch(tl_client *c, size_t n, tl_ticket *out, size_t *submitted) {
    TL_REQUIRE_CLIENT(c);
    return guarded([&] { return c->impl.nop(n, out, submitted); });
}

TL_API tl_status tl_write_on_stream(tl_client *c, tl_region src, uint64_t src_off, tl_remote dst,
                                    uint64_t dst_off, uint64_t bytes, uint32_t imm, void *s,
                                    tl_ticket *out) {
    TL_REQUIRE_CLIENT(c);
    tl_write_desc w{src, src_off, dst, dst_off, bytes, imm, 0};
    return guarded([&] { return c->impl.writeOnStream(w, s, out); });
}

TL_API tl_status tl_stream_wait_ticket(tl_client *c, tl_ticket t, void *s) {
    TL_REQUIRE_CLIENT(c);
    return guarded([&] { return c->impl.streamWaitTicket(t, s); });
}

TL_API tl_status tl_stream_wait_notification(tl_client *c, tl_region r, uint32_t imm, void *s) {
    TL_REQUIRE_CLIENT(c);
    return guarded([&] { return c->impl.streamWaitNotification(r, imm, s); });
}

TL_API const char *tl_node_name(tl_client *c) {
    return c ? c->impl.nodeName().c_str() : "";
}

TL_API tl_status tl_sidecar_status(tl_client *c, char *buf, size_t cap, size_t *len) {
    TL_REQUIRE_CLIENT(c);
    if (!buf || cap == 0) {
        return fail(Code::kInvalid, "tl_sidecar_status: no buffer");
    }
    return guarded([&] {
        std::string json;
        tl_status st = c->impl.sidecarStatus(&json);
        if (st != TL_OK) {
            return st;
        }
        size_t n = std::min(json.size(), cap - 1);
        std::memcpy(buf, json.data(), n);
        buf[n] = '\0';
        if (len) {
            *len = json.size();
        }
        return TL_OK;
    });
}

}  // extern "C"
