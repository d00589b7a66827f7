/* tensorlane: the public C ABI of the shim (libtensorlane.so).
 *
 * A worker process links this library, connects to its node's sidecar, registers memory, and
 * exchanges tensors with write-with-immediate semantics: tl_write places bytes in a region some
 * process (on this node or another) exposed, the target's owner is notified once the data is in
 * place, and the writer's ticket completes after that.
 *
 * Threads: every call is safe to make from any thread on the same tl_client, except that
 * tl_disconnect must not race with any other call on that client. tl_write calls are
 * serialised internally (the request ring has one producer); tl_wait / tl_test /
 * tl_wait_notification may run concurrently (one thread at a time drains the completion ring,
 * the others wait on it). Socket calls (alloc, register, expose, lookup) are serialised.
 *
 * Names and meanings here are stable (DESIGN.md, "Public C ABI"); calls may be added.
 */
#ifndef TENSORLANE_TENSORLANE_H
#define TENSORLANE_TENSORLANE_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define TL_API __attribute__((visibility("default")))
#else
#define TL_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tl_client tl_client; /* opaque; one connection to the sidecar */
typedef uint64_t tl_region;         /* a local region, valid for its client */
typedef uint64_t tl_remote;         /* a peer's exposed region, from tl_lookup */
typedef uint64_t tl_ticket;         /* one tl_write */

typedef enum tl_status {
    TL_OK = 0,
    TL_EINVAL, /* wrong on its face: bad argument, unknown region, out of bounds */
    TL_ENOENT, /* no such peer, name or ticket; a region revoked by its owner */
    TL_EPERM,  /* the sidecar refused these credentials */
    TL_ENOMEM,
    TL_EAGAIN,    /* ring full or too many writes outstanding: wait on a ticket and retry */
    TL_ETIMEDOUT, /* the wait ran out; the ticket is still pending */
    TL_EPEER,     /* peer unreachable or failed */
    TL_ECONN,     /* sidecar gone */
    TL_ECUDA,     /* CUDA memory where it is not supported, or a CUDA call failed */
    TL_EINTERNAL,
    TL_EDEADLINE /* a write's deadline (tl_send_opts.timeout_ms) passed: it failed (unlike
                    TL_ETIMEDOUT from a wait, which leaves the ticket pending) */
} tl_status;

typedef struct tl_notification {
    tl_region region; /* the local region that was written */
    uint32_t imm;     /* the writer's immediate */
    uint64_t offset;  /* where the write landed in the region */
    uint64_t bytes;   /* how many bytes landed */
    char peer[64];    /* the writing node's name, NUL-terminated */
} tl_notification;

/** A fixed name for a status ("TL_EPEER"); never NULL. */
TL_API const char *tl_status_str(tl_status s);
/** This thread's detail of its last failed call ("" if none); valid until its next call. */
TL_API const char *tl_last_error(void);

/** Connects to the sidecar. socket_path NULL: $TENSORLANE_SOCKET, else
 *  /run/tensorlane/sidecar.sock. TL_EPERM when the sidecar refuses our credentials. */
TL_API tl_status tl_connect(const char *socket_path, tl_client **out);
/** Closes the connection; the sidecar releases everything the client held. NULL is fine. */
TL_API void tl_disconnect(tl_client *c);

/** Allocates `bytes` of host memory shared with the sidecar and registers it as a region.
 *  tl_deregister of that region frees the memory. In a process that uses CUDA the memory is
 *  page-locked for it (cuMemHostRegister, portable), so its own copies to and from the GPU are
 *  DMA. */
TL_API tl_status tl_alloc_host(tl_client *c, size_t bytes, void **ptr, tl_region *out);
/** Registers [ptr, ptr + bytes) as a region: host memory inside a tl_alloc_host buffer, or CUDA
 *  device memory anywhere inside a cuMemAlloc/cudaMalloc allocation (a tensor of PyTorch's
 *  caching allocator is a piece of a larger one). The first region in an allocation exports it
 *  to the sidecar (CUDA IPC handle and a dma-buf fd of all of it); later ones in the same
 *  allocation only name it.
 *
 *  VMM memory (cuMemCreate + cuMemMap: PyTorch's expandable segments, NCCL's buffers) is
 *  exported by its pieces: each physical allocation under the range goes to the sidecar as a
 *  POSIX fd (the allocations must be made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in
 *  requestedHandleTypes, as PyTorch's are) with a dma-buf of their span, and the sidecar maps
 *  them itself; each such registration exports afresh (pieces of 20 MiB to 2 GiB; at most
 *  4096). VMM memory without a shareable handle type goes as the dma-buf of its span alone,
 *  which only the verbs transport can reach (local and tcp writes to or from it fail with
 *  TL_ECUDA and the reason). TL_ECUDA for CUDA memory that cannot be shared (managed memory,
 *  cudaMallocHost memory) or when the sidecar cannot use CUDA, with the reason.
 *
 *  Thread-safe; CUDA registrations of one client are serialised. The memory must stay
 *  allocated (and, for VMM memory, mapped) until tl_deregister of the region. */
TL_API tl_status tl_register(tl_client *c, void *ptr, size_t bytes, tl_region *out);
/** Registers [offset, offset + bytes) of the dma-buf `fd` as a region: what NCCL hands a net
 *  plugin's regMrDmaBuf, or any exporter's dma-buf. The sidecar takes its own reference to the
 *  fd (the caller may close it after the call) and checks the range against the dma-buf's
 *  size. The sidecar does not map the memory: only transports that register dma-bufs with the
 *  NIC (verbs: ibv_reg_dmabuf_mr) reach the region; local and tcp writes to or from it fail
 *  with TL_ECUDA and the reason. Works without CUDA in the process. TL_EINVAL for a negative
 *  fd, zero bytes or a range past the dma-buf's end. Thread-safe. */
TL_API tl_status tl_register_dmabuf(tl_client *c, int fd, uint64_t offset, uint64_t bytes,
                                    tl_region *out);
/** Releases a region. Later writes into it from peers fail with TL_ENOENT at the writer. */
TL_API tl_status tl_deregister(tl_client *c, tl_region r);
/** Makes a region writable under `name` by the configured peers and, on this node, by clients
 *  with the exposing client's uid and by root (tl_expose_access with flags = TL_ACCESS_PEERS
 *  and no uids or gids; other local uids get TL_EPERM at tl_lookup). A name already exposed by
 *  another region is TL_EINVAL (it is never taken over); one under a [security]
 *  reserved_names prefix that this uid does not hold is TL_EPERM. */
TL_API tl_status tl_expose(tl_client *c, tl_region r, const char *name);
/** Finds `name` exposed on node `peer` (this node's own name is valid). `bytes` may be NULL.
 *  TL_ENOENT: nothing is exposed under `name` there yet, or `peer` is not (yet, or no longer)
 *  registered in an etcd directory: retrying may help. TL_EINVAL: `peer` is neither this node
 *  nor one of a static [[peers]] list, which is fixed when the sidecar starts: retrying cannot
 *  help. TL_EPEER: the peer is unreachable now (tl_last_error says why). */
TL_API tl_status tl_lookup(tl_client *c, const char *peer, const char *name, tl_remote *out,
                           uint64_t *bytes);
/** Writes `bytes` from src+src_off into dst+dst_off and delivers `imm` to the target's owner.
 *  Returns a ticket at once; tl_wait/tl_test tell how it ended. A request wrong on its face
 *  fails here. */
TL_API tl_status tl_write(tl_client *c, tl_region src, uint64_t src_off, tl_remote dst,
                          uint64_t dst_off, uint64_t bytes, uint32_t imm, tl_ticket *out);
/** Waits for a ticket: its status, or TL_ETIMEDOUT (timeout_ms < 0 waits forever). A ticket
 *  is consumed by the wait that returns its status. */
TL_API tl_status tl_wait(tl_client *c, tl_ticket t, int timeout_ms);
/** Non-blocking tl_wait: *done = 1 and the ticket's status once it has ended, else *done = 0
 *  and TL_OK. */
TL_API tl_status tl_test(tl_client *c, tl_ticket t, int *done);
/** Waits for data to arrive in one of this client's regions. */
TL_API tl_status tl_wait_notification(tl_client *c, tl_notification *out, int timeout_ms);

/* ---- additions (not in DESIGN.md's first list) ---- */

/** Submits a no-op that the sidecar completes at once: a health check and the ring round-trip
 *  benchmark's unit. */
TL_API tl_status tl_nop(tl_client *c, tl_ticket *out);
/** One write of a batch (the arguments of tl_write). */
typedef struct tl_write_desc {
    tl_region src;
    uint64_t src_off;
    tl_remote dst;
    uint64_t dst_off;
    uint64_t bytes;
    uint32_t imm;
    uint32_t reserved; /* 0 */
} tl_write_desc;

/** Submits n writes with one doorbell; out[i] gets the ticket of writes[i]. If any entry is
 *  wrong on its face, nothing is submitted (TL_EINVAL names the entry). If the rings have room
 *  for only some, those are submitted, *submitted (may be NULL) says how many, and the result
 *  is TL_EAGAIN. Notifications of one batch arrive in its order. */
TL_API tl_status tl_write_batch(tl_client *c, const tl_write_desc *writes, size_t n, tl_ticket *out,
                                size_t *submitted);
/** n no-ops with one doorbell (tl_write_batch's rules). */
TL_API tl_status tl_nop_batch(tl_client *c, size_t n, tl_ticket *out, size_t *submitted);
/** The name of the node the sidecar serves (for tl_lookup of this node). */
TL_API const char *tl_node_name(tl_client *c);
/** The sidecar's status as JSON text, copied into buf (NUL-terminated, cut at cap - 1). *len
 *  gets the whole document's length: call again with a buffer of *len + 1 to have all of it.
 *  The document is read from the sidecar in pages of one snapshot, so hundreds of peers fit. */
TL_API tl_status tl_sidecar_status(tl_client *c, char *buf, size_t cap, size_t *len);

/* ---- Access to exposed regions (who may write them) and attributed notifications ---- */

#define TL_ACCESS_PEERS 0x1u     /* the configured peer nodes may write (tl_expose's default) */
#define TL_ACCESS_LOCAL_ANY 0x2u /* every local client the sidecar admits may write */
#define TL_ACCESS_MAX_IDS 64u    /* the most uids, and the most gids, one tl_access names */

/** Who may write an exposed region besides its owner's uid and root (always allowed). Without
 *  TL_ACCESS_PEERS the name is not offered to peers at all (their lookups say TL_ENOENT).
 *  The arrays are read during the call only; NULL is fine where the count is 0. */
typedef struct tl_access {
    uint32_t flags;  /* TL_ACCESS_* */
    uint32_t n_uids; /* local uids allowed besides the owner's uid and root */
    const uint32_t *uids;
    uint32_t n_gids; /* local clients with one of these groups (primary or supplementary,
                        as the kernel recorded them when the writer connected) */
    const uint32_t *gids;
} tl_access;

/** tl_expose with an access list. access NULL: tl_expose's default. Exposing the same region
 *  again replaces its list: local writers it no longer allows get TL_EPERM at their next
 *  write (their remote handles stay), but a region once offered to peers cannot be withdrawn
 *  from them this way (TL_EINVAL: deregister it). TL_EINVAL for unknown flags or more than
 *  TL_ACCESS_MAX_IDS uids or gids. A local writer it does not allow gets TL_EPERM from
 *  tl_lookup (tl_last_error names the owner's list) and from tl_wait of a write, if the list
 *  changed after its lookup. Thread-safe like tl_expose (a socket call). */
TL_API tl_status tl_expose_access(tl_client *c, tl_region r, const char *name,
                                  const tl_access *access);

/** tl_wait_notification's entry with who wrote it. */
typedef struct tl_notification_ex {
    tl_notification n;
    uint32_t writer_uid; /* local writes: the writer's uid (SO_PEERCRED at its tl_connect);
                            writes from peers: TL_UID_PEER */
    uint32_t flags;      /* 0 for now */
    uint64_t dropped;    /* notifications dropped (the target's backlog was full) since the
                            previous one delivered; 0 where the sidecar does not count them */
    uint64_t reserved[4];
} tl_notification_ex;

#define TL_UID_PEER 0xffffffffu    /* writer_uid of a write that came from a peer node */
#define TL_UID_UNKNOWN 0xfffffffeu /* writer_uid the sidecar could not attribute (not expected) */

/** tl_wait_notification with the writer's uid and the count of drops; the two take from one
 *  queue (each notification goes to one of them) and may run concurrently, from any thread.
 *  `*out` is a plain copy (no pointers into the client), written only on TL_OK; reserved and
 *  flags are 0. */
TL_API tl_status tl_wait_notification_ex(tl_client *c, tl_notification_ex *out, int timeout_ms);

/* ---- Payloads, grouped writes and deadlines ----
 *
 * A write may carry up to TL_MAX_PAYLOAD bytes of payload that reach the target's owner inline
 * with its notification (request ids, block lists, a clear-to-send record); a message is a
 * payload alone (0 bytes written). A grouped write moves many (src, dst) ranges to one peer
 * under one ticket and one notification at the target, given once every entry is in place.
 * Either may carry a deadline: past it the writer's ticket ends TL_EDEADLINE and the target is
 * sent a failed notification (status TL_EDEADLINE), so neither side waits out a peer timeout;
 * a peer that dies ends the writer's ticket TL_EPEER and, at the target, the groups it had in
 * flight with a TL_EPEER notification. The notifications of one writer's writes, messages and
 * groups to one peer arrive in the order they were submitted (docs/abi.md).
 *
 * Threads and lifetimes: like tl_write (any thread; the descriptions are copied before the
 * call returns, except `entry_status`, which must stay valid until the ticket ends). The shim
 * keeps each description in a host buffer of its own that it allocates from the sidecar on
 * first use (it counts against the client's [limits] host memory) until the ticket ends. */

#define TL_MAX_PAYLOAD 256u         /* payload bytes of one write, message or group */
#define TL_GROUP_MAX_ENTRIES 16384u /* entries of one tl_write_group */

/** Options of tl_write_msg and tl_write_group. Zero-initialise it: every field's 0 is the
 *  default. */
typedef struct tl_send_opts {
    uint32_t imm;           /* delivered with the notification */
    uint32_t payload_bytes; /* at most TL_MAX_PAYLOAD */
    const void *payload;    /* read during the call only; NULL when payload_bytes is 0 */
    int32_t timeout_ms;     /* > 0: the deadline, from submission; else none */
    uint32_t flags;         /* 0 */
    /* tl_write_group: n statuses, entry_status[i] for entries[i], written before the ticket
     * ends (TL_OK; the status that ended the entry; TL_EDEADLINE for an entry the deadline
     * cut off). NULL: only the ticket's status (the first failure). */
    tl_status *entry_status;
    /* tl_write_group: the remote region whose owner is notified; 0: entries[0].dst. Must be
     * on the same peer as every entry. */
    tl_remote notify;
    uint64_t reserved[2]; /* 0 */
} tl_send_opts;

/** tl_write with a payload (opts->payload) and an optional deadline. bytes may be 0: a message
 *  of the payload alone, notified at dst_off (src and src_off are then ignored). The target's
 *  notification (tl_wait_message) carries the payload; tl_wait_notification and _ex take it
 *  without. opts NULL: no payload, no deadline (bytes > 0 then, as tl_write). */
TL_API tl_status tl_write_msg(tl_client *c, tl_region src, uint64_t src_off, tl_remote dst,
                              uint64_t dst_off, uint64_t bytes, const tl_send_opts *opts,
                              tl_ticket *out);

/** One entry of a grouped write (the arguments of tl_write). */
typedef struct tl_group_entry {
    tl_region src;
    uint64_t src_off;
    tl_remote dst;
    uint64_t dst_off;
    uint64_t bytes; /* > 0 */
} tl_group_entry;

/** Writes n entries (1 to TL_GROUP_MAX_ENTRIES, possibly to many remote regions of one peer)
 *  under one ticket. The target is notified once, after every entry is in place (kind
 *  TL_NOTIFY_GROUP, with opts->imm, the payload and n), or once with a failed status. The
 *  ticket ends TL_OK when every entry landed, else with the first failure; the entries' own
 *  statuses go to opts->entry_status. An entry wrong on its face fails the call (TL_EINVAL,
 *  tl_last_error names it) and nothing is submitted. */
TL_API tl_status tl_write_group(tl_client *c, const tl_group_entry *entries, size_t n,
                                const tl_send_opts *opts, tl_ticket *out);

/* tl_message.kind */
#define TL_NOTIFY_WRITE 0u   /* a write landed (tl_write, tl_write_msg with bytes) */
#define TL_NOTIFY_MESSAGE 1u /* a message: payload only, no bytes were written */
#define TL_NOTIFY_GROUP 2u   /* a grouped write ended */

/** A notification with everything it carries. */
typedef struct tl_message {
    tl_notification_ex ex; /* region, imm, offset, bytes (a group: its entries' sum, offset 0),
                              peer, writer_uid, dropped */
    uint32_t kind;         /* TL_NOTIFY_* */
    tl_status status;      /* TL_OK; a failed group or deadline: TL_EDEADLINE, TL_EPEER, ... */
    uint32_t entries;      /* TL_NOTIFY_GROUP: the group's entry count */
    uint32_t payload_bytes;
    uint8_t payload[TL_MAX_PAYLOAD];
} tl_message;

/** tl_wait_notification with the payload, kind and status. Takes from the same queue as
 *  tl_wait_notification and _ex (each notification goes to one of them; those two drop the
 *  payload), from any thread. */
TL_API tl_status tl_wait_message(tl_client *c, tl_message *out, int timeout_ms);

/* ---- Stream-ordered calls (DESIGN.md; CUDA builds; `s` is a cudaStream_t / CUstream, NULL
 * for the legacy default stream). None of them blocks the calling thread on the GPU. Without a
 * CUDA build, or in a process that does not use CUDA, they return TL_ECUDA. ---- */

/** tl_write that starts only after the work queued on `s` before it has finished (the stream
 *  stores a flag that the sidecar watches). The ticket behaves like tl_write's. Not capturable
 *  into a CUDA graph (TL_EINVAL): the write is submitted by this call. */
TL_API tl_status tl_write_on_stream(tl_client *c, tl_region src, uint64_t src_off, tl_remote dst,
                                    uint64_t dst_off, uint64_t bytes, uint32_t imm, void *s,
                                    tl_ticket *out);
/** Makes `s` wait until write `t` has ended (completed or failed: the stream is released
 *  either way; tl_wait/tl_test still give its status, the ticket is not consumed). A ticket
 *  that has ended already adds no wait. */
TL_API tl_status tl_stream_wait_ticket(tl_client *c, tl_ticket t, void *s);
/** Makes `s` wait until a write with `imm` has landed in region `r`: each call consumes one such
 *  notification (in a CUDA graph, each replay consumes one more). Notifications for (r, imm)
 *  go to these waits from the first call on, and no longer to tl_wait_notification (those that
 *  had arrived and were not taken yet count for the waits). tl_deregister(r) releases the
 *  streams waiting on it. */
TL_API tl_status tl_stream_wait_notification(tl_client *c, tl_region r, uint32_t imm, void *s);

#ifdef __cplusplus
}
#endif

#endif /* TENSORLANE_TENSORLANE_H */
