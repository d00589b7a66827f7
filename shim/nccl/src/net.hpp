// The NCCL net plugin's core (docs/nccl.md): NCCL's send/receive connections carried on
// tensorlane's own calls through the process's one tl_client.
//
// Protocol (the shape of NCCL's IB transport, a FIFO the receiver writes):
//  - listen() exposes a small mailbox region; the handle names node, process nonce and
//    listener. connect() looks the mailbox up and sends CONNECT (a message: payload only).
//  - accept() takes a CONNECT, looks up the sender's mailbox and makes the recv comm.
//  - irecv() sends CTS (clear to send) to the sender's mailbox: per posted buffer its exposed
//    region, offset, size and tag. Receives in flight per comm are bounded
//    (NCCL_NET_MAX_REQUESTS): the sender's CTS queue never holds more.
//  - isend() takes the oldest CTS (waits, returning a NULL request, until one is there), checks
//    the tag and the size, and writes the data into the receiver's buffer with tl_write, its
//    immediate naming request, entry and generation (dataImm()); the ticket is the send's
//    request. The receiver's notification (region, bytes, immediate) arrives once the data is
//    in place: that ends its entry. A zero-byte send has no bytes to write: it goes as a DATA
//    message (payload only).
//  - A comm whose peer stops answering (a write or a probe of its mailbox fails: the process
//    died, its region went, its sidecar is unreachable) fails every request of it, and later
//    calls on it, so NCCL aborts instead of hanging.
// Host memory NCCL registers (cudaHostAlloc'ed, private to the process) cannot be a region:
// each host MR has a shadow tl_alloc_host buffer of its size; sends copy into it, receives out
// of it (one memcpy at each end). CUDA memory (cudaMalloc or NCCL's cuMemCreate buffers)
// registers directly (tl_register), else by its dma-buf (tl_register_dmabuf).
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
#include <string>
#include <vector>

#include "tensorlane/nccl_net.h"
#include "tensorlane/tensorlane.h"

namespace tensorlane::nccl {

inline constexpr uint32_t kWireMagic = 0x434e4c54u;  // "TLNC"
inline constexpr uint32_t kWireVersion = 1;
inline constexpr int kMaxRecvs = 8;  // buffers of one grouped irecv (one CTS payload)

/// What listen() hands NCCL to give the connecting rank (at most NCCL_NET_HANDLE_MAXSIZE).
struct Handle {
    uint32_t magic;
    uint32_t version;
    uint64_t nonce;  ///< the listening process's (names its regions)
    uint64_t listener;
    char node[64];  ///< the listener's sidecar node
};
static_assert(sizeof(Handle) <= NCCL_NET_HANDLE_MAXSIZE);

enum class Wire : uint8_t { kConnect = 1, kCts = 2, kData = 3, kPing = 4 };

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
    uint64_t offset;  ///< in the MR
    uint64_t size;    ///< posted bytes
};
struct CtsBody {
    uint32_t request;  ///< the receiver's request slot
    uint32_t generation;
    CtsEntry entries[kMaxRecvs];
};
struct DataBody {
    uint32_t request;
    uint32_t generation;
    uint32_t index;
    uint32_t reserved;
    uint64_t size;
};
static_assert(sizeof(WireHeader) + sizeof(CtsBody) <= TL_MAX_PAYLOAD);

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
    uint64_t size = 0;
    bool exposed = false;
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
    std::vector<Request> requests;  ///< NCCL_NET_MAX_REQUESTS slots
    // send: the receiver's posted buffers, oldest first (one CTS each, entries not yet used)
    struct Cts {
        uint64_t from = 0;
        CtsBody body{};
        int count = 0;
        bool used[kMaxRecvs] = {};
        int left = 0;
    };
    std::deque<Cts> cts;
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
    bool trace_ = false;
    ncclResult_t fail(Comm *c, const std::string &why);
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
};

}  // namespace tensorlane::nccl
