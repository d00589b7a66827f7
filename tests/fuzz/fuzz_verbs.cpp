// libFuzzer target for what a verbs receiving session takes from its peer: the descriptor ring's
// slots (the peer writes them with RDMA), the wire immediates of its WRITE_WITH_IMMs, and the
// payloads of the verbs control frames (KEY_ADD, KEY_DEL, KEY_DEL_DONE, CREDIT,
// MESSAGE_DROPPED, the SELECT blob). The input is a program of operations on one RecvWindow; the
// target checks that nothing crashes and that no descriptor is ever delivered that names bytes
// outside its region, out of order, twice, with a bad check word, with flags it does not know,
// or as a message of a bad length, with data, or whose bytes fail their check. (ASan catches a
// read past a slot: the ring is exactly `slots` descriptors.)
//
// Input: byte 0 chooses the ring's size (1 << (b % 13) slots); then operations, each an opcode
// byte and its operands:
//   0 slot len2 bytes       the peer writes `len % 577` raw bytes at the start of ring slot `slot`
//   1 4 bytes               one wire immediate (little-endian)
//   2 delta region offset8 bytes8 imm4 stripes   a well-formed descriptor for write
//                           next + delta (check word computed), then its `stripes` immediates
//   3                       deliver everything ready (what RecvSession::deliver does)
//   4 type len payload      a control frame's payload through its decoder
//   5 delta region offset8 imm4 len2 bytes      a well-formed message of `len % 513` bytes
//                           (check words computed), then its immediate
//   6 delta region offset8 bytes8 imm4 stripes flags4 mlen4 bytes   a descriptor of any fields
//                           whose check words are right (min(mlen, 512) message bytes follow),
//                           then its `stripes` immediates
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "transport/verbs/recv_window.hpp"
#include "transport/verbs/wire.hpp"

namespace {

using namespace tensorlane::sidecar;

void check(bool condition) {
    if (!condition) {
        std::abort();
    }
}

class Input {
public:
    Input(const uint8_t *data, size_t size) : data_(data), size_(size) {}
    bool has(size_t n) const { return size_ - pos_ >= n; }
    uint8_t u8() { return has(1) ? data_[pos_++] : 0; }
    uint64_t le(size_t n) {
        uint64_t v = 0;
        for (size_t i = 0; i < n && has(1); ++i) {
            v |= uint64_t{data_[pos_++]} << (8 * i);
        }
        return v;
    }
    std::span<const uint8_t> take(size_t n) {
        n = std::min(n, size_ - pos_);
        std::span<const uint8_t> s(data_ + pos_, n);
        pos_ += n;
        return s;
    }

private:
    const uint8_t *data_;
    size_t size_;
    size_t pos_ = 0;
};

/// The receiving node's regions: id 1..4, of these sizes; region 3 is being revoked.
struct Regions {
    Regions() {
        const uint64_t sizes[] = {65536, 1, 4096, UINT64_MAX};
        for (int i = 0; i < 4; ++i) {
            r[i] = std::make_unique<Region>();
            r[i]->id = static_cast<RegionId>(i + 1);
            r[i]->bytes = sizes[i];
        }
    }
    const Region *find(uint64_t id) const { return id >= 1 && id <= 4 ? r[id - 1].get() : nullptr; }
    static bool usable(uint64_t id) { return id != 3; }
    std::unique_ptr<Region> r[4];
};

struct Session {
    explicit Session(uint32_t slots) : window(slots), ring(slots) {}
    RecvWindow window;
    std::vector<WriteDescriptor> ring;
    uint64_t delivered = 0;  ///< the last sequence number taken off the window
};

void deliver(Session &s, const Regions &regions) {
    while (const RecvWindow::Slot *slot = s.window.ready()) {
        const WriteDescriptor &d = slot->desc;
        // What onImm promised before it marked the write ready.
        check(slot->seq == s.window.next() && d.seq == slot->seq);
        check(d.check == descriptorCheck(d));
        check((d.flags & ~kDescKnownFlags) == 0);
        const bool message = (d.flags & kDescMessage) != 0;
        if (message) {
            check((d.flags & kDescSilent) == 0 && d.bytes == 0 && d.stripes == 1);
            check(d.message_bytes >= 1 && d.message_bytes <= kDescMaxMessageBytes);
            check(messageCheck(d.seq, d.message, d.message_bytes) == d.message_check);
        } else {
            check(d.bytes != 0 && d.message_bytes == 0 && d.message_check == 0);
        }
        check(d.stripes == slot->stripes && slot->count == slot->stripes);
        check(d.seq == s.delivered + 1);  // in order, each once
        const Region *r = regions.find(d.region);
        const bool usable = r != nullptr && Regions::usable(d.region);
        const Verdict v = judge(d, r, usable);
        // A message is judged as a write of 0 bytes at its offset.
        const bool inside =
            r != nullptr && static_cast<unsigned __int128>(d.offset) + d.bytes <= r->bytes;
        const uint64_t seq = d.seq;
        switch (v) {
            case Verdict::kDeliver:
                check(usable && inside);
                break;
            case Verdict::kRefuse:
                check(usable && !inside);
                break;
            case Verdict::kDrop:
                check(!usable);
                break;
        }
        s.window.pop();
        check(s.window.next() == seq + 1);
        s.delivered = seq;
        if (v == Verdict::kRefuse) {
            return;  // the session ends
        }
    }
}

void controlFrame(Input &in) {
    const uint8_t type = in.u8();
    const std::span<const uint8_t> payload = in.take(in.u8());
    const std::vector<uint8_t> bytes(payload.begin(), payload.end());
    switch (type % 3) {
        case 0: {  // KEY_ADD
            RegionKey k;
            if (decodeRegionKey(payload, &k)) {
                check(encodeRegionKey(k) == bytes);
                const uint64_t off = bytes.empty() ? 0 : uint64_t{bytes[0]} << (bytes[1] % 64);
                const uint64_t len = k.bytes - (off % 7);
                if (withinKey(k, off, len)) {
                    check(static_cast<unsigned __int128>(off) + len <= k.bytes);
                }
            }
            break;
        }
        case 1: {  // KEY_DEL, KEY_DEL_DONE, CREDIT, MESSAGE_DROPPED: one u64
            uint64_t v = 0;
            if (decodeU64(payload, &v)) {
                check(payload.size() == 8 && encodeU64(v) == bytes);
            }
            break;
        }
        default: {  // SELECT / SELECTED
            VerbsBlob b;
            std::string error;
            if (decodeVerbsBlob(payload, &b, &error)) {
                check(!b.qps.empty() && b.qps.size() <= 64 && encodeVerbsBlob(b) == bytes);
                for (const QpEndpoint &q : b.qps) {
                    check((q.qpn >> 24) == 0 && (q.psn >> 24) == 0);
                }
            } else {
                check(!error.empty());
            }
            break;
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const Regions regions;
    Input in(data, size);
    const uint32_t slots = 1u << (in.u8() % 13);
    auto s = std::make_unique<Session>(slots);
    std::string error;
    const auto imm = [&](uint32_t value) {
        if (!s->window.onImm(value, s->ring.data(), &error)) {
            check(!error.empty());
            s = std::make_unique<Session>(slots);  // the session ended; the peer connects again
        }
    };
    // A descriptor whose check words are right, written into its slot, then its immediates.
    const auto place = [&](WriteDescriptor &d, std::span<const uint8_t> message) {
        std::memcpy(d.message, message.data(), std::min(message.size(), sizeof d.message));
        d.message_check = message.empty() ? 0 : messageCheck(d.seq, d.message, message.size());
        d.check = descriptorCheck(d);
        s->ring[d.seq % slots] = d;
        for (uint32_t i = 0; i < d.stripes; ++i) {
            imm(WireImm::encode(d.seq, d.stripes));
        }
    };
    while (in.has(1)) {
        switch (in.u8() % 7) {
            case 0: {
                const uint8_t slot = in.u8();
                const size_t len = in.le(2) % (sizeof(WriteDescriptor) + 1);
                if (!in.has(len)) {
                    return 0;
                }
                std::memcpy(static_cast<void *>(&s->ring[slot % slots]), in.take(len).data(), len);
                break;
            }
            case 1:
                imm(static_cast<uint32_t>(in.le(4)));
                break;
            case 2: {
                WriteDescriptor d;
                d.seq = s->window.next() + in.u8() % (slots + 1);
                d.region = in.u8() % 6;
                d.offset = in.le(8);
                d.bytes = in.le(8);
                d.imm = static_cast<uint32_t>(in.le(4));
                d.stripes = 1 + in.u8() % 4;
                d.check = descriptorCheck(d);
                s->ring[d.seq % slots] = d;
                for (uint32_t i = 0; i < d.stripes; ++i) {
                    imm(WireImm::encode(d.seq, d.stripes));
                }
                break;
            }
            case 3:
                deliver(*s, regions);
                break;
            case 4:
                controlFrame(in);
                break;
            case 5: {
                WriteDescriptor d;
                d.seq = s->window.next() + in.u8() % (slots + 1);
                d.region = in.u8() % 6;
                d.offset = in.le(8);
                d.imm = static_cast<uint32_t>(in.le(4));
                d.stripes = 1;
                d.flags = kDescMessage;
                const size_t len = in.le(2) % (kDescMaxMessageBytes + 1);
                const std::span<const uint8_t> message = in.take(len);
                d.message_bytes = static_cast<uint32_t>(message.size());
                place(d, message);
                break;
            }
            default: {
                WriteDescriptor d;
                d.seq = s->window.next() + in.u8() % (slots + 1);
                d.region = in.u8() % 6;
                d.offset = in.le(8);
                d.bytes = in.le(8);
                d.imm = static_cast<uint32_t>(in.le(4));
                d.stripes = 1 + in.u8() % 4;
                d.flags = static_cast<uint32_t>(in.le(4));
                d.message_bytes = static_cast<uint32_t>(in.le(4));
                const std::span<const uint8_t> message =
                    in.take(std::min<size_t>(d.message_bytes, kDescMaxMessageBytes));
                place(d, message);
                break;
            }
        }
    }
    deliver(*s, regions);
    return 0;
}
