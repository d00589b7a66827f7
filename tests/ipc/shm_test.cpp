// Unit tests of the shared-memory segments: mode, size, owner, no name left behind, mappings.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>

#include "tensorlane/ipc/shm.hpp"

namespace tensorlane::ipc {
namespace {

size_t pageSize() {
    return static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

/// Names in /dev/shm that a segment of ours would have had.
std::set<std::string> tensorlaneShmNames() {
    std::set<std::string> out;
    if (DIR *d = ::opendir("/dev/shm")) {
        while (const dirent *e = ::readdir(d)) {
            if (std::strncmp(e->d_name, "tensorlane-", 11) == 0) {
                out.insert(e->d_name);
            }
        }
        ::closedir(d);
    }
    return out;
}

/// Whether [p, p + bytes) is mapped in this process (mincore fails with ENOMEM otherwise).
bool isMapped(const void *p, size_t bytes) {
    unsigned char vec[16];
    return ::mincore(const_cast<void *>(p), bytes, vec) == 0;
}

TEST(Segment, CreateGivesPrivateModeAndRoundedSize) {
    const size_t page = pageSize();
    for (size_t request : {size_t{1}, page - 1, page, page + 1, 3 * page + 17}) {
        SCOPED_TRACE(request);
        SharedSegment seg;
        std::string error;
        ASSERT_EQ(createSegment(request, ::getuid(), ::getgid(), &seg, &error), 0) << error;
        ASSERT_TRUE(seg.fd);
        ASSERT_TRUE(seg.mapping);
        struct stat st;
        ASSERT_EQ(::fstat(seg.fd.get(), &st), 0);
        EXPECT_EQ(st.st_mode & 0777, 0600u);
        const size_t rounded = (request + page - 1) / page * page;
        EXPECT_EQ(static_cast<size_t>(st.st_size), rounded);
        EXPECT_EQ(segmentSize(seg.fd.get()), rounded);
        EXPECT_EQ(seg.mapping.size(), rounded);
        EXPECT_EQ(st.st_uid, ::getuid());
        EXPECT_EQ(st.st_gid, ::getgid());
        EXPECT_TRUE(::fcntl(seg.fd.get(), F_GETFD) & FD_CLOEXEC);
        // Zero-filled, all of it.
        const auto *bytes = static_cast<const unsigned char *>(seg.mapping.data());
        for (size_t i = 0; i < rounded; ++i) {
            ASSERT_EQ(bytes[i], 0u) << "byte " << i;
        }
    }
}

TEST(Segment, CreateLeavesNoNameInDevShm) {
    const auto before = tensorlaneShmNames();
    {
        SharedSegment a, b;
        std::string error;
        ASSERT_EQ(createSegment(4096, ::getuid(), ::getgid(), &a, &error), 0) << error;
        ASSERT_EQ(createSegment(1 << 20, ::getuid(), ::getgid(), &b, &error), 0) << error;
        // While the segments are alive, nobody can find them by name.
        EXPECT_EQ(tensorlaneShmNames(), before);
        struct stat st;
        ASSERT_EQ(::fstat(a.fd.get(), &st), 0);
        EXPECT_EQ(st.st_nlink, 0u) << "the object still has a name";
    }
    EXPECT_EQ(tensorlaneShmNames(), before);
}

TEST(Segment, CreateChownsToTheClient) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "changing a segment's owner to another uid needs root";
    }
    constexpr uid_t kNobody = 65534;
    constexpr gid_t kNogroup = 65534;
    SharedSegment seg;
    std::string error;
    ASSERT_EQ(createSegment(8192, kNobody, kNogroup, &seg, &error), 0) << error;
    struct stat st;
    ASSERT_EQ(::fstat(seg.fd.get(), &st), 0);
    EXPECT_EQ(st.st_uid, kNobody);
    EXPECT_EQ(st.st_gid, kNogroup);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    // The sidecar's own mapping still works.
    static_cast<char *>(seg.mapping.data())[0] = 1;
}

TEST(Segment, TwoMappingsSeeEachOthersWrites) {
    SharedSegment seg;
    std::string error;
    ASSERT_EQ(createSegment(3 * pageSize(), ::getuid(), ::getgid(), &seg, &error), 0) << error;
    Mapping a, b;
    ASSERT_EQ(mapSegment(seg.fd.get(), seg.mapping.size(), &a), 0);
    ASSERT_EQ(mapSegment(seg.fd.get(), seg.mapping.size(), &b), 0);
    ASSERT_NE(a.data(), b.data());
    auto *pa = static_cast<volatile uint64_t *>(a.data());
    auto *pb = static_cast<volatile uint64_t *>(b.data());
    auto *ps = static_cast<volatile uint64_t *>(seg.mapping.data());
    const size_t last = seg.mapping.size() / sizeof(uint64_t) - 1;
    pa[0] = 0x1111;
    pb[last] = 0x2222;
    ps[1] = 0x3333;
    EXPECT_EQ(pb[0], 0x1111u);
    EXPECT_EQ(ps[0], 0x1111u);
    EXPECT_EQ(pa[last], 0x2222u);
    EXPECT_EQ(ps[last], 0x2222u);
    EXPECT_EQ(pa[1], 0x3333u);
    EXPECT_EQ(pb[1], 0x3333u);
}

TEST(Segment, MappingMoveLeavesSourceEmptyAndUnmapsOnce) {
    SharedSegment seg;
    std::string error;
    ASSERT_EQ(createSegment(pageSize(), ::getuid(), ::getgid(), &seg, &error), 0) << error;
    void *addr = nullptr;
    {
        Mapping m2;
        {
            Mapping m1;
            ASSERT_EQ(mapSegment(seg.fd.get(), pageSize(), &m1), 0);
            addr = m1.data();
            m2 = Mapping(std::move(m1));
            EXPECT_FALSE(m1);
            EXPECT_EQ(m1.data(), nullptr);
            EXPECT_EQ(m1.size(), 0u);
            EXPECT_TRUE(m2);
            EXPECT_EQ(m2.data(), addr);
            EXPECT_EQ(m2.size(), pageSize());
        }
        // The moved-from owner is gone; the mapping is still there.
        ASSERT_TRUE(isMapped(addr, pageSize()));
        static_cast<volatile char *>(addr)[0] = 7;
        EXPECT_EQ(static_cast<char *>(seg.mapping.data())[0], 7);

        // Self move-assignment keeps it.
        Mapping &alias = m2;
        m2 = std::move(alias);
        EXPECT_EQ(m2.data(), addr);
        EXPECT_TRUE(isMapped(addr, pageSize()));
    }
    EXPECT_FALSE(isMapped(addr, pageSize())) << "the last owner did not unmap";
}

TEST(Segment, MappingMoveAssignUnmapsTheOldOne) {
    SharedSegment seg;
    std::string error;
    ASSERT_EQ(createSegment(pageSize(), ::getuid(), ::getgid(), &seg, &error), 0) << error;
    Mapping a, b;
    ASSERT_EQ(mapSegment(seg.fd.get(), pageSize(), &a), 0);
    ASSERT_EQ(mapSegment(seg.fd.get(), pageSize(), &b), 0);
    void *old_a = a.data();
    void *addr_b = b.data();
    a = std::move(b);
    EXPECT_FALSE(isMapped(old_a, pageSize()));
    EXPECT_EQ(a.data(), addr_b);
    EXPECT_TRUE(isMapped(addr_b, pageSize()));
    EXPECT_FALSE(b);
}

TEST(Segment, CreateRejectsZeroAndAbsurdSizes) {
    for (size_t bad :
         {size_t{0}, (size_t{1} << 46) + 1, size_t{1} << 60, std::numeric_limits<size_t>::max()}) {
        SCOPED_TRACE(bad);
        SharedSegment seg;
        std::string error;
        EXPECT_EQ(createSegment(bad, ::getuid(), ::getgid(), &seg, &error), EINVAL);
        EXPECT_FALSE(error.empty());
        EXPECT_FALSE(seg.fd);
        EXPECT_FALSE(seg.mapping);
    }
}

TEST(Segment, MapSegmentErrors) {
    Mapping m;
    EXPECT_EQ(mapSegment(-1, 4096, &m), EBADF);
    EXPECT_FALSE(m);
    SharedSegment seg;
    std::string error;
    ASSERT_EQ(createSegment(pageSize(), ::getuid(), ::getgid(), &seg, &error), 0) << error;
    EXPECT_EQ(mapSegment(seg.fd.get(), 0, &m), EINVAL);
    EXPECT_FALSE(m);
    EXPECT_EQ(segmentSize(-1), 0u);
}

TEST(Segment, SizeIsSealedBeforeTheFdLeaves) {
    // A client that ftruncates the fd it was sent must not be able to pull pages out from under
    // the sidecar's mapping (a SIGBUS in the sidecar): shrinking and growing both fail.
    SharedSegment seg;
    std::string error;
    ASSERT_EQ(createSegment(4 * pageSize(), ::getuid(), ::getgid(), &seg, &error), 0) << error;
    EXPECT_TRUE(isSealedSegment(seg.fd.get()));
    EXPECT_EQ(::ftruncate(seg.fd.get(), 0), -1);
    EXPECT_EQ(errno, EPERM);
    EXPECT_EQ(::ftruncate(seg.fd.get(), static_cast<off_t>(8 * pageSize())), -1);
    EXPECT_EQ(errno, EPERM);
    EXPECT_EQ(::fcntl(seg.fd.get(), F_ADD_SEALS, F_SEAL_WRITE), -1) << "F_SEAL_SEAL is set";
    EXPECT_EQ(segmentSize(seg.fd.get()), 4 * pageSize());
    // Punching a hole would free pages too; a sealed memfd refuses that as well.
    EXPECT_EQ(::fallocate(seg.fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                          static_cast<off_t>(pageSize())),
              0)
        << "punching a hole is allowed by the seals (the pages read back as zeros, no SIGBUS)";
    // Every page of the sidecar's mapping is still readable and writable.
    auto *p = static_cast<volatile unsigned char *>(seg.mapping.data());
    for (size_t off = 0; off < seg.mapping.size(); off += pageSize()) {
        p[off] = 1;
        EXPECT_EQ(p[off], 1);
    }
    // A reopened description of the same file (what /proc/self/fd/N gives) is sealed too.
    const std::string path = "/proc/self/fd/" + std::to_string(seg.fd.get());
    const int again = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(again, 0);
    EXPECT_EQ(::ftruncate(again, 0), -1);
    ::close(again);
}

TEST(Segment, OrdinaryFilesAreNotSealedSegments) {
    char path[] = "/tmp/tensorlane-seal-XXXXXX";
    const int fd = ::mkstemp(path);
    ASSERT_GE(fd, 0);
    ::unlink(path);
    EXPECT_FALSE(isSealedSegment(fd));
    ::close(fd);
    EXPECT_FALSE(isSealedSegment(-1));
}

TEST(Segment, BackingIsAllocatedUpFront) {
    // posix_fallocate has given every page: the object's blocks cover its size at once.
    SharedSegment seg;
    std::string error;
    const size_t bytes = 64 * pageSize();
    ASSERT_EQ(createSegment(bytes, ::getuid(), ::getgid(), &seg, &error), 0) << error;
    struct stat st;
    ASSERT_EQ(::fstat(seg.fd.get(), &st), 0);
    EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, bytes);
}

}  // namespace
}  // namespace tensorlane::ipc
