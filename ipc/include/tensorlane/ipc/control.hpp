// The control protocol on the sidecar's Unix SOCK_SEQPACKET socket: one fixed-size message per
// datagram, fds alongside with SCM_RIGHTS. Infrequent calls (register, expose, lookup) travel
// here; requests travel in the shared-memory rings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tensorlane/ipc/layout.hpp"

namespace tensorlane::ipc {

inline constexpr uint32_t kControlMagic = 0x4c43544cu;  // "TLCL"
/// 2: RegisterMsg for CUDA memory (allocation, device UUID, dma-buf fd), stream messages.
/// 3: VMM memory (kVmmPieces, kRegisterVmm) and dma-buf registrations (kRegisterDmabufOnly).
inline constexpr uint16_t kControlVersion = 3;
inline constexpr size_t kErrorBytes = 256;
/// The largest datagram either side sends or accepts (status replies carry JSON text).
inline constexpr size_t kMaxControlMessage = 64 * 1024;

enum class MsgType : uint16_t {
    kHello = 1,      ///< sidecar → client, first message; fds: segment, to-sidecar, to-client
    kAllocHost = 2,  ///< client → sidecar; reply carries the buffer's fd
    kRegister = 3,
    kDeregister = 4,
    kExpose = 5,
    kLookup = 6,
    kStatus = 7,  ///< reply is StatusReply (JSON)
    kReply = 8,
    // The stream-ordered calls (docs/gpu.md), numbered apart from the first calls.
    kStreamSetup = 16,      ///< a bare MsgHeader; reply carries the stream segment's fd
    kStreamSubscribe = 17,  ///< StreamSubscribeMsg; reply value0: the NotifySlot index
    kStreamCredit = 18,     ///< StreamCreditMsg
    /// ExposeAccessMsg: tl_expose_access (an expose with an access list). kExpose stays
    /// tl_expose's message with the default access (kAccessPeers, nobody else).
    kExposeAccess = 19,
    /// VmmPiecesMsg with `count` fds: pieces of a VMM registration that follows (kRegisterVmm).
    kVmmPieces = 20,
};

struct MsgHeader {
    uint32_t magic;    ///< kControlMagic
    uint16_t version;  ///< kControlVersion
    uint16_t type;     ///< MsgType
    uint64_t seq;      ///< echoed in the reply
};
static_assert(sizeof(MsgHeader) == 16);

/// The sidecar's greeting: either a session (status 0, three fds) or a refusal (no fds).
struct HelloMsg {
    MsgHeader h;
    int32_t status;      ///< Code
    uint32_t poll_mode;  ///< 0 busy, 1 adaptive, 2 event
    uint32_t spin_us;
    uint32_t ring_depth;
    uint64_t session_id;
    uint64_t segment_bytes;
    char node_name[kPeerNameBytes];
    char error[kErrorBytes];
};

/// Region kinds in RegisterMsg.
enum class RegionKind : uint32_t {
    kHost = 1,  ///< a range of a buffer from AllocHost
    kCuda = 2,  ///< device memory: a range of a cuMemAlloc/cudaMalloc allocation
};

/// RegisterMsg.flags (kCuda).
enum RegisterFlag : uint32_t {
    /// The allocation `parent` was exported with an earlier registration of this client that
    /// is still alive: no IPC handle or fd comes with this one. kNotFound if the sidecar no
    /// longer knows it (then the client exports again).
    kRegisterReuse = 1u << 0,
    /// A dma-buf fd of the whole allocation comes with the message (SCM_RIGHTS).
    kRegisterDmabuf = 1u << 1,
    /// VMM memory (cuMemCreate, mapped with cuMemMap): the allocation is the span of pieces
    /// that kVmmPieces messages with key `parent` staged before this message, `alloc_bytes`
    /// their sum, `alloc_address` the client's address of the first. No IPC handle; never a
    /// reuse (each VMM registration exports its pieces).
    kRegisterVmm = 1u << 2,
    /// Memory known only by the dma-buf fd that comes with the message (kRegisterDmabuf set
    /// too): tl_register_dmabuf, or VMM memory made without a shareable handle type. The
    /// sidecar cannot map it; only transports that register dma-bufs (verbs) reach it. The
    /// allocation is the whole dma-buf (its size is the kernel's); `offset` is where the
    /// region starts in it.
    kRegisterDmabufOnly = 1u << 3,
    /// With kRegisterVmm: the pieces are pinned host memory (cuMemCreate at a host location,
    /// as NCCL's host buffers), not device memory. The sidecar checks that every piece's
    /// allocation is at a host location, maps them for its CPU and makes a host region of
    /// them, which every transport reads and writes in place (no device copy, no staging).
    /// `device_uuid` is ignored (the memory belongs to no device).
    kRegisterVmmHost = 1u << 4,
};

/// The most pieces one kVmmPieces message carries (each with its fd).
inline constexpr uint32_t kMaxVmmPiecesPerMessage = 32;
/// The most pieces one VMM registration may span, and the most a session may have staged
/// (each is an fd in the sidecar until the registration maps it): 80 GiB of PyTorch's 20 MiB
/// expandable-segment pieces.
inline constexpr uint32_t kMaxVmmPieces = 4096;

/// One piece of VMM memory: a physical allocation (cuMemCreate) mapped whole at `offset` in
/// the registered span; its POSIX fd (cuMemExportToShareableHandle) travels alongside.
struct VmmPiece {
    uint64_t offset;  ///< in the span; the pieces are contiguous from 0
    uint64_t bytes;   ///< the physical allocation's size, all of which is mapped there
};

/// kVmmPieces: pieces [first, first + count) of the VMM registration `key`, in order, with one
/// fd each. The kRegister with kRegisterVmm and parent = key that follows consumes them.
struct VmmPiecesMsg {
    MsgHeader h;
    uint64_t key;
    uint32_t first;  ///< pieces staged before for `key` (batches come in order)
    uint32_t count;  ///< 1..kMaxVmmPiecesPerMessage, and as many fds
    VmmPiece pieces[kMaxVmmPiecesPerMessage];
};
static_assert(sizeof(VmmPiecesMsg) == 16 + 16 + 16 * kMaxVmmPiecesPerMessage);

struct AllocHostMsg {
    MsgHeader h;
    uint64_t bytes;
};

struct RegisterMsg {
    MsgHeader h;
    uint32_t kind;    ///< RegionKind
    uint32_t flags;   ///< RegisterFlag bits (kCuda)
    uint64_t parent;  ///< kHost: the AllocHost region; kCuda: the allocation's key (its CUDA
                      ///< buffer id, unique in the client's process for its lifetime)
    uint64_t offset;  ///< where the range starts in that buffer or allocation
    uint64_t bytes;
    uint64_t address;                   ///< the client's virtual address (diagnostics, CUDA)
    unsigned char cuda_ipc_handle[64];  ///< CUipcMemHandle of the allocation (kCuda, exported)
    uint64_t alloc_bytes;               ///< kCuda: size of the whole allocation
    uint64_t alloc_address;             ///< kCuda: the client's address of its first byte
    unsigned char device_uuid[16];      ///< kCuda: CUuuid of its device (ordinals differ)
    int32_t device_ordinal;             ///< kCuda: the client's ordinal (diagnostics)
    int32_t dmabuf_error;  ///< kCuda, no fd: the CUresult of cuMemGetHandleForAddressRange
};

/// kStreamSubscribe: tl_stream_wait_notification's first call for (region, imm).
struct StreamSubscribeMsg {
    MsgHeader h;
    uint64_t region;
    uint32_t imm;
    uint32_t reserved;
};

/// kStreamCredit: notifications for a new subscription that had reached the client before the
/// sidecar began to count them (the client took them out of its queue); the sidecar hands them
/// over through the subscription's flag like later ones.
struct StreamCreditMsg {
    MsgHeader h;
    uint32_t slot;
    uint32_t count;
};

struct DeregisterMsg {
    MsgHeader h;
    uint64_t region;
};

struct ExposeMsg {
    MsgHeader h;
    uint64_t region;
    char name[kRegionNameBytes];
};

/// ExposeAccessMsg.flags (TL_ACCESS_* in tensorlane.h, same values).
enum AccessFlag : uint32_t {
    kAccessPeers = 1u << 0,     ///< offered to the configured peers (tl_expose's default)
    kAccessLocalAny = 1u << 1,  ///< every local client the sidecar admits may write
};
inline constexpr uint32_t kAccessFlagMask = kAccessPeers | kAccessLocalAny;
/// The most uids and the most gids one access list names (TL_EINVAL past that).
inline constexpr uint32_t kMaxAccessIds = 64;

/// kExposeAccess: tl_expose_access. Besides the owner's uid and root, the local clients whose
/// uid is one of `uids[0, n_uids)` or whose groups (primary or supplementary) meet
/// `gids[0, n_gids)` may write; every local client with kAccessLocalAny.
struct ExposeAccessMsg {
    MsgHeader h;
    uint64_t region;
    char name[kRegionNameBytes];
    uint32_t flags;   ///< AccessFlag bits
    uint32_t n_uids;  ///< at most kMaxAccessIds
    uint32_t n_gids;  ///< at most kMaxAccessIds
    uint32_t reserved;
    uint32_t uids[kMaxAccessIds];
    uint32_t gids[kMaxAccessIds];
};
static_assert(sizeof(ExposeAccessMsg) == 16 + 8 + 64 + 16 + 2 * 4 * 64);

struct LookupMsg {
    MsgHeader h;
    char peer[kPeerNameBytes];
    char name[kRegionNameBytes];
};

/// The status document in pages of at most kMaxStatusText bytes: page 0 makes a snapshot of it
/// (kept by the session) and answers its first page, value0 = the page's bytes, value1 = the
/// whole document's; page k > 0 answers the snapshot's k-th page. A sidecar before paging
/// answered page 0 alone with value1 = 0 (the shim then takes that one page).
struct StatusMsg {
    MsgHeader h;
    uint32_t flags;
    uint32_t page;
};

/// The answer to every client call: a status, two values (region id, bytes, ...) and a reason.
struct ReplyMsg {
    MsgHeader h;
    int32_t status;  ///< Code
    uint32_t reserved;
    uint64_t value0;
    uint64_t value1;
    char error[kErrorBytes];
};

/// kStatus's answer: a ReplyMsg followed by `value0` bytes of JSON text.
inline constexpr size_t kMaxStatusText = kMaxControlMessage - sizeof(ReplyMsg);

static_assert(std::is_trivially_copyable_v<HelloMsg> && std::is_trivially_copyable_v<ReplyMsg>);
static_assert(sizeof(HelloMsg) == 16 + 32 + 64 + 256);
static_assert(sizeof(RegisterMsg) == 16 + 40 + 64 + 40);

/// Copies a C string into a fixed field, always NUL-terminated (truncates).
void copyName(char *dst, size_t dst_bytes, const char *src);
/// Reads a fixed field that must hold a NUL-terminated string of 1..n-1 bytes. False otherwise.
bool readName(const char *field, size_t field_bytes, const char **out);

}  // namespace tensorlane::ipc
