// Two network namespaces joined by a veth pair that a test creates and removes; traffic goes
// only to addresses inside them.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <random>
#include <string>

namespace tltest {

inline int sh(const std::string &cmd) {
    return std::system((cmd + " >/dev/null 2>&1").c_str());
}

/// Two namespaces joined by a veth pair, 10.231.<n>.1 and .2/30; removed on destruction.
class VethPair {
public:
    VethPair() {
        std::random_device rd;
        tag_ = std::to_string(rd() % 100000);
        subnet_ = "10.231." + std::to_string(rd() % 250) + ".";
        ns_a_ = "tl-a-" + tag_;
        ns_b_ = "tl-b-" + tag_;
        if (::geteuid() != 0) {
            why_ = "needs root for ip netns";
            return;
        }
        if (sh("ip netns add " + ns_a_) != 0 || sh("ip netns add " + ns_b_) != 0) {
            why_ = "ip netns add is not permitted here";
            return;
        }
        created_ = true;
        const std::string va = "tlva" + tag_, vb = "tlvb" + tag_;
        if (sh("ip link add " + va + " type veth peer name " + vb) != 0 ||
            sh("ip link set " + va + " netns " + ns_a_) != 0 ||
            sh("ip link set " + vb + " netns " + ns_b_) != 0 ||
            sh("ip -n " + ns_a_ + " addr add " + addressA() + "/30 dev " + va) != 0 ||
            sh("ip -n " + ns_b_ + " addr add " + addressB() + "/30 dev " + vb) != 0 ||
            sh("ip -n " + ns_a_ + " link set lo up") != 0 ||
            sh("ip -n " + ns_b_ + " link set lo up") != 0) {
            why_ = "could not create a veth pair between namespaces";
            return;
        }
        va_ = va;
        vb_ = vb;
        ok_ = setLink(true);
    }
    ~VethPair() {
        if (created_) {
            sh("ip netns del " + ns_a_);
            sh("ip netns del " + ns_b_);
        }
    }
    bool setLink(bool up) {
        const char *state = up ? "up" : "down";
        return sh("ip -n " + ns_a_ + " link set " + va_ + " " + state) == 0 &&
               sh("ip -n " + ns_b_ + " link set " + vb_ + " " + state) == 0;
    }
    bool ok() const { return ok_; }
    const std::string &why() const { return why_; }
    std::string addressA() const { return subnet_ + "1"; }
    std::string addressB() const { return subnet_ + "2"; }
    const std::string &nsA() const { return ns_a_; }
    const std::string &nsB() const { return ns_b_; }
    const std::string &vethA() const { return va_; }
    const std::string &vethB() const { return vb_; }

private:
    std::string tag_, subnet_, ns_a_, ns_b_, va_, vb_, why_;
    bool created_ = false;
    bool ok_ = false;
};

}  // namespace tltest
