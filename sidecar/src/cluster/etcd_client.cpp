#include "cluster/etcd_client.hpp"

#include <curl/curl.h>
#include <sodium.h>

#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>

namespace tensorlane::sidecar {

namespace {

using Json = nlohmann::json;

/// The longest reply or watch message taken (a range of a few thousand nodes is well under).
constexpr size_t kMaxReplyBytes = 64u << 20;
/// How often a blocked call looks at interrupt() even without a wake-up.
constexpr int kPollMs = 1000;

std::string base64(const std::string &bytes) {
    std::string out(sodium_base64_ENCODED_LEN(bytes.size(), sodium_base64_VARIANT_ORIGINAL), '\0');
    sodium_bin2base64(out.data(), out.size(), reinterpret_cast<const unsigned char *>(bytes.data()),
                      bytes.size(), sodium_base64_VARIANT_ORIGINAL);
    out.resize(out.size() - 1);  // the terminating NUL
    return out;
}

bool unbase64(const std::string &text, std::string *out) {
    std::string bytes(text.size() * 3 / 4 + 3, '\0');
    size_t len = 0;
    if (sodium_base642bin(reinterpret_cast<unsigned char *>(bytes.data()), bytes.size(),
                          text.data(), text.size(), nullptr, &len, nullptr,
                          sodium_base64_VARIANT_ORIGINAL) != 0) {
        return false;
    }
    bytes.resize(len);
    *out = std::move(bytes);
    return true;
}

/// The gateway writes int64 fields as JSON strings ("revision":"12"), absent when zero.
int64_t int64Of(const Json &j, const char *key) {
    const auto it = j.find(key);
    if (it == j.end()) {
        return 0;
    }
    if (it->is_string()) {
        try {
            return std::stoll(it->get<std::string>());
        } catch (...) {
            return 0;
        }
    }
    return it->is_number_integer() ? it->get<int64_t>() : 0;
}

bool kvOf(const Json &j, EtcdKv *out) {
    if (!j.is_object() || !j.contains("key") || !j["key"].is_string()) {
        return false;
    }
    EtcdKv kv;
    if (!unbase64(j["key"].get<std::string>(), &kv.key)) {
        return false;
    }
    if (j.contains("value") && j["value"].is_string() &&
        !unbase64(j["value"].get<std::string>(), &kv.value)) {
        return false;
    }
    kv.create_revision = int64Of(j, "create_revision");
    kv.mod_revision = int64Of(j, "mod_revision");
    kv.version = int64Of(j, "version");
    kv.lease = int64Of(j, "lease");
    *out = std::move(kv);
    return true;
}

void initCurlOnce() {
    static std::once_flag once;
    std::call_once(once, [] {
        curl_global_init(CURL_GLOBAL_DEFAULT);
        if (sodium_init() < 0) {
            return;  // base64 below needs no initialised state; the rest of the sidecar checks it
        }
    });
}

size_t writeToString(char *data, size_t size, size_t n, void *user) {
    auto *out = static_cast<std::string *>(user);
    if (out->size() + size * n > kMaxReplyBytes) {
        return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
    }
    out->append(data, size * n);
    return size * n;
}

size_t writeToSink(char *data, size_t size, size_t n, void *user) {
    auto *sink = static_cast<const std::function<bool(const char *, size_t)> *>(user);
    return (*sink)(data, size * n) ? size * n : 0;
}

/// The gateway's error document: {"error": "...", "code": N, "message": "..."}.
std::string gatewayError(const std::string &body) {
    const Json j = Json::parse(body, nullptr, false);
    if (j.is_object()) {
        if (j.contains("message") && j["message"].is_string()) {
            return j["message"].get<std::string>();
        }
        if (j.contains("error") && j["error"].is_string()) {
            return j["error"].get<std::string>();
        }
    }
    return body.substr(0, 200);
}

}  // namespace

/// One easy handle (kept, so its connection is reused) run through a multi handle, whose
/// curl_multi_wakeup() is what interrupt() uses from another thread.
struct EtcdClient::Curl {
    CURL *easy = nullptr;
    CURLM *multi = nullptr;
    curl_slist *headers = nullptr;
    ~Curl() {
        if (headers != nullptr) {
            curl_slist_free_all(headers);
        }
        if (easy != nullptr) {
            curl_easy_cleanup(easy);
        }
        if (multi != nullptr) {
            curl_multi_cleanup(multi);
        }
    }
};

std::string etcdPrefixEnd(const std::string &prefix) {
    std::string end = prefix;
    while (!end.empty()) {
        auto &last = reinterpret_cast<unsigned char &>(end.back());
        if (last < 0xff) {
            ++last;
            return end;
        }
        end.pop_back();
    }
    return std::string(1, '\0');  // every key
}

EtcdClient::EtcdClient(EtcdOptions opts)
    : opts_(std::move(opts)), curl_(std::make_unique<Curl>()) {}

EtcdClient::~EtcdClient() = default;

std::unique_ptr<EtcdClient> EtcdClient::create(EtcdOptions opts, Status *error) {
    if (opts.endpoints.empty()) {
        *error = {Code::kInvalid, "etcd: no endpoints"};
        return nullptr;
    }
    initCurlOnce();
    std::unique_ptr<EtcdClient> c(new EtcdClient(std::move(opts)));
    c->curl_->easy = curl_easy_init();
    c->curl_->multi = curl_multi_init();
    if (c->curl_->easy == nullptr || c->curl_->multi == nullptr) {
        *error = {Code::kInternal, "etcd: libcurl could not be initialised"};
        return nullptr;
    }
    return c;
}

void EtcdClient::interrupt() {
    interrupted_.store(true, std::memory_order_release);
    // SYNC POINT: curl_multi_wakeup is the one libcurl call documented as callable from
    // another thread; the blocked curl_multi_poll returns and sees the flag.
    curl_multi_wakeup(curl_->multi);
}

Status EtcdClient::callOnce(const std::string &endpoint, const std::string &path,
                            const std::string &body, std::string *reply,
                            const std::function<bool(const char *, size_t)> *sink,
                            bool *unreachable) {
    *unreachable = false;
    CURL *e = curl_->easy;
    curl_easy_reset(e);
    const std::string url = endpoint + path;
    curl_easy_setopt(e, CURLOPT_URL, url.c_str());
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(opts_.request_timeout_ms));
    // Dead peers of a long watch are found by TCP keepalive (and by the lease's keep-alives,
    // which interrupt the watch when etcd stops answering them).
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPIDLE, 2L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPINTVL, 1L);
    if (sink == nullptr) {
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(opts_.request_timeout_ms));
    }
    if (!opts_.ca_file.empty()) {
        curl_easy_setopt(e, CURLOPT_CAINFO, opts_.ca_file.c_str());
    }
    if (!opts_.cert_file.empty()) {
        curl_easy_setopt(e, CURLOPT_SSLCERT, opts_.cert_file.c_str());
        curl_easy_setopt(e, CURLOPT_SSLKEY, opts_.key_file.c_str());
    }
    if (curl_->headers != nullptr) {
        curl_slist_free_all(curl_->headers);
        curl_->headers = nullptr;
    }
    curl_->headers = curl_slist_append(curl_->headers, "Content-Type: application/json");
    if (!token_.empty()) {
        curl_->headers = curl_slist_append(curl_->headers, ("Authorization: " + token_).c_str());
    }
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, curl_->headers);
    std::string out;
    if (sink != nullptr) {
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, writeToSink);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, const_cast<void *>(static_cast<const void *>(sink)));
    } else {
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, writeToString);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, &out);
    }
    char errbuf[CURL_ERROR_SIZE] = {};
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);

    curl_multi_add_handle(curl_->multi, e);
    CURLcode result = CURLE_OK;
    bool done = false;
    while (!done) {
        if (interrupted()) {
            curl_multi_remove_handle(curl_->multi, e);
            return {Code::kConnection, "etcd: interrupted"};
        }
        int running = 0;
        if (curl_multi_perform(curl_->multi, &running) != CURLM_OK) {
            break;
        }
        int left = 0;
        while (CURLMsg *m = curl_multi_info_read(curl_->multi, &left)) {
            if (m->msg == CURLMSG_DONE && m->easy_handle == e) {
                result = m->data.result;
                done = true;
            }
        }
        if (!done && running > 0) {
            curl_multi_poll(curl_->multi, nullptr, 0, kPollMs, nullptr);
        } else if (!done) {
            done = true;
        }
    }
    curl_multi_remove_handle(curl_->multi, e);
    if (interrupted()) {
        return {Code::kConnection, "etcd: interrupted"};
    }
    long http = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &http);
    if (result != CURLE_OK) {
        const std::string what = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(result);
        // A sink that said stop is not a failure of etcd.
        if (result == CURLE_WRITE_ERROR && sink != nullptr) {
            return Status::ok();
        }
        *unreachable = http == 0;
        return {Code::kPeer, "etcd " + endpoint + ": " + what};
    }
    if (http != 200) {
        std::string msg = gatewayError(out);
        const Code code = http == 401 || msg.find("auth") != std::string::npos ? Code::kPermission
                          : http == 404 || msg.find("not found") != std::string::npos
                              ? Code::kNotFound
                              : Code::kPeer;
        // A 5xx (no leader, an unhealthy member) means try another member.
        *unreachable = http >= 500 && code == Code::kPeer;
        return {code, "etcd " + endpoint + path + ": HTTP " + std::to_string(http) + ": " + msg};
    }
    if (reply != nullptr) {
        *reply = std::move(out);
    }
    return Status::ok();
}

Status EtcdClient::authenticate(const std::string &endpoint) {
    token_.clear();
    const std::string body = Json{{"name", opts_.username}, {"password", opts_.password}}.dump();
    std::string reply;
    bool unreachable = false;
    if (Status s = callOnce(endpoint, "/v3/auth/authenticate", body, &reply, nullptr, &unreachable);
        !s.isOk()) {
        return s;
    }
    const Json j = Json::parse(reply, nullptr, false);
    if (!j.is_object() || !j.contains("token") || !j["token"].is_string()) {
        return {Code::kPermission, "etcd " + endpoint + ": authentication gave no token"};
    }
    token_ = j["token"].get<std::string>();
    return Status::ok();
}

Status EtcdClient::call(const std::string &path, const std::string &body, std::string *reply,
                        const std::function<bool(const char *, size_t)> *sink) {
    Status last;
    for (size_t tried = 0; tried < opts_.endpoints.size(); ++tried) {
        const std::string &ep = opts_.endpoints[current_];
        bool unreachable = true;
        Status auth;
        if (!opts_.username.empty() && token_.empty()) {
            auth = authenticate(ep);
            if (!auth.isOk() && auth.code() != Code::kPeer) {
                return auth;  // interrupted, or wrong credentials: another member says the same
            }
        }
        if (auth.isOk()) {
            last = callOnce(ep, path, body, reply, sink, &unreachable);
            if (last.code() == Code::kPermission && !opts_.username.empty()) {
                // The token expired (etcd's simple tokens last 5 minutes): once more with a new.
                if (authenticate(ep).isOk()) {
                    last = callOnce(ep, path, body, reply, sink, &unreachable);
                }
            }
        } else {
            last = std::move(auth);
        }
        if (last.isOk() || last.code() == Code::kConnection || !unreachable) {
            return last;
        }
        token_.clear();
        current_ = (current_ + 1) % opts_.endpoints.size();
    }
    return last;
}

Status EtcdClient::put(const std::string &key, const std::string &value, int64_t lease) {
    Json body{{"key", base64(key)}, {"value", base64(value)}};
    if (lease != 0) {
        body["lease"] = std::to_string(lease);
    }
    return call("/v3/kv/put", body.dump(), nullptr);
}

Status EtcdClient::range(const std::string &key, const std::string &range_end,
                         std::vector<EtcdKv> *out, int64_t *revision) {
    Json body{{"key", base64(key)}};
    if (!range_end.empty()) {
        body["range_end"] = base64(range_end);
    }
    std::string reply;
    if (Status s = call("/v3/kv/range", body.dump(), &reply); !s.isOk()) {
        return s;
    }
    const Json j = Json::parse(reply, nullptr, false);
    if (!j.is_object()) {
        return {Code::kPeer, "etcd " + endpoint() + ": a range reply that is not JSON"};
    }
    if (revision != nullptr) {
        *revision = j.contains("header") ? int64Of(j["header"], "revision") : 0;
    }
    out->clear();
    if (j.contains("kvs") && j["kvs"].is_array()) {
        for (const Json &kv : j["kvs"]) {
            EtcdKv parsed;
            if (kvOf(kv, &parsed)) {
                out->push_back(std::move(parsed));
            }
        }
    }
    return Status::ok();
}

Status EtcdClient::get(const std::string &key, std::optional<EtcdKv> *out, int64_t *revision) {
    std::vector<EtcdKv> kvs;
    if (Status s = range(key, "", &kvs, revision); !s.isOk()) {
        return s;
    }
    *out = kvs.empty() ? std::nullopt : std::optional<EtcdKv>(std::move(kvs.front()));
    return Status::ok();
}

Status EtcdClient::getPrefix(const std::string &prefix, std::vector<EtcdKv> *out,
                             int64_t *revision) {
    return range(prefix, etcdPrefixEnd(prefix), out, revision);
}

Status EtcdClient::remove(const std::string &key, int64_t *deleted) {
    std::string reply;
    if (Status s = call("/v3/kv/deleterange", Json{{"key", base64(key)}}.dump(), &reply);
        !s.isOk()) {
        return s;
    }
    if (deleted != nullptr) {
        *deleted = int64Of(Json::parse(reply, nullptr, false), "deleted");
    }
    return Status::ok();
}

Status EtcdClient::removePrefix(const std::string &prefix, int64_t *deleted) {
    std::string reply;
    const Json body{{"key", base64(prefix)}, {"range_end", base64(etcdPrefixEnd(prefix))}};
    if (Status s = call("/v3/kv/deleterange", body.dump(), &reply); !s.isOk()) {
        return s;
    }
    if (deleted != nullptr) {
        *deleted = int64Of(Json::parse(reply, nullptr, false), "deleted");
    }
    return Status::ok();
}

Status EtcdClient::grantLease(int64_t ttl_s, int64_t *id, int64_t *granted_ttl_s) {
    std::string reply;
    if (Status s = call("/v3/lease/grant", Json{{"TTL", std::to_string(ttl_s)}}.dump(), &reply);
        !s.isOk()) {
        return s;
    }
    const Json j = Json::parse(reply, nullptr, false);
    const int64_t lease = j.is_object() ? int64Of(j, "ID") : 0;
    if (lease == 0) {
        const std::string why = j.is_object() && j.contains("error") && j["error"].is_string()
                                    ? j["error"].get<std::string>()
                                    : std::string("no lease ID in the reply");
        return {Code::kPeer, "etcd " + endpoint() + ": lease grant: " + why};
    }
    *id = lease;
    *granted_ttl_s = int64Of(j, "TTL");
    return Status::ok();
}

Status EtcdClient::keepAlive(int64_t id, int64_t *ttl_s) {
    std::string reply;
    if (Status s = call("/v3/lease/keepalive", Json{{"ID", std::to_string(id)}}.dump(), &reply);
        !s.isOk()) {
        return s;
    }
    // The gateway answers the stream's first message: {"result":{"header":...,"ID":..,"TTL":..}};
    // no TTL means etcd has no such lease any more.
    const Json j = Json::parse(reply.substr(0, reply.find('\n')), nullptr, false);
    const Json &r = j.is_object() && j.contains("result") ? j["result"] : j;
    const int64_t ttl = r.is_object() ? int64Of(r, "TTL") : 0;
    if (ttl <= 0) {
        return {Code::kNotFound,
                "etcd " + endpoint() + ": lease " + std::to_string(id) + " expired or was revoked"};
    }
    *ttl_s = ttl;
    return Status::ok();
}

Status EtcdClient::revokeLease(int64_t id) {
    return call("/v3/lease/revoke", Json{{"ID", std::to_string(id)}}.dump(), nullptr);
}

Status EtcdClient::watchPrefix(const std::string &prefix, int64_t start_revision,
                               const WatchHandler &on_events,
                               const std::function<void()> &on_created) {
    const Json body{{"create_request",
                     {{"key", base64(prefix)},
                      {"range_end", base64(etcdPrefixEnd(prefix))},
                      {"start_revision", std::to_string(start_revision)}}}};
    std::string pending;
    Status verdict;  // set by the sink when the stream says why it ends
    bool stop = false;
    // The gateway writes one JSON document per watch response, each ended by a newline.
    const std::function<bool(const char *, size_t)> sink = [&](const char *data, size_t n) {
        pending.append(data, n);
        size_t start = 0;
        for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
            const Json j =
                Json::parse(pending.begin() + static_cast<std::ptrdiff_t>(start),
                            pending.begin() + static_cast<std::ptrdiff_t>(nl), nullptr, false);
            if (!j.is_object()) {
                verdict = {Code::kPeer,
                           "etcd " + endpoint() + ": a watch message that is not JSON"};
                return false;
            }
            if (j.contains("error")) {
                const Json &e = j["error"];
                verdict = {
                    Code::kPeer,
                    "etcd " + endpoint() + ": watch: " +
                        (e.is_object() && e.contains("message") ? e["message"].dump() : e.dump())};
                return false;
            }
            const Json &r = j.contains("result") ? j["result"] : j;
            if (r.value("created", false) && on_created) {
                on_created();
            }
            if (int64Of(r, "compact_revision") != 0) {
                verdict = {Code::kNotFound,
                           "etcd " + endpoint() + ": revision " + std::to_string(start_revision) +
                               " was compacted (at " +
                               std::to_string(int64Of(r, "compact_revision")) + ")"};
                return false;
            }
            if (r.value("canceled", false)) {
                verdict = {Code::kPeer, "etcd " + endpoint() + ": the watch was cancelled: " +
                                            r.value("cancel_reason", std::string())};
                return false;
            }
            const int64_t revision = r.contains("header") ? int64Of(r["header"], "revision") : 0;
            std::vector<EtcdEvent> events;
            if (r.contains("events") && r["events"].is_array()) {
                for (const Json &ev : r["events"]) {
                    EtcdEvent parsed;
                    parsed.type = ev.value("type", std::string("PUT")) == "DELETE"
                                      ? EtcdEvent::Type::kDelete
                                      : EtcdEvent::Type::kPut;
                    if (ev.contains("kv") && kvOf(ev["kv"], &parsed.kv)) {
                        events.push_back(std::move(parsed));
                    }
                }
            }
            if (!events.empty() && !on_events(events, revision)) {
                stop = true;
                return false;
            }
        }
        pending.erase(0, start);
        if (pending.size() > kMaxReplyBytes) {
            verdict = {Code::kPeer, "etcd " + endpoint() + ": a watch message over 64 MiB"};
            return false;
        }
        return true;
    };
    Status s = call("/v3/watch", body.dump(), nullptr, &sink);
    if (!verdict.isOk()) {
        return verdict;
    }
    if (stop || !s.isOk()) {
        return s;
    }
    return {Code::kPeer, "etcd " + endpoint() + ": the watch stream ended"};
}

}  // namespace tensorlane::sidecar
