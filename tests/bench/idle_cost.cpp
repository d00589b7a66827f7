// idle_cost: the CPU a sidecar burns with one connected, idle client (issue 3's goal: under 2%
// of one core over 10 s in adaptive mode).
//
// Starts a real sidecar, forks one client that connects, allocates and exposes a region, then
// sits in tl_wait_notification (nothing ever arrives), and reads utime + stime of both
// processes from /proc/PID/stat across the window. Prints one line of JSON on stdout.
//
//   idle_cost [--seconds N] [--mode busy|adaptive|event]
#include <signal.h>

#include <cstring>
#include <iostream>

#include "bench_support.hpp"

namespace {

int usage() {
    std::cerr << "usage: idle_cost [--seconds N] [--mode busy|adaptive|event]\n";
    return 2;
}

}  // namespace

int main(int argc, char **argv) {
    double seconds = 10;
    std::string mode = "adaptive";
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--seconds" && i + 1 < argc) {
            seconds = std::atof(argv[++i]);
        } else if (a == "--mode" && i + 1 < argc) {
            mode = argv[++i];
        } else if (a == "-h" || a == "--help") {
            usage();
            return 0;
        } else {
            return usage();
        }
    }
    if (seconds <= 0 || (mode != "busy" && mode != "adaptive" && mode != "event")) {
        return usage();
    }
    try {
        tlbench::SidecarOptions opts;
        opts.poll_mode = mode;
        tlbench::Sidecar sidecar(opts);

        int ready[2];
        if (::pipe(ready) != 0) {
            std::cerr << "idle_cost: pipe: " << std::strerror(errno) << "\n";
            return 1;
        }
        const pid_t client = tlbench::forkTied();
        if (client < 0) {
            std::cerr << "idle_cost: fork: " << std::strerror(errno) << "\n";
            return 1;
        }
        if (client == 0) {
            ::close(ready[0]);
            tl_client *c = nullptr;
            void *p = nullptr;
            tl_region r = 0;
            if (tl_connect(sidecar.socket().c_str(), &c) != TL_OK ||
                tl_alloc_host(c, 1 << 20, &p, &r) != TL_OK || tl_expose(c, r, "idle") != TL_OK) {
                ::_exit(3);
            }
            char one = 1;
            if (::write(ready[1], &one, 1) != 1) {
                ::_exit(4);
            }
            for (;;) {
                tl_notification n{};
                tl_status s = tl_wait_notification(c, &n, 1000);
                if (s != TL_OK && s != TL_ETIMEDOUT) {
                    ::_exit(5);
                }
            }
        }
        ::close(ready[1]);
        char one = 0;
        if (::read(ready[0], &one, 1) != 1) {
            std::cerr << "idle_cost: the client did not connect\n";
            ::kill(client, SIGKILL);
            ::waitpid(client, nullptr, 0);
            return 1;
        }
        ::close(ready[0]);
        // Let the connection settle (the adaptive spin ends) before the window opens.
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        auto t0 = std::chrono::steady_clock::now();
        double side0 = tlbench::cpuSeconds(sidecar.pid());
        double cli0 = tlbench::cpuSeconds(client);
        double side_ns0 = tlbench::schedSeconds(sidecar.pid());
        std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
        double side1 = tlbench::cpuSeconds(sidecar.pid());
        double cli1 = tlbench::cpuSeconds(client);
        double side_ns1 = tlbench::schedSeconds(sidecar.pid());
        double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ::kill(client, SIGKILL);
        ::waitpid(client, nullptr, 0);
        if (side0 < 0 || side1 < 0) {
            std::cerr << "idle_cost: cannot read /proc/" << sidecar.pid() << "/stat\n";
            return 1;
        }
        double side_pct = 100.0 * (side1 - side0) / wall;
        double cli_pct = 100.0 * (cli1 - cli0) / wall;
        std::cout << "{\"mode\": \"" << mode << "\", \"seconds\": " << wall
                  << ", \"sidecar_cpu_s\": " << (side1 - side0)
                  << ", \"sidecar_core_pct\": " << side_pct
                  << ", \"client_cpu_s\": " << (cli1 - cli0) << ", \"client_core_pct\": " << cli_pct
                  << ", \"clk_tck\": " << ::sysconf(_SC_CLK_TCK);
        if (side_ns0 >= 0 && side_ns1 >= 0) {
            // The same figure from the scheduler's nanosecond counters (all threads).
            std::cout << ", \"sidecar_schedstat_core_pct\": "
                      << 100.0 * (side_ns1 - side_ns0) / wall;
        }
        std::cout << "}\n";
        return 0;
    } catch (const std::exception &e) {
        std::cerr << "idle_cost: " << e.what() << "\n";
        return 1;
    }
}
