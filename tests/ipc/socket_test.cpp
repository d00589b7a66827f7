// Unit tests of the Unix SOCK_SEQPACKET helpers: listen, connect, credentials, datagrams with fds.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tensorlane/ipc/control.hpp"
#include "tensorlane/ipc/socket.hpp"

namespace tensorlane::ipc {
namespace {

/// Number of open fds of this process (the directory stream's own fd is counted every time,
/// so differences are exact).
int openFdCount() {
    DIR *d = ::opendir("/proc/self/fd");
    if (!d) {
        return -1;
    }
    int n = 0;
    while (const dirent *e = ::readdir(d)) {
        if (e->d_name[0] != '.') {
            ++n;
        }
    }
    ::closedir(d);
    return n;
}

bool sameFile(int a, int b) {
    struct stat sa, sb;
    return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_ino == sb.st_ino &&
           sa.st_dev == sb.st_dev;
}

class Socket : public ::testing::Test {
protected:
    void SetUp() override {
        char tmpl[] = "/tmp/tl-ipc-sock-XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
        dir_ = tmpl;
        path_ = dir_ + "/sidecar.sock";
    }
    void TearDown() override {
        ::unlink(path_.c_str());
        ::rmdir(dir_.c_str());
    }

    /// Listens, connects and accepts: a connected pair (client blocking, server non-blocking).
    void connectPair(UniqueFd *client, UniqueFd *server) {
        ASSERT_EQ(listenSeqpacket(path_, 0660, &listener_), 0);
        ASSERT_EQ(connectSeqpacket(path_, client), 0);
        ASSERT_EQ(acceptSeqpacket(listener_.get(), server), 0);
    }

    std::string dir_;
    std::string path_;
    UniqueFd listener_;
};

TEST_F(Socket, ListenCreatesSocketWithMode) {
    for (unsigned mode : {0660u, 0600u, 0666u}) {
        UniqueFd fd;
        ASSERT_EQ(listenSeqpacket(path_, mode, &fd), 0);
        struct stat st;
        ASSERT_EQ(::lstat(path_.c_str(), &st), 0);
        EXPECT_TRUE(S_ISSOCK(st.st_mode));
        EXPECT_EQ(st.st_mode & 0777, mode);
        EXPECT_TRUE(::fcntl(fd.get(), F_GETFL) & O_NONBLOCK);
        EXPECT_TRUE(::fcntl(fd.get(), F_GETFD) & FD_CLOEXEC);
        int type = 0;
        socklen_t len = sizeof(type);
        ASSERT_EQ(::getsockopt(fd.get(), SOL_SOCKET, SO_TYPE, &type, &len), 0);
        EXPECT_EQ(type, SOCK_SEQPACKET);
        fd.reset();  // leaves a stale socket file behind for the next mode
    }
}

TEST_F(Socket, ListenReplacesStaleSocketFile) {
    // A socket file whose owner is gone, as a crashed sidecar leaves it.
    {
        UniqueFd dead(::socket(AF_UNIX, SOCK_SEQPACKET, 0));
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::strcpy(addr.sun_path, path_.c_str());
        ASSERT_EQ(::bind(dead.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)), 0);
    }
    struct stat before;
    ASSERT_EQ(::lstat(path_.c_str(), &before), 0);
    ASSERT_TRUE(S_ISSOCK(before.st_mode));

    UniqueFd fd;
    ASSERT_EQ(listenSeqpacket(path_, 0660, &fd), 0);
    UniqueFd client;
    ASSERT_EQ(connectSeqpacket(path_, &client), 0);
    UniqueFd server;
    EXPECT_EQ(acceptSeqpacket(fd.get(), &server), 0);
}

TEST_F(Socket, ListenRefusesToReplaceRegularFile) {
    const int file = ::open(path_.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    ASSERT_GE(file, 0);
    ASSERT_EQ(::write(file, "keep", 4), 4);
    ::close(file);

    UniqueFd fd;
    EXPECT_EQ(listenSeqpacket(path_, 0660, &fd), EEXIST);
    EXPECT_FALSE(fd);
    struct stat st;
    ASSERT_EQ(::lstat(path_.c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(st.st_size, 4);
}

TEST_F(Socket, ListenRefusesToStealALiveSocket) {
    UniqueFd first;
    ASSERT_EQ(listenSeqpacket(path_, 0660, &first), 0);
    UniqueFd second;
    EXPECT_EQ(listenSeqpacket(path_, 0660, &second), EADDRINUSE);
    EXPECT_FALSE(second);
    // The running listener still owns the path.
    UniqueFd client;
    ASSERT_EQ(connectSeqpacket(path_, &client), 0);
    UniqueFd server;
    EXPECT_EQ(acceptSeqpacket(first.get(), &server), 0);
}

TEST_F(Socket, ListenRejectsBadPaths) {
    UniqueFd fd;
    EXPECT_EQ(listenSeqpacket("", 0660, &fd), ENAMETOOLONG);
    EXPECT_EQ(listenSeqpacket("/tmp/" + std::string(200, 'x'), 0660, &fd), ENAMETOOLONG);
    EXPECT_EQ(listenSeqpacket(dir_ + "/missing/dir/s.sock", 0660, &fd), ENOENT);
    EXPECT_FALSE(fd);
}

TEST_F(Socket, ConnectToMissingSocketFails) {
    UniqueFd fd;
    EXPECT_EQ(connectSeqpacket(path_, &fd), ENOENT);
    EXPECT_FALSE(fd);
}

TEST_F(Socket, AcceptWithNothingPendingIsEagain) {
    ASSERT_EQ(listenSeqpacket(path_, 0660, &listener_), 0);
    UniqueFd server;
    EXPECT_EQ(acceptSeqpacket(listener_.get(), &server), EAGAIN);
    EXPECT_FALSE(server);
}

TEST_F(Socket, ConnectAcceptAndFlags) {
    UniqueFd client, server;
    connectPair(&client, &server);
    EXPECT_FALSE(::fcntl(client.get(), F_GETFL) & O_NONBLOCK);
    EXPECT_TRUE(::fcntl(client.get(), F_GETFD) & FD_CLOEXEC);
    EXPECT_TRUE(::fcntl(server.get(), F_GETFL) & O_NONBLOCK);
    EXPECT_TRUE(::fcntl(server.get(), F_GETFD) & FD_CLOEXEC);
}

TEST_F(Socket, PeerCredentialsAreOurs) {
    UniqueFd client, server;
    connectPair(&client, &server);
    PeerCred cred;
    ASSERT_EQ(peerCredentials(server.get(), &cred), 0);
    EXPECT_EQ(cred.pid, ::getpid());
    EXPECT_EQ(cred.uid, ::geteuid());
    EXPECT_EQ(cred.gid, ::getegid());
    PeerCred back;
    ASSERT_EQ(peerCredentials(client.get(), &back), 0);
    EXPECT_EQ(back.pid, ::getpid());

    PeerCred none;
    EXPECT_EQ(peerCredentials(-1, &none), EBADF);
}

TEST_F(Socket, RoundTripsDataAndThreeFds) {
    UniqueFd client, server;
    connectPair(&client, &server);

    // Three kinds of fd: a memory file, an eventfd and the write end of a pipe.
    UniqueFd memfd(::memfd_create("tl-test", MFD_CLOEXEC));
    ASSERT_TRUE(memfd);
    ASSERT_EQ(::ftruncate(memfd.get(), 4096), 0);
    UniqueFd efd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    ASSERT_TRUE(efd);
    int pipe_fds[2];
    ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK), 0);
    UniqueFd pipe_r(pipe_fds[0]), pipe_w(pipe_fds[1]);

    HelloMsg hello{};
    hello.h = {kControlMagic, kControlVersion, static_cast<uint16_t>(MsgType::kHello), 42};
    hello.session_id = 0x1122334455667788ull;
    copyName(hello.node_name, sizeof(hello.node_name), "node-a");
    const std::array<int, 3> send_fds = {memfd.get(), efd.get(), pipe_w.get()};
    ASSERT_EQ(sendMessage(server.get(), &hello, sizeof(hello), send_fds), 0);

    HelloMsg got{};
    size_t bytes = 0;
    UniqueFd fds[kMaxFdsPerMessage];
    size_t nfds = 0;
    ASSERT_EQ(receiveMessage(client.get(), &got, sizeof(got), &bytes, fds, &nfds), 0);
    EXPECT_EQ(bytes, sizeof(hello));
    EXPECT_EQ(std::memcmp(&got, &hello, sizeof(hello)), 0);
    ASSERT_EQ(nfds, 3u);
    for (size_t i = 0; i < 3; ++i) {
        EXPECT_TRUE(fds[i]);
        EXPECT_NE(fds[i].get(), send_fds[i]) << "a received fd is a new descriptor";
        EXPECT_TRUE(sameFile(fds[i].get(), send_fds[i])) << "fd " << i;
        EXPECT_TRUE(::fcntl(fds[i].get(), F_GETFD) & FD_CLOEXEC) << "MSG_CMSG_CLOEXEC";
    }
    EXPECT_FALSE(fds[3]);

    // Write through the received memfd, read through ours.
    ASSERT_EQ(::pwrite(fds[0].get(), "shared", 6, 100), 6);
    char text[7] = {};
    ASSERT_EQ(::pread(memfd.get(), text, 6, 100), 6);
    EXPECT_STREQ(text, "shared");
    // Ring through the received eventfd, read ours.
    const uint64_t five = 5;
    ASSERT_EQ(::write(fds[1].get(), &five, sizeof(five)), 8);
    uint64_t count = 0;
    ASSERT_EQ(::read(efd.get(), &count, sizeof(count)), 8);
    EXPECT_EQ(count, 5u);
    // Write into the received pipe end, read from our read end.
    ASSERT_EQ(::write(fds[2].get(), "p", 1), 1);
    char c = 0;
    ASSERT_EQ(::read(pipe_r.get(), &c, 1), 1);
    EXPECT_EQ(c, 'p');
}

TEST_F(Socket, SendRejectsTooManyFds) {
    UniqueFd client, server;
    connectPair(&client, &server);
    std::array<int, kMaxFdsPerMessage + 1> many;
    many.fill(client.get());
    const char msg[4] = {1, 2, 3, 4};
    EXPECT_EQ(sendMessage(server.get(), msg, sizeof(msg), many), EINVAL);
    // Nothing went out.
    char buf[16];
    size_t bytes = 99;
    EXPECT_EQ(
        receiveMessage(client.get(), buf, sizeof(buf), &bytes, nullptr, nullptr, MSG_DONTWAIT),
        EAGAIN);
    EXPECT_EQ(bytes, 0u);
}

TEST_F(Socket, PreservesMessageBoundaries) {
    UniqueFd client, server;
    connectPair(&client, &server);
    const std::vector<size_t> sizes = {10, 1, 300, 4096, 7};
    for (size_t i = 0; i < sizes.size(); ++i) {
        std::vector<unsigned char> msg(sizes[i], static_cast<unsigned char>('a' + i));
        ASSERT_EQ(sendMessage(client.get(), msg.data(), msg.size()), 0);
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
        std::vector<unsigned char> buf(kMaxControlMessage, 0);
        size_t bytes = 0;
        size_t nfds = 7;
        UniqueFd fds[kMaxFdsPerMessage];
        ASSERT_EQ(receiveMessage(server.get(), buf.data(), buf.size(), &bytes, fds, &nfds), 0);
        EXPECT_EQ(bytes, sizes[i]);
        EXPECT_EQ(nfds, 0u);
        for (size_t k = 0; k < bytes; ++k) {
            ASSERT_EQ(buf[k], static_cast<unsigned char>('a' + i));
        }
    }
    char buf[8];
    size_t bytes = 0;
    EXPECT_EQ(receiveMessage(server.get(), buf, sizeof(buf), &bytes, nullptr, nullptr), EAGAIN);
}

TEST_F(Socket, TruncatedDatagramIsEmsgsizeAndLeaksNoFd) {
    UniqueFd client, server;
    connectPair(&client, &server);
    UniqueFd a(::eventfd(0, EFD_CLOEXEC)), b(::eventfd(0, EFD_CLOEXEC)),
        c(::memfd_create("tl-test", MFD_CLOEXEC));
    ASSERT_TRUE(a && b && c);
    const std::array<int, 3> send_fds = {a.get(), b.get(), c.get()};
    std::vector<char> big(200, 'z');
    ASSERT_EQ(sendMessage(client.get(), big.data(), big.size(), send_fds), 0);
    ASSERT_EQ(sendMessage(client.get(), "next", 4), 0);

    const int before = openFdCount();
    char buf[100];
    size_t bytes = 0;
    UniqueFd fds[kMaxFdsPerMessage];
    size_t nfds = 9;
    EXPECT_EQ(receiveMessage(server.get(), buf, sizeof(buf), &bytes, fds, &nfds), EMSGSIZE);
    EXPECT_EQ(nfds, 0u);
    for (auto &fd : fds) {
        EXPECT_FALSE(fd);
    }
    EXPECT_EQ(openFdCount(), before);

    // The rest of the truncated datagram is gone; the next one arrives whole.
    ASSERT_EQ(receiveMessage(server.get(), buf, sizeof(buf), &bytes, fds, &nfds), 0);
    EXPECT_EQ(bytes, 4u);
    EXPECT_EQ(std::memcmp(buf, "next", 4), 0);
}

// A hostile client sends more fds than the protocol allows, with raw sendmsg: they are all closed
// and the message refused.
TEST_F(Socket, TooManyFdsFromPeerAreClosed) {
    UniqueFd client, server;
    connectPair(&client, &server);
    constexpr int kSent = static_cast<int>(kMaxFdsPerMessage) + 4;
    std::array<int, kSent> raw;
    std::vector<UniqueFd> owners;
    for (int i = 0; i < kSent; ++i) {
        owners.emplace_back(::eventfd(0, EFD_CLOEXEC));
        raw[static_cast<size_t>(i)] = owners.back().get();
    }
    char data[8] = "hostile";
    iovec iov{data, sizeof(data)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kSent)] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * kSent);
    std::memcpy(CMSG_DATA(cm), raw.data(), sizeof(int) * kSent);
    ASSERT_EQ(::sendmsg(client.get(), &msg, 0), static_cast<ssize_t>(sizeof(data)));

    const int before = openFdCount();
    char buf[64];
    size_t bytes = 0;
    UniqueFd fds[kMaxFdsPerMessage];
    size_t nfds = 0;
    EXPECT_EQ(receiveMessage(server.get(), buf, sizeof(buf), &bytes, fds, &nfds), EMSGSIZE);
    EXPECT_EQ(nfds, 0u);
    EXPECT_EQ(openFdCount(), before);

    // Fds sent to a receiver that takes none are closed too.
    ASSERT_EQ(sendMessage(client.get(), data, sizeof(data), std::array<int, 1>{raw[0]}), 0);
    EXPECT_EQ(receiveMessage(server.get(), buf, sizeof(buf), &bytes, nullptr, nullptr), EMSGSIZE);
    EXPECT_EQ(openFdCount(), before);
}

TEST_F(Socket, PeerCloseIsEconnreset) {
    UniqueFd client, server;
    connectPair(&client, &server);
    ASSERT_EQ(sendMessage(client.get(), "last", 4), 0);
    client.reset();
    char buf[16];
    size_t bytes = 0;
    size_t nfds = 0;
    UniqueFd fds[kMaxFdsPerMessage];
    // Data sent before the close still arrives, then the end of stream.
    ASSERT_EQ(receiveMessage(server.get(), buf, sizeof(buf), &bytes, fds, &nfds), 0);
    EXPECT_EQ(bytes, 4u);
    bytes = 77;
    EXPECT_EQ(receiveMessage(server.get(), buf, sizeof(buf), &bytes, fds, &nfds), ECONNRESET);
    EXPECT_EQ(bytes, 0u);
    EXPECT_EQ(nfds, 0u);
    // The poller sees the hang-up.
    pollfd p{server.get(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 0), 1);
    EXPECT_TRUE(p.revents & (POLLHUP | POLLIN));
}

TEST_F(Socket, SendToClosedPeerIsEpipeNotSignal) {
    UniqueFd client, server;
    connectPair(&client, &server);
    server.reset();
    // MSG_NOSIGNAL: a SIGPIPE here would kill the test binary.
    EXPECT_EQ(sendMessage(client.get(), "x", 1), EPIPE);
}

TEST_F(Socket, DontWaitOnEmptyIsEagain) {
    UniqueFd client, server;
    connectPair(&client, &server);
    char buf[16];
    size_t bytes = 5;
    size_t nfds = 5;
    UniqueFd fds[kMaxFdsPerMessage];
    // The client fd is blocking: only MSG_DONTWAIT keeps this call from hanging.
    EXPECT_EQ(receiveMessage(client.get(), buf, sizeof(buf), &bytes, fds, &nfds, MSG_DONTWAIT),
              EAGAIN);
    EXPECT_EQ(bytes, 0u);
    EXPECT_EQ(nfds, 0u);
}

}  // namespace
}  // namespace tensorlane::ipc
