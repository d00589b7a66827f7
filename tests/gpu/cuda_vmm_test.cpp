// GPU tier: VMM memory (cuMemCreate pieces mapped with cuMemMap, what PyTorch's expandable
// segments and NCCL's buffers are) registered with tl_register: regions inside one piece and
// across pieces, written over the local, tcp and verbs transports and checked on the GPU; a
// client lying about its pieces (sizes, fds); pinned host memory made with cuMemCreate (NCCL's
// host buffers), which the sidecar maps for its CPU and writes in place, and a client that
// calls device pieces host memory; VMM memory without a shareable handle type,
// which only the verbs transport can reach; and the sidecar's mappings going with the regions.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../sidecar/harness.hpp"
#include "../sidecar/raw_client.hpp"
#include "../sidecar/status_json.hpp"
#include "gpu_support.hpp"
#include "tensorlane/ipc/control.hpp"
#include "tensorlane/tensorlane.h"

#ifdef TENSORLANE_HAVE_CUDA

namespace vmm_test {

namespace ipc = tensorlane::ipc;
using tlgpu::Cuda;

constexpr int kWaitMs = 30000;

/// `n` pieces of `piece` bytes (rounded up to the granularity) mapped back to back on device 0,
/// made with a POSIX-fd handle type when `shareable` (as PyTorch makes them), else none.
struct VmmBuffer {
    Cuda *cuda = nullptr;
    CUdeviceptr va = 0;
    uint64_t piece = 0;
    std::vector<CUmemGenericAllocationHandle> handles;
    std::string why;

    /// `host`: pinned host memory at NUMA node 0 (as NCCL's ncclCuMemHostAlloc makes its host
    /// buffers), readable and writable by the GPU and by this process's CPU.
    bool make(Cuda &c, int n, uint64_t piece_bytes, bool shareable, bool host = false) {
        cuda = &c;
        CUmemAllocationProp prop{};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        prop.requestedHandleTypes =
            shareable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
        size_t g = 0;
        if (!c.ok(c.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                  "cuMemGetAllocationGranularity")) {
            why = c.why;
            return false;
        }
        piece = (piece_bytes + g - 1) / g * g;
        if (!c.ok(c.cuMemAddressReserve(&va, piece * n, 0, 0, 0), "cuMemAddressReserve")) {
            why = c.why;
            return false;
        }
        for (int i = 0; i < n; ++i) {
            CUmemGenericAllocationHandle h = 0;
            if (!c.ok(c.cuMemCreate(&h, piece, &prop, 0), "cuMemCreate")) {
                why = c.why;
                return false;
            }
            handles.push_back(h);
            if (!c.ok(c.cuMemMap(va + i * piece, piece, 0, h, 0), "cuMemMap")) {
                why = c.why;
                return false;
            }
        }
        CUmemAccessDesc access[2]{};
        access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        access[0].location.id = 0;
        access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        access[1].location = prop.location;
        access[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        if (!c.ok(c.cuMemSetAccess(va, piece * n, access, host ? 2 : 1), "cuMemSetAccess")) {
            why = c.why;
            return false;
        }
        return true;
    }
    unsigned char *cpu() const { return reinterpret_cast<unsigned char *>(va); }
    uint64_t bytes() const { return piece * handles.size(); }
    /// The POSIX fd of piece `i` (-1 on failure); the caller closes it.
    int exportPiece(size_t i) const {
        int fd = -1;
        if (cuda->cuMemExportToShareableHandle(
                &fd, handles[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != CUDA_SUCCESS) {
            return -1;
        }
        return fd;
    }
    ~VmmBuffer() {
        if (cuda == nullptr) {
            return;
        }
        cuda->cuCtxSynchronize();
        for (size_t i = 0; i < handles.size(); ++i) {
            cuda->cuMemUnmap(va + i * piece, piece);
            cuda->cuMemRelease(handles[i]);
        }
        if (va != 0) {
            cuda->cuMemAddressFree(va, piece * (handles.empty() ? 1 : handles.size()));
        }
    }
};

/// Two sidecars listing each other (node-a, node-b) over `transport` (verbs: on the simulated
/// HCA, each its own device and loopback address).
struct Pair {
    tltest::TempDir dir;
    std::unique_ptr<tltest::Sidecar> a, b;
    explicit Pair(const std::string &transport) {
        const std::string key = dir.file("peer.key");
        tltest::writeFile(key, tltest::keyText('5'), 0600);
        const uint16_t pa = tltest::freePort(), pb = tltest::freePort();
        auto opts = [&](const char *name, uint16_t port, const char *peer, uint16_t peer_port,
                        int ip) {
            tltest::SidecarOptions o;
            o.name = name;
            o.listen = "127.0.0.1:" + std::to_string(port);
            o.key_file = key;
            o.tcp = "keepalive_ms = 200\npeer_timeout_ms = 3000\n";
            o.peers.push_back({peer, "127.0.0.1:" + std::to_string(peer_port)});
            o.transport = transport;
            if (transport == "verbs") {
                o.rdma_ip = tltest::uniqueLoopback(ip);
            }
            return o;
        };
        a = std::make_unique<tltest::Sidecar>(opts("node-a", pa, "node-b", pb, 31));
        b = std::make_unique<tltest::Sidecar>(opts("node-b", pb, "node-a", pa, 32));
    }
    bool ready() const { return a->ready() && b->ready(); }
    std::string logs() const { return a->log().substr(0, 8000) + b->log().substr(0, 8000); }
};

uint64_t mappingsOpen(tl_client *c) {
    const nlohmann::json st = tltest::sidecarStatus(c);
    return st.contains("cuda") ? st["cuda"].value("imports_open", uint64_t{UINT64_MAX})
                               : UINT64_MAX;
}

class CudaVmm : public ::testing::Test {
protected:
    void SetUp() override {
        if (!cuda.open()) {
            GTEST_SKIP() << cuda.why;
        }
    }

    /// A region across the three 2 MiB pieces of one VMM buffer (starting 1 MiB + 12 in, so it
    /// crosses two piece boundaries) written by `w` into a region inside the one 8 MiB piece of
    /// another, exposed by `r` on `node`; checked on the GPU, and nothing around it touched.
    void vmmToVmm(tl_client *w, tl_client *r, const char *node, const std::string &name,
                  uint32_t seed) {
        VmmBuffer src, dst;
        ASSERT_TRUE(src.make(cuda, 3, 2 << 20, true)) << src.why;
        ASSERT_TRUE(dst.make(cuda, 1, 8 << 20, true)) << dst.why;
        ASSERT_GE(src.piece, uint64_t{2} << 20);
        const uint64_t src_off = (1 << 20) + 12, dst_off = (2 << 20) + 256;
        const uint64_t bytes = src.piece + (1 << 20) + 40;  // into the third piece
        ASSERT_LE(dst_off + bytes, dst.bytes());
        ASSERT_EQ(cuda.fill(src.va + src_off, bytes / 4, seed), CUDA_SUCCESS);
        ASSERT_EQ(cuda.fill(dst.va, dst.bytes() / 4, seed + 1), CUDA_SUCCESS);  // poison
        ASSERT_EQ(
            cuda.fill(dst.va + dst_off + bytes, (dst.bytes() - dst_off - bytes) / 4, seed + 2),
            CUDA_SUCCESS);
        ASSERT_EQ(cuda.cuCtxSynchronize(), CUDA_SUCCESS);
        tl_region rs = 0, rd = 0;
        ASSERT_EQ(tl_register(w, reinterpret_cast<void *>(src.va + src_off), bytes, &rs), TL_OK)
            << tl_last_error();
        ASSERT_EQ(tl_register(r, reinterpret_cast<void *>(dst.va + dst_off), bytes, &rd), TL_OK)
            << tl_last_error();
        ASSERT_EQ(tl_expose(r, rd, name.c_str()), TL_OK) << tl_last_error();
        tl_remote remote = 0;
        ASSERT_EQ(tltest::lookupEventually(w, node, name.c_str(), &remote, nullptr,
                                           std::chrono::seconds(20)),
                  TL_OK)
            << tl_last_error();
        tl_ticket t = 0;
        ASSERT_EQ(tl_write(w, rs, 0, remote, 0, bytes, seed, &t), TL_OK) << tl_last_error();
        ASSERT_EQ(tl_wait(w, t, kWaitMs), TL_OK) << tl_last_error();
        tl_notification n{};
        ASSERT_EQ(tl_wait_notification(r, &n, kWaitMs), TL_OK) << tl_last_error();
        EXPECT_EQ(n.region, rd);
        EXPECT_EQ(n.bytes, bytes);
        EXPECT_EQ(cuda.mismatches(dst.va + dst_off, bytes / 4, seed), 0u);
        EXPECT_EQ(cuda.mismatches(dst.va, dst_off / 4, seed + 1), 0u) << "before the region";
        EXPECT_EQ(cuda.mismatches(dst.va + dst_off + bytes, (dst.bytes() - dst_off - bytes) / 4,
                                  seed + 2),
                  0u)
            << "after the region";
        // The sidecars mapped the pieces (no CUDA IPC for VMM memory) and let go with the regions.
        EXPECT_EQ(tl_deregister(w, rs), TL_OK);
        EXPECT_EQ(tl_deregister(r, rd), TL_OK);
        EXPECT_TRUE(tlgpu::waitFor([&] { return mappingsOpen(w) == 0 && mappingsOpen(r) == 0; }))
            << mappingsOpen(w) << " " << mappingsOpen(r);
    }

    /// The registration a shim sends for VMM memory, its claims the test's to falsify.
    static ipc::RegisterMsg vmmRegistration(uint64_t key, uint64_t span, uint64_t address) {
        ipc::RegisterMsg m{};
        m.h.type = static_cast<uint16_t>(ipc::MsgType::kRegister);
        m.kind = static_cast<uint32_t>(ipc::RegionKind::kCuda);
        m.flags = ipc::kRegisterVmm;
        m.parent = key;
        m.bytes = 4096;
        m.alloc_bytes = span;
        m.alloc_address = address;
        m.address = address;
        return m;
    }
    /// Stages `pieces` ({offset, bytes}) with `fds` (closed here) under a fresh key on `raw`,
    /// then registers them with `flags` at the client's `address`: the registration's reply.
    ipc::ReplyMsg stageAndRegister(tltest::RawClient &raw, std::vector<ipc::VmmPiece> pieces,
                                   std::vector<int> fds, uint64_t address,
                                   uint32_t flags = ipc::kRegisterVmm) {
        ipc::VmmPiecesMsg m{};
        m.h.type = static_cast<uint16_t>(ipc::MsgType::kVmmPieces);
        m.key = ++next_key_;
        m.count = static_cast<uint32_t>(pieces.size());
        uint64_t span = 0;
        for (size_t i = 0; i < pieces.size(); ++i) {
            m.pieces[i] = pieces[i];
            span = pieces[i].offset + pieces[i].bytes;
        }
        ipc::ReplyMsg r = raw.call(m, nullptr, fds);
        EXPECT_EQ(r.status, 0) << r.error;
        for (int fd : fds) {
            ::close(fd);
        }
        ipc::RegisterMsg reg = vmmRegistration(m.key, span, address);
        reg.flags = flags;
        setUuid(&reg);
        return raw.call(reg);
    }
    void setUuid(ipc::RegisterMsg *m) {
        CUdevice dev = 0;
        CUuuid uuid{};
        ASSERT_EQ(cuda.cuDeviceGet(&dev, 0), CUDA_SUCCESS);
        ASSERT_EQ(cuda.cuDeviceGetUuid(&uuid, dev), CUDA_SUCCESS);
        std::memcpy(m->device_uuid, uuid.bytes, sizeof(m->device_uuid));
    }

    Cuda cuda;
    uint64_t next_key_ = 0;
};

TEST_F(CudaVmm, LocalWritesBetweenPiecesLandWhole) {
    tltest::Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    tl_client *w = nullptr, *r = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &w), TL_OK);
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &r), TL_OK);
    vmmToVmm(w, r, "node-a", "vmm-local", 61);
    tl_disconnect(w);
    tl_disconnect(r);
}

TEST_F(CudaVmm, TcpWritesBetweenPiecesLandWhole) {
    Pair nodes("tcp");
    ASSERT_TRUE(nodes.ready()) << nodes.logs();
    tl_client *w = nullptr, *r = nullptr;
    ASSERT_EQ(tl_connect(nodes.a->socket().c_str(), &w), TL_OK);
    ASSERT_EQ(tl_connect(nodes.b->socket().c_str(), &r), TL_OK);
    vmmToVmm(w, r, "node-b", "vmm-tcp", 71);
    if (HasFailure()) {
        ADD_FAILURE() << nodes.logs();
    }
    tl_disconnect(w);
    tl_disconnect(r);
}

TEST_F(CudaVmm, VerbsWritesBetweenPiecesLandWhole) {
    Pair nodes("verbs");
    ASSERT_TRUE(nodes.ready()) << nodes.logs();
    tl_client *w = nullptr, *r = nullptr;
    ASSERT_EQ(tl_connect(nodes.a->socket().c_str(), &w), TL_OK);
    ASSERT_EQ(tl_connect(nodes.b->socket().c_str(), &r), TL_OK);
    vmmToVmm(w, r, "node-b", "vmm-verbs", 81);
    if (HasFailure()) {
        ADD_FAILURE() << nodes.logs();
    }
    const auto pa = tltest::peerStatus(w, "node-b");
    EXPECT_EQ(pa.value("transport", ""), "verbs") << pa.dump();
    std::printf("verbs VMM memory registration on this host: %s\n",
                pa.value("gpu_registration", "").c_str());
    tl_disconnect(w);
    tl_disconnect(r);
}

/// Pinned host memory made with cuMemCreate (NCCL's host buffers since 2.23): tl_register
/// shares it with the sidecar, which maps it for its CPU and reads and writes it in place. A
/// region across the two pieces of one such buffer written by `w` into a region of another
/// exposed by `r`, checked byte by byte with the CPU, nothing around it touched.
void hostVmmToHostVmm(Cuda &cuda, tl_client *w, tl_client *r, const char *node,
                      const std::string &name, uint32_t seed) {
    VmmBuffer src, dst;
    ASSERT_TRUE(src.make(cuda, 2, 2 << 20, true, true)) << src.why;
    ASSERT_TRUE(dst.make(cuda, 2, 2 << 20, true, true)) << dst.why;
    const uint64_t src_off = 4096 + 12, dst_off = 8192 + 4;
    const uint64_t bytes = src.piece + (512 << 10) + 40;  // into the second piece
    ASSERT_LE(dst_off + bytes, dst.bytes());
    for (uint64_t i = 0; i < src.bytes(); ++i) {
        src.cpu()[i] = static_cast<unsigned char>(seed + i * 7 + i / 4093);
    }
    std::memset(dst.cpu(), 0xa5, dst.bytes());
    tl_region rs = 0, rd = 0;
    ASSERT_EQ(tl_register(w, src.cpu() + src_off, bytes, &rs), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_register(r, dst.cpu() + dst_off, bytes, &rd), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_expose(r, rd, name.c_str()), TL_OK) << tl_last_error();
    tl_remote remote = 0;
    ASSERT_EQ(
        tltest::lookupEventually(w, node, name.c_str(), &remote, nullptr, std::chrono::seconds(20)),
        TL_OK)
        << tl_last_error();
    tl_ticket t = 0;
    ASSERT_EQ(tl_write(w, rs, 0, remote, 0, bytes, seed, &t), TL_OK) << tl_last_error();
    ASSERT_EQ(tl_wait(w, t, kWaitMs), TL_OK) << tl_last_error();
    tl_notification n{};
    ASSERT_EQ(tl_wait_notification(r, &n, kWaitMs), TL_OK) << tl_last_error();
    EXPECT_EQ(n.region, rd);
    EXPECT_EQ(n.bytes, bytes);
    EXPECT_EQ(std::memcmp(dst.cpu() + dst_off, src.cpu() + src_off, bytes), 0);
    size_t touched = 0;
    for (uint64_t i = 0; i < dst.bytes(); ++i) {
        touched += (i < dst_off || i >= dst_off + bytes) && dst.cpu()[i] != 0xa5;
    }
    EXPECT_EQ(touched, 0u) << "bytes changed outside the region";
    // The sidecars mapped the pieces, and let go of them with the regions.
    EXPECT_GE(mappingsOpen(w), 1u);
    EXPECT_EQ(tl_deregister(w, rs), TL_OK);
    EXPECT_EQ(tl_deregister(r, rd), TL_OK);
    EXPECT_TRUE(tlgpu::waitFor([&] { return mappingsOpen(w) == 0 && mappingsOpen(r) == 0; }))
        << mappingsOpen(w) << " " << mappingsOpen(r);
}

TEST_F(CudaVmm, HostMemoryByVmmIsWrittenInPlaceLocally) {
    tltest::Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    tl_client *w = nullptr, *r = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &w), TL_OK);
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &r), TL_OK);
    hostVmmToHostVmm(cuda, w, r, "node-a", "vmm-host-local", 91);
    if (HasFailure()) {
        ADD_FAILURE() << sc.log().substr(0, 8000);
    }
    tl_disconnect(w);
    tl_disconnect(r);
}

TEST_F(CudaVmm, HostMemoryByVmmIsWrittenInPlaceOverTcpAndVerbs) {
    for (const char *transport : {"tcp", "verbs"}) {
        SCOPED_TRACE(transport);
        Pair nodes(transport);
        ASSERT_TRUE(nodes.ready()) << nodes.logs();
        tl_client *w = nullptr, *r = nullptr;
        ASSERT_EQ(tl_connect(nodes.a->socket().c_str(), &w), TL_OK);
        ASSERT_EQ(tl_connect(nodes.b->socket().c_str(), &r), TL_OK);
        hostVmmToHostVmm(cuda, w, r, "node-b", std::string("vmm-host-") + transport, 101);
        const auto pa = tltest::peerStatus(w, "node-b");
        EXPECT_EQ(pa.value("transport", ""), transport) << pa.dump();
        if (HasFailure()) {
            ADD_FAILURE() << nodes.logs();
        }
        tl_disconnect(w);
        tl_disconnect(r);
    }
}

// The CPU is only ever given host memory: a registration that calls device pieces host memory
// (the sidecar's CPU would fault on them) or host pieces device memory is refused, nothing stays
// mapped, and the sidecar lives on.
TEST_F(CudaVmm, AHostClaimAboutDeviceMemoryIsRefused) {
    tltest::Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    tl_client *probe = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &probe), TL_OK);
    tltest::RawClient raw;
    ASSERT_TRUE(raw.connect(sc.socket()));
    VmmBuffer dev, host;
    ASSERT_TRUE(dev.make(cuda, 1, 2 << 20, true)) << dev.why;
    ASSERT_TRUE(host.make(cuda, 1, 2 << 20, true, true)) << host.why;
    const auto attempt = [&](const VmmBuffer &b, uint32_t flags) {
        return stageAndRegister(raw, {{0, b.piece}}, {b.exportPiece(0)}, b.va, flags);
    };
    ipc::ReplyMsg r = attempt(dev, ipc::kRegisterVmm | ipc::kRegisterVmmHost);
    EXPECT_EQ(static_cast<ipc::Code>(r.status), ipc::Code::kInvalid) << r.error;
    EXPECT_NE(std::string(r.error).find("is not host memory"), std::string::npos) << r.error;
    r = attempt(host, ipc::kRegisterVmm);
    EXPECT_EQ(static_cast<ipc::Code>(r.status), ipc::Code::kInvalid) << r.error;
    EXPECT_NE(std::string(r.error).find("is host memory"), std::string::npos) << r.error;
    // The flag without pieces means nothing.
    ipc::RegisterMsg bare = vmmRegistration(++next_key_, host.piece, host.va);
    bare.flags = ipc::kRegisterVmmHost;
    r = raw.call(bare);
    EXPECT_EQ(static_cast<ipc::Code>(r.status), ipc::Code::kInvalid) << r.error;
    // The honest host registration maps.
    r = attempt(host, ipc::kRegisterVmm | ipc::kRegisterVmmHost);
    EXPECT_EQ(r.status, 0) << r.error;
    EXPECT_EQ(mappingsOpen(probe), 1u);
    raw.sock.reset();
    EXPECT_TRUE(tlgpu::waitFor([&] { return mappingsOpen(probe) == 0; })) << mappingsOpen(probe);
    EXPECT_TRUE(sc.alive());
    tl_disconnect(probe);
}

// A client that lies about its pieces is refused at the sidecar's own mapping (the driver maps
// a physical allocation whole or not at all), and every mapping it began is undone.
TEST_F(CudaVmm, AClientLyingAboutItsPiecesIsRefused) {
    tltest::Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    tl_client *probe = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &probe), TL_OK);
    tltest::RawClient raw;
    ASSERT_TRUE(raw.connect(sc.socket()));
    VmmBuffer two, big;
    ASSERT_TRUE(two.make(cuda, 2, 2 << 20, true)) << two.why;
    ASSERT_TRUE(big.make(cuda, 1, 4 << 20, true)) << big.why;
    const uint64_t g = two.piece;
    const auto attempt = [&](std::vector<ipc::VmmPiece> pieces, std::vector<int> fds,
                             uint64_t address) {
        return stageAndRegister(raw, std::move(pieces), std::move(fds), address);
    };
    // A piece claimed twice its size (the span with it), and one claimed half its size.
    ipc::ReplyMsg r =
        attempt({{0, 2 * g}, {2 * g, g}}, {two.exportPiece(0), two.exportPiece(1)}, two.va);
    EXPECT_EQ(static_cast<ipc::Code>(r.status), ipc::Code::kInvalid) << r.error;
    EXPECT_NE(std::string(r.error).find("not the size the client says"), std::string::npos)
        << r.error;
    r = attempt({{0, big.piece / 2}}, {big.exportPiece(0)}, big.va);
    EXPECT_EQ(static_cast<ipc::Code>(r.status), ipc::Code::kInvalid) << r.error;
    // Pieces in the wrong order (sizes equal: the sidecar cannot tell, and maps what it was
    // given; the region is the client's own memory either way) are not a lie it can catch, but
    // an fd that is no CUDA allocation is.
    ipc::UniqueFd memfd(::memfd_create("tl-not-cuda", MFD_CLOEXEC));
    ASSERT_EQ(::ftruncate(memfd.get(), static_cast<off_t>(g)), 0);
    r = attempt({{0, g}, {g, g}}, {two.exportPiece(0), ::dup(memfd.get())}, two.va);
    EXPECT_EQ(static_cast<ipc::Code>(r.status), ipc::Code::kCuda) << r.error;
    EXPECT_NE(std::string(r.error).find("piece 1"), std::string::npos) << r.error;
    EXPECT_NE(std::string(r.error).find("not a CUDA allocation's fd"), std::string::npos)
        << r.error;
    // The honest one works, through the same raw path.
    r = attempt({{0, g}, {g, g}}, {two.exportPiece(0), two.exportPiece(1)}, two.va);
    EXPECT_EQ(r.status, 0) << r.error;
    EXPECT_EQ(mappingsOpen(probe), 1u);
    // Every refused mapping was undone; the honest one goes with its session.
    raw.sock.reset();
    EXPECT_TRUE(tlgpu::waitFor([&] { return mappingsOpen(probe) == 0; })) << mappingsOpen(probe);
    EXPECT_TRUE(sc.alive());
    tl_disconnect(probe);
}

// VMM memory made without a shareable handle type goes as the dma-buf of its span alone: it
// registers, and the transports that copy through the sidecar's mappings refuse it with the
// reason (the verbs transport registers the dma-buf with the NIC; the simulated HCA can reach
// GPU memory only through a mapping of the sidecar's, so that path is for real NICs).
TEST_F(CudaVmm, WithoutAShareableHandleOnlyTheDmabufGoes) {
    tltest::Sidecar sc;
    ASSERT_TRUE(sc.ready()) << sc.log();
    tl_client *c = nullptr;
    ASSERT_EQ(tl_connect(sc.socket().c_str(), &c), TL_OK);
    VmmBuffer buf;
    ASSERT_TRUE(buf.make(cuda, 2, 2 << 20, false)) << buf.why;
    tl_region rv = 0, rh = 0;
    ASSERT_EQ(tl_register(c, reinterpret_cast<void *>(buf.va + 4096), buf.piece, &rv), TL_OK)
        << tl_last_error();
    void *host = nullptr;
    ASSERT_EQ(tl_alloc_host(c, buf.piece, &host, &rh), TL_OK);
    ASSERT_EQ(tl_expose(c, rh, "host"), TL_OK);
    ASSERT_EQ(tl_expose(c, rv, "vmm"), TL_OK);
    tl_remote to_host = 0, to_vmm = 0;
    ASSERT_EQ(tl_lookup(c, "node-a", "host", &to_host, nullptr), TL_OK);
    ASSERT_EQ(tl_lookup(c, "node-a", "vmm", &to_vmm, nullptr), TL_OK);
    tl_ticket t = 0;
    ASSERT_EQ(tl_write(c, rv, 0, to_host, 0, 4096, 1, &t), TL_OK);
    EXPECT_EQ(tl_wait(c, t, kWaitMs), TL_ECUDA);
    EXPECT_NE(std::string(tl_last_error()).find("only the verbs transport"), std::string::npos)
        << tl_last_error();
    ASSERT_EQ(tl_write(c, rh, 0, to_vmm, 0, 4096, 2, &t), TL_OK);
    EXPECT_EQ(tl_wait(c, t, kWaitMs), TL_ECUDA);
    EXPECT_EQ(mappingsOpen(c), 0u);  // nothing of it was mapped
    EXPECT_EQ(tl_deregister(c, rv), TL_OK);
    tl_disconnect(c);
}

}  // namespace vmm_test

#endif  // TENSORLANE_HAVE_CUDA
