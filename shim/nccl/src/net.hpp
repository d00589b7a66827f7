// The NCCL net plugin's core (docs/nccl.md): NCCL's send/receive connections carried on
// tensorlane's own calls through the process's one tl_client.
//
// Protocol (the shape of NCCL's IB transport, a FIFO the receiver writes):
//  - listen() exposes a small mailbox region; the handle names node, process nonce and
//    listener. connect() looks the mailbox up and sends CONNECT (a message: payload only).
//  - accept() takes a CONNECT, looks up the sender's mailbox and makes the recv comm.
//  - Sends and receives of one comm are matched by tag and, within a tag, in order: each send
//    and each posted receive entry gets the next sequence number of its tag (NCCL's rule).
//  - irecv() sends CTS (clear to send) to the sender's mailbox: per posted buffer its exposed
//    region, offset, size, tag and sequence number. Receives in flight per comm are bounded
//    (NCCL_NET_MAX_REQUESTS): the sender's CTS table never holds more.
//  - isend() looks for the CTS of its (tag, sequence number), checks the size, and writes the
//    data into the receiver's buffer with tl_write, its immediate naming request, entry and
//    generation (dataImm()); the ticket is the send's request. The receiver's notification
//    (region, bytes, immediate) arrives once the data is in place: that ends its entry. A
//    zero-byte send has no bytes to write: it goes as a DATA message (payload only).
//  - Eager (docs/nccl.md, "The eager path"): each receive comm has a ring of slots (16 x 64 KiB
//    by default) exposed to its sender. A send of at most a slot's size with no CTS yet goes at
//    once into the next slot (an EAGER payload naming slot, tag, sequence number and size), so
//    a collective's first message does not wait for the receiver's CTS to cross both sidecars.
//    The receiver copies the slot into the matching posted buffer (memcpy for host buffers, a
//    local tl_write for GPU ones), or keeps it until that receive is posted (no CTS is sent for
//    it then). A receive entry of at most a slot's size sends no CTS at all: its message comes
//    eagerly; a send that cannot go eagerly (no slot free, or too big for one) asks with RTS
//    (request to send, once) and the receiver answers with the entry's CTS. A CTS that arrives
//    for an entry already sent eagerly is dropped by its sequence number. Slots come back to
//    the sender as credits (freed slots counted in ring order) on CTS and CREDIT payloads;
//    without a credit a send waits for its CTS, so neither side overruns the other.
//  - A comm whose peer stops answering (a write or a probe of its mailbox fails: the process
//    died, its region went, its sidecar is unreachable) fails every request of it, and later
//    calls on it, so NCCL aborts instead of hanging.
// Host memory NCCL registers (cudaHostAlloc'ed, private to the process) cannot be a region:
// each host MR has a shadow tl_alloc_host buffer of its size; sends copy into it, receives out
// of it (one memcpy at each end, spread over helper threads from 256 KiB: CopyPool). CUDA memory
// (cudaMalloc or NCCL's cuMemCreate buffers) registers directly (tl_register), else by its dma-buf
// (tl_register_dmabuf).
//
// Threads: NCCL calls from its proxy threads and its main thread; one mutex serialises
// everything (no call blocks on the network except the first lookups of a connection).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "copy_pool.hpp"
#include "tensorlane/ipc/trace_lines.hpp"
#include "tensorlane/nccl_net.h"
#include "tensorlane/tensorlane.h"

namespace tensorlane::nccl {

inline constexpr uint32_t kWireMagic = 0x434e4c54u;  // "TLNC"
inline constexpr uint32_t kWireVersion = 2;          // 2: sequence numbers, the eager ring
inline constexpr int kMaxRecvs = 8;  // buffers of one grouped irecv (one CTS payload)
/// Sends into a CTS and CTS'd receive entries of this size and more are timed (Comm::counts).
inline constexpr uint64_t kTimedFrom = 128 << 10;

/// What listen() hands NCCL to give the connecting rank (at most NCCL_NET_HANDLE_MAXSIZE).
struct Handle {
    uint32_t magic;
    uint32_t version;
    uint64_t nonce;  ///< the listening process's (names its regions)
    uint64_t listener;
    char node[64];  ///< the listener's sidecar node
};
static_assert(sizeof(Handle) <= NCCL_NET_HANDLE_MAXSIZE);

enum class Wire : uint8_t {
    kConnect = 1,
    kCts = 2,
    kData = 3,
    kPing = 4,
    kEager = 5,
    kCredit = 6,
    kRts = 7,
};

/// Every payload starts with this.
struct WireHeader {
    uint32_t magic;
    uint8_t type;  ///< Wire
    uint8_t count;
    uint16_t reserved;
    uint64_t to;     ///< the target's comm (a listener for kConnect)
    uint64_t from;   ///< the writer's comm
    uint64_t nonce;  ///< the writer's process nonce
};

struct CtsEntry {
    uint32_t mr;  ///< the receiver's MR (its region is exposed as regionName(nonce, 'M', mr))
    int32_t tag;
    uint32_t seq;     ///< the entry's number among this comm's receives of `tag` (wraps)
    uint32_t index;   ///< the entry's place in its request
    uint64_t offset;  ///< in the MR
    uint64_t size;    ///< posted bytes
};
/// Entries of one CTS payload: a grouped receive of more goes as two.
inline constexpr int kCtsPerMessage = 6;
struct CtsBody {
    uint64_t credit;   ///< eager slots the receiver has freed so far, counted in ring order
    uint32_t request;  ///< the receiver's request slot
    uint32_t generation;
    CtsEntry entries[kCtsPerMessage];
};
/// A send that went into the receiver's eager ring (the write's bytes are in slot `slot`).
struct EagerBody {
    uint32_t slot;
    int32_t tag;
    uint32_t seq;
    uint32_t reserved;
    uint64_t size;
};
/// A send that can go neither eagerly nor into a CTS asks for the CTS of its receive entry.
struct RtsBody {
    int32_t tag;
    uint32_t seq;
};
/// The receiver's eager grant (accept()'s first PING) and its later credits (CREDIT): `slots`
/// 0 takes the grant back.
struct CreditBody {
    uint64_t credit;
    uint32_t slots;
    uint32_t slot_bytes;
};
struct DataBody {
    uint32_t request;
    uint32_t generation;
    uint32_t index;
    uint32_t reserved;
    uint64_t size;
};
static_assert(sizeof(WireHeader) + sizeof(CtsBody) <= TL_MAX_PAYLOAD);
static_assert(kMaxRecvs <= 2 * kCtsPerMessage);

/// A data write's immediate: bit 31 set, the request's generation (20 bits), its slot (5) and
/// the entry (3).
constexpr uint32_t kDataImmFlag = 1u << 31;
inline uint32_t dataImm(uint32_t slot, uint32_t generation, uint32_t index) {
    return kDataImmFlag | (generation & 0xfffffu) << 8 | (slot & 31u) << 3 | (index & 7u);
}
static_assert(NCCL_NET_MAX_REQUESTS <= 32 && kMaxRecvs <= 8);

/// The exposed name of a plugin region: "ncl.<nonce>.<kind><id>".
std::string regionName(uint64_t nonce, char kind, uint64_t id);

class Net;

struct Mr {
    uint32_t id = 0;
    tl_region region = 0;
    unsigned char *user = nullptr;    ///< NCCL's address of the first byte
    unsigned char *shadow = nullptr;  ///< host MRs: our tl_alloc_host copy; else null
    /// Host memory (NCCL_PTR_HOST), whether shadowed or registered in place (NCCL's cuMem host
    /// buffers, which the sidecar maps itself: no copies).
    bool host = false;
    uint64_t size = 0;
    bool exposed = false;
    bool dmabuf_only = false;  ///< registered by its dma-buf alone (verbs only, no local copy)
    tl_remote self = 0;        ///< a receive MR as a remote of our own: eager copies into GPU
};

struct Comm;

struct Request {
    Comm *comm = nullptr;
    bool send = false;
    bool free = true;
    uint32_t slot = 0;
    uint32_t generation = 0;
    // send
    tl_ticket ticket = 0;
    uint64_t size = 0;
    // recv
    int n = 0;
    int done = 0;
    uint64_t sizes[kMaxRecvs] = {};
    bool landed[kMaxRecvs] = {};
    Mr *mrs[kMaxRecvs] = {};
    unsigned char *data[kMaxRecvs] = {};
    uint64_t offsets[kMaxRecvs] = {};
    uint64_t posted[kMaxRecvs] = {};
    int32_t tags[kMaxRecvs] = {};
    uint32_t seqs[kMaxRecvs] = {};
    // send of kTimedFrom bytes and more: when its write was posted (0: not timed)
    std::chrono::steady_clock::time_point written{};
    // recv: when each entry of kTimedFrom bytes and more sent its CTS (0: not timed)
    std::chrono::steady_clock::time_point cts_at[kMaxRecvs] = {};
    // trace: when it was posted, and whether a stall was already told
    std::chrono::steady_clock::time_point since{};
    bool stall_told = false;
};

/// A send or receive comm (and, kind 'L', a listener).
struct Comm {
    char kind = 'S';  ///< 'S' send, 'R' recv, 'L' listen
    uint64_t id = 0;
    tl_region mailbox = 0;  ///< ours, exposed as regionName(nonce, kind, id)
    void *mailbox_ptr = nullptr;
    std::string peer_node;  ///< the other end's node
    uint64_t peer_nonce = 0;
    uint64_t peer_comm = 0;  ///< the other end's comm (a send comm: 0 until the first CTS)
    tl_remote peer_mailbox = 0;
    std::string error;  ///< non-empty: dead, every call on it fails with this
    std::map<uint32_t, std::unique_ptr<Mr>> mrs;
    std::vector<Request> requests;             ///< NCCL_NET_MAX_REQUESTS slots
    using Key = std::pair<int32_t, uint32_t>;  ///< (tag, sequence number)
    /// send: sends made per tag; recv: receive entries posted per tag
    std::map<int32_t, uint32_t> next_seq;
    // send: the receiver's posted buffers not sent into yet, by (tag, sequence number)
    struct Cts {
        uint64_t from = 0;
        uint32_t request = 0;
        uint32_t generation = 0;
        CtsEntry entry{};
    };
    std::map<Key, Cts> cts;
    std::set<Key> rts_sent;  ///< send: entries asked for with RTS, not sent yet
    /// send: when a send first found neither a CTS nor a slot (a send bigger than a slot asks
    /// with RTS only after a while: only a receive too small for it is held quietly)
    std::map<Key, std::chrono::steady_clock::time_point> waiting_since;
    // send: the receiver's eager grant, its remote ring, slots used and slots given back
    uint32_t eager_slots = 0;
    uint32_t eager_bytes = 0;
    tl_remote eager_remote = 0;
    uint64_t eager_sent = 0;
    uint64_t eager_credit = 0;
    // recv: the eager ring (kEagerEmpty / kEagerHeld / kEagerFreed per slot), credits
    tl_region eager_region = 0;
    unsigned char *eager_ptr = nullptr;
    std::vector<uint8_t> eager_state;
    uint64_t credit_upto = 0;  ///< slots freed in ring order
    uint64_t credit_told = 0;  ///< what the sender was last told
    bool eager_revoked = false;
    struct Arrival {
        uint32_t slot = 0;
        uint64_t size = 0;
    };
    std::map<Key, Arrival> early;  ///< eager sends whose receive is not posted yet
    /// posted entries not landed yet: request slot, entry, whether their CTS went out
    struct Awaiting {
        uint32_t request = 0;
        uint32_t index = 0;
        bool cts_sent = false;
    };
    std::map<Key, Awaiting> awaiting;
    std::set<Key> rts_early;  ///< RTS for entries not posted yet
    /// What took which path, told at close (INFO): does a run use the eager path?
    struct Counts {
        uint64_t eager = 0;       ///< send: eager sends; recv: eager messages taken
        uint64_t direct = 0;      ///< send: sends into a CTS; recv: entries that sent a CTS
        uint64_t rts = 0;         ///< send: RTS sent; recv: RTS answered with a CTS
        uint64_t crossed = 0;     ///< send: CTS dropped as stale; recv: eager into a CTS'd entry
        uint64_t kept = 0;        ///< recv: eager messages kept until their receive was posted
        uint64_t gpu_copies = 0;  ///< recv: eager messages copied into GPU buffers
        uint64_t waited = 0;      ///< send: sends that found neither a CTS nor a slot at first
        uint64_t wait_ns = 0;     ///< send: how long those waited in all
        uint64_t copy_bytes = 0;  ///< bytes memcpy'd by the plugin (shadows, eager slots)
        uint64_t copy_ns = 0;     ///< and how long that took (NCCL's proxy thread's time)
        /// send: writes of kTimedFrom bytes and more, and their time from tl_write until test()
        /// saw them end; recv: entries of that size that sent a CTS, and their time from the
        /// CTS until their bytes were in (test() saw the notification). Where a step's time goes
        /// (docs/nccl.md).
        uint64_t timed = 0;
        uint64_t timed_ns = 0;
    } counts;
    std::map<uint32_t, tl_remote> remote_mrs;  ///< the receiver's MRs, looked up once each
    // listen: CONNECTs not yet accepted
    struct Pending {
        std::string node;
        uint64_t nonce = 0;
        uint64_t comm = 0;
    };
    std::deque<Pending> pending;
    // liveness
    std::chrono::steady_clock::time_point last_progress = std::chrono::steady_clock::now();
    tl_ticket probe = 0;
    std::chrono::steady_clock::time_point last_stall_told{};
    // connect(): the listener's handle, until connected
    Handle target{};
    bool connected = false;
    std::chrono::steady_clock::time_point next_try{};
};

class Net {
public:
    static Net &get();

    ncclResult_t init(ncclDebugLogger_t log);
    ncclResult_t properties(int dev, ncclNetProperties_v8_t *p);
    ncclResult_t listen(int dev, void *handle, void **listen_comm);
    ncclResult_t connect(int dev, void *handle, void **send_comm);
    ncclResult_t accept(void *listen_comm, void **recv_comm);
    ncclResult_t regMr(void *comm, void *data, size_t size, int type, void **mhandle);
    ncclResult_t regMrDmaBuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                             void **mhandle);
    ncclResult_t deregMr(void *comm, void *mhandle);
    ncclResult_t isend(void *send_comm, void *data, uint64_t size, int tag, void *mhandle,
                       void **request);
    ncclResult_t irecv(void *recv_comm, int n, void **data, const uint64_t *sizes, const int *tags,
                       void **mhandles, void **request);
    ncclResult_t test(void *request, int *done, int *sizes);
    ncclResult_t close(void *comm);

    /// For tests: the client (null before init).
    tl_client *client() const { return client_; }

private:
    Net() = default;
    void log(ncclDebugLogLevel level, const char *fmt, ...) const;
    /// TENSORLANE_NCCL_TRACE=1: every request's steps at INFO (a hang's diagnosis).
    /// TENSORLANE_NCCL_TRACE_FILE=PREFIX: the same steps kept in memory instead, each with the
    /// wall clock's microseconds, and written to PREFIX.PID when the process exits: timings
    /// NCCL's logger (a file write under its lock per line) does not distort.
    bool trace_ = false;
    /// One step of the trace (trace_): to NCCL's log, or into the kept lines.
    void trace(const char *fmt, ...) const __attribute__((format(printf, 2, 3)));
    ipc::TraceLines *trace_lines_ = nullptr;  ///< TENSORLANE_NCCL_TRACE_FILE's (leaked, as Net)
    ncclResult_t fail(Comm *c, const std::string &why);
    /// isend()'s eager choice: a grant, a free slot, `size` fitting one, the ring looked up.
    bool eagerFits(Comm *c, uint64_t size);
    /// An EAGER payload's arrival at a receive comm: checked, then copied or kept (mu_ held).
    void eagerArrived(Comm *c, const EagerBody &e, const tl_message &m);
    /// Copies ring slot `slot` (`size` bytes) into entry `index` of `r`, or starts the local
    /// write that does (GPU buffers); false when the comm failed.
    bool eagerConsume(Comm *c, Request &r, uint32_t index, uint32_t slot, uint64_t size);
    /// A ring slot's bytes are no longer needed: credits advance, and go to the sender when
    /// half the ring is owed.
    void eagerFree(Comm *c, uint32_t slot);
    /// Sends a CREDIT payload (the grant's size and the credits so far).
    void sendCredit(Comm *c);
    /// Sends the CTS of entries `idx[0..n)` of the posted request `r` (kCtsPerMessage a
    /// payload), with the credits so far; false when the comm failed.
    bool sendCts(Comm *c, const Request &r, const uint32_t *idx, int n);
    /// Sends CTS for every posted entry that has none yet (the grant is gone).
    void sendQuietCts(Comm *c);
    /// memcpy (spread over the copy pool when it is large), its bytes and time counted in
    /// `c`'s counts.
    void copy(Comm *c, void *to, const void *from, uint64_t bytes);
    /// Marks entry `index` of `r` landed with `size` bytes.
    void markLanded(Comm *c, Request &r, uint32_t index, uint64_t size);
    /// Takes every message waiting and hands it to its comm (mu_ held).
    void progress();
    void dispatch(const tl_message &m);
    /// A data write's notification: ends its request's entry (mu_ held).
    void landed(Comm *c, uint32_t slot, uint32_t generation, uint32_t index, uint64_t size,
                tl_status status);
    /// Probes the peer of `c` when nothing has come from it for a while (mu_ held).
    void checkAlive(Comm *c);
    /// trace_: a request pending 2 s, a send comm waiting for a CTS (once each / every 2 s).
    void traceRequest(Request &r, const char *what);
    void traceStall(Comm *c, const char *what);
    Comm *newComm(char kind);
    ncclResult_t exposeMailbox(Comm *c);
    /// Posts a plugin message (a header naming `to_comm` and `c`, then `bytes` of body) into
    /// `to`; its ticket in *t, the status as tl_write_msg gives it.
    tl_status postMessage(const Comm *c, Wire type, uint8_t count, uint64_t to_comm,
                          const void *body, size_t bytes, tl_remote to, tl_ticket *t);
    /// postMessage() to the comm's peer; a failure fails the comm. `ticket` null: progress()
    /// reaps the ticket.
    ncclResult_t send(Comm *c, Wire type, uint8_t count, const void *body, size_t bytes,
                      tl_remote to, tl_ticket *ticket);
    /// Forgets `c` (mu_ held); its regions go to doomed_.
    void release(Comm *c);
    /// A send comm learns its receiver's comm (and mailbox) from its first message.
    void learnReceiver(Comm *c, const WireHeader &h);

    /// mu_ held, and by which call since when (trace_: a watchdog tells a lock held 2 s); its
    /// end deregisters doomed_ with mu_ let go.
    class Guard {
    public:
        Guard(Net &net, const char *site);
        ~Guard();
        Guard(const Guard &) = delete;
        Guard &operator=(const Guard &) = delete;

    private:
        Net &net_;
    };
    void watchdog();

    std::mutex mu_;
    std::atomic<const char *> lock_site_{nullptr};
    std::atomic<int64_t> lock_since_ns_{0};
    std::atomic<int> lock_waiters_{0};
    /// How long the lock was held in all, over how many calls, since init() (mu_ held).
    uint64_t held_ns_ = 0;
    uint64_t held_calls_ = 0;
    std::chrono::steady_clock::time_point init_time_{};
    /// Regions to deregister once mu_ is let go (~Guard): never under the lock.
    std::vector<tl_region> doomed_;
    tl_client *client_ = nullptr;
    std::string node_;
    uint64_t nonce_ = 0;
    ncclDebugLogger_t logger_ = nullptr;
    uint64_t next_id_ = 1;
    uint32_t next_mr_ = 1;
    std::map<uint64_t, Comm *> comms_;            ///< every live comm by id (all kinds)
    std::map<tl_region, uint64_t> recv_regions_;  ///< receive comms' MR regions: their comm
    /// Tickets of messages nobody waits for, with their comm (0: closed): progress() reaps
    /// them, and a failed one fails its comm.
    std::vector<std::pair<tl_ticket, uint64_t>> unwaited_;
    std::string pci_path_;
    int speed_mbps_ = 10000;
    /// The eager ring of each receive comm (TENSORLANE_NCCL_EAGER_SLOTS / _BYTES; 0 bytes: off),
    /// and the test hook TENSORLANE_NCCL_EAGER_PREFER=1 (eager even when a CTS is there).
    uint32_t eager_slots_ = 16;
    uint32_t eager_bytes_ = 64 << 10;
    bool eager_prefer_ = false;
    /// TENSORLANE_NCCL_HOST_DIRECT (default 1): NCCL's host buffers are registered in place
    /// where the shim can share them (cuMem host allocations); 0: always a shadow.
    bool host_direct_ = true;
    /// Host MRs registered in place and shadowed (told at close).
    uint64_t host_direct_mrs_ = 0;
    uint64_t host_shadow_mrs_ = 0;
    /// Helpers for the shadow copies (TENSORLANE_NCCL_COPY_THREADS; made by init()).
    std::unique_ptr<CopyPool> pool_;
    /// Local writes from a ring slot into a GPU buffer: ticket, comm, slot.
    struct EagerCopy {
        tl_ticket ticket = 0;
        uint64_t comm = 0;
        uint32_t slot = 0;
    };
    std::vector<EagerCopy> eager_copies_;
};

}  // namespace tensorlane::nccl
