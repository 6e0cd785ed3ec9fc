#include "ucx.h"

#include <atomic>
#include <chrono>
#include <stdexcept>

#include "crc32c.h"

#ifdef PDCTL_HAVE_UCX
#include <dlfcn.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <ucp/api/ucp.h>

#include <cstdlib>
#endif

namespace pdctl {

uint64_t ucxRoomTag(const std::string& room, uint64_t epoch) {
  // FNV-1a over the room id, a zero byte, then the epoch's eight bytes.
  uint64_t h = 14695981039346656037ull;
  auto mix = [&h](uint8_t b) {
    h ^= b;
    h *= 1099511628211ull;
  };
  for (unsigned char c : room) mix(c);
  mix(0);
  for (int i = 0; i < 8; i++) mix(static_cast<uint8_t>(epoch >> (8 * i)));
  return h;
}

#ifndef PDCTL_HAVE_UCX

namespace {
const char* kNoHeaders =
    "this build of the addon has no UCX backend: UCX's headers were absent when it was built (apt-get install "
    "libucx-dev, then npm rebuild)";
}

bool ucxAvailable(std::string* reason, std::string* version) {
  *reason = kNoHeaders;
  version->clear();
  return false;
}

bool ucxCheckPeer(const std::string&, std::string* error) {
  *error = kNoHeaders;
  return false;
}

struct UcxNode::Impl {};
UcxNode::UcxNode(Complete) { throw std::runtime_error(kNoHeaders); }
UcxNode::~UcxNode() = default;
void UcxNode::post(uint64_t, std::string, uint64_t, std::shared_ptr<Mapping>, std::string, std::vector<uint32_t>,
                   uint32_t) {}
void UcxNode::receive(uint64_t, std::string, uint64_t, std::shared_ptr<Mapping>, std::vector<uint32_t>) {}
uint32_t UcxNode::cancel(const std::string&) { return 0; }
void UcxNode::inject(const std::string&, Fault) {}
void UcxNode::clearFaults() {}
TransferStats UcxNode::stats() const { return {}; }
void UcxNode::shutdown() {}

#else

namespace {

// The entry points used, bound from libucp and libucs at run time with the types of the headers.
struct Ucx {
  std::string version;
  decltype(&ucp_get_version_string) getVersionString;
  decltype(&ucp_config_read) configRead;
  decltype(&ucp_config_modify) configModify;
  decltype(&ucp_config_release) configRelease;
  decltype(&ucp_init_version) initVersion;
  decltype(&ucp_cleanup) cleanup;
  decltype(&ucp_worker_create) workerCreate;
  decltype(&ucp_worker_destroy) workerDestroy;
  decltype(&ucp_worker_get_address) workerGetAddress;
  decltype(&ucp_worker_release_address) workerReleaseAddress;
  decltype(&ucp_worker_progress) workerProgress;
  decltype(&ucp_worker_get_efd) workerGetEfd;
  decltype(&ucp_worker_arm) workerArm;
  decltype(&ucp_ep_create) epCreate;
  decltype(&ucp_ep_close_nbx) epCloseNbx;
  decltype(&ucp_tag_send_sync_nbx) tagSendSyncNbx;
  decltype(&ucp_tag_recv_nbx) tagRecvNbx;
  decltype(&ucp_tag_recv_request_test) tagRecvRequestTest;
  decltype(&ucp_request_cancel) requestCancel;
  decltype(&ucp_request_check_status) requestCheckStatus;
  decltype(&ucp_request_free) requestFree;
  decltype(&ucs_status_string) statusString;
};

struct Loaded {
  Ucx ucx;
  bool ok = false;
  std::string reason;
};

template <typename Fn>
void bind(void* lib, const char* name, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (!*out && missing->empty()) *missing = name;
}

Loaded load() {
  Loaded l;
  // Loaded, UCX would by default install its own handlers for SIGSEGV, SIGBUS and friends and
  // patch the process's mmap/munmap/brk and malloc (memory events for its registration cache).
  // Inside Node both fight V8 (a `pdctl serve` that only asked backends() died in V8 code with
  // UCX's handler on the stack). Its configuration is read when the libraries load, so it is set
  // here first, over whatever the environment said: these transfers do not need either.
  setenv("UCX_HANDLE_ERRORS", "none", 1);
  setenv("UCX_ERROR_SIGNALS", "", 1);
  setenv("UCX_MEM_EVENTS", "no", 1);
  setenv("UCX_MEM_MALLOC_HOOKS", "no", 1);
  setenv("UCX_MEM_MMAP_HOOK_MODE", "none", 1);
  // UCX's TCP transport writes a peer's zero-copy put wherever its header says. Off, this node
  // never offers it to peers (so a peer's UCP never uses it against this one) nor uses it.
  setenv("UCX_TCP_PUT_ENABLE", "n", 1);
  void* ucp = dlopen("libucp.so.0", RTLD_NOW | RTLD_GLOBAL);
  void* ucs = ucp ? dlopen("libucs.so.0", RTLD_NOW | RTLD_GLOBAL) : nullptr;
  if (!ucp || !ucs) {
    const char* why = dlerror();
    l.reason = std::string("UCX is not installed (libucp.so.0/libucs.so.0: ") + (why ? why : "not found") +
               "); apt-get install libucx0 (libucx-dev to build)";
    return l;
  }
  Ucx& u = l.ucx;
  std::string missing;
  bind(ucp, "ucp_get_version_string", &u.getVersionString, &missing);
  bind(ucp, "ucp_config_read", &u.configRead, &missing);
  bind(ucp, "ucp_config_modify", &u.configModify, &missing);
  bind(ucp, "ucp_config_release", &u.configRelease, &missing);
  bind(ucp, "ucp_init_version", &u.initVersion, &missing);
  bind(ucp, "ucp_cleanup", &u.cleanup, &missing);
  bind(ucp, "ucp_worker_create", &u.workerCreate, &missing);
  bind(ucp, "ucp_worker_destroy", &u.workerDestroy, &missing);
  bind(ucp, "ucp_worker_get_address", &u.workerGetAddress, &missing);
  bind(ucp, "ucp_worker_release_address", &u.workerReleaseAddress, &missing);
  bind(ucp, "ucp_worker_progress", &u.workerProgress, &missing);
  bind(ucp, "ucp_worker_get_efd", &u.workerGetEfd, &missing);
  bind(ucp, "ucp_worker_arm", &u.workerArm, &missing);
  bind(ucp, "ucp_ep_create", &u.epCreate, &missing);
  bind(ucp, "ucp_ep_close_nbx", &u.epCloseNbx, &missing);
  bind(ucp, "ucp_tag_send_sync_nbx", &u.tagSendSyncNbx, &missing);
  bind(ucp, "ucp_tag_recv_nbx", &u.tagRecvNbx, &missing);
  bind(ucp, "ucp_tag_recv_request_test", &u.tagRecvRequestTest, &missing);
  bind(ucp, "ucp_request_cancel", &u.requestCancel, &missing);
  bind(ucp, "ucp_request_check_status", &u.requestCheckStatus, &missing);
  bind(ucp, "ucp_request_free", &u.requestFree, &missing);
  bind(ucs, "ucs_status_string", &u.statusString, &missing);
  if (!missing.empty()) {
    l.reason = "the UCX library here has no " + missing + " (UCX 1.11 or newer is needed)";
    return l;
  }
  u.version = u.getVersionString();
  l.ok = true;
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

using Clock = std::chrono::steady_clock;

// How long a send already posted gets to finish after it is cancelled.
constexpr auto kCancelGrace = std::chrono::milliseconds(250);

// One send or receive; touched only by the node's thread once queued.
struct Job {
  bool receive = false;
  uint64_t id = 0;
  std::string room;
  uint64_t tag = 0;
  std::shared_ptr<Mapping> pool;  // the source pool of a send, the destination of a receive
  std::string address;            // a send's peer worker
  std::vector<uint32_t> pages;    // in message order
  Clock::time_point started, deadline, startAt;  // a receive has no deadline: cancel ends it
  Fault fault;
  bool cancelled = false;           // asked to stop
  Clock::time_point cancelledAt{};  // when: a send still out then has kCancelGrace to finish
  bool cancelAsked = false;         // a receive's ucp_request_cancel was called
  bool posted = false;
  ucp_ep_h ep = nullptr;
  std::vector<ucp_dt_iov_t> iov;   // the message's runs of consecutive pages
  void* request = nullptr;         // in flight; null once it ended
  ucp_tag_recv_info_t info{};      // a receive's: what arrived
  bool done = false;               // the request ended (status in `ended`)
  ucs_status_t ended = UCS_OK;
  std::vector<uint8_t> corrupted;  // the first page, altered, for a `corrupt` fault
  TransferResult result;
  std::string error;  // the first error seen; the job fails with it once its request ended
};

// Runs of consecutive pages as an iov; `first` replaces the first page when given.
std::vector<ucp_dt_iov_t> runs(Mapping& pool, const std::vector<uint32_t>& pages, uint8_t* first) {
  const size_t pageBytes = pool.header().pageBytes;
  std::vector<ucp_dt_iov_t> iov;
  for (size_t i = 0; i < pages.size(); i++) {
    uint8_t* at = i == 0 && first ? first : pool.page(pages[i]);
    bool joins = i > 0 && !(i == 1 && first) && pages[i] == pages[i - 1] + 1;
    if (joins) iov.back().length += pageBytes;
    else iov.push_back({at, pageBytes});
  }
  return iov;
}

// The datatype, buffer and count of a message over `iov`: contiguous when it is one run.
void describe(std::vector<ucp_dt_iov_t>& iov, ucp_request_param_t* p, void** buffer, size_t* count) {
  p->op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
  if (iov.size() == 1) {
    p->datatype = ucp_dt_make_contig(1);
    *buffer = iov[0].buffer;
    *count = iov[0].length;
  } else {
    p->datatype = ucp_dt_make_iov();
    *buffer = iov.data();
    *count = iov.size();
  }
}

}  // namespace

bool ucxAvailable(std::string* reason, std::string* version) {
  const Loaded& l = loaded();
  *reason = l.reason;
  *version = l.ok ? l.ucx.version : "";
  return l.ok;
}

struct UcxNode::Impl {
  const Ucx& u = loaded().ucx;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  Complete complete;

  std::mutex mu;
  // Wakes the thread for new work, cancels and shutdown (an eventfd: a write made before the
  // thread sleeps is not lost). The worker's own fd wakes it for network events.
  int wakeFd = -1;
  int workerFd = -1;
  std::deque<std::unique_ptr<Job>> incoming;
  std::unordered_map<std::string, Fault> faults;
  std::unordered_map<std::string, uint32_t> cancels;  // room → cancel requests not yet applied
  std::unordered_map<std::string, uint32_t> inFlight;  // room → sends and receives not completed
  bool stopping = false;
  std::thread thread;

  // Thread only.
  Clock::time_point stoppedAt{};
  std::vector<std::unique_ptr<Job>> active;
  std::unordered_map<std::string, ucp_ep_h> endpoints;  // by peer address

  std::atomic<uint64_t> bytes{0}, queued{0}, running{0}, ok{0}, cancelled{0}, stalled{0}, failed{0};

  std::string status(ucs_status_t s) const { return u.statusString(s); }

  void wake() {
    uint64_t one = 1;
    ssize_t n = write(wakeFd, &one, sizeof one);
    (void)n;  // the counter is already non-zero when it cannot grow: the thread wakes either way
  }

  // Whether the job only waits on the network: a posted receive not being cancelled. (A send is
  // not: its thread keeps progressing it — armed waits missed send-side events, 50 ms a page.)
  static bool waiting(const Job& j) { return j.receive && j.posted && !j.cancelled && !j.done; }

  // Sleeps until there is something to do: new work (wakeFd), or a network event for the worker
  // (its fd, armed). Over TCP a message to this node lands only when this worker progresses, so a
  // node that receives must wake when the data arrives, not on a timer.
  void sleepUntilWork() {
    while (u.workerProgress(worker) > 0) {
    }
    bool armed = false;
    if (workerFd >= 0) {
      ucs_status_t s = u.workerArm(worker);
      if (s == UCS_ERR_BUSY) return;  // events came in meanwhile: progress them first
      armed = s == UCS_OK;
    }
    pollfd fds[2] = {{wakeFd, POLLIN, 0}, {workerFd, POLLIN, 0}};
    // Without a worker fd, a node with receives posted polls its worker every millisecond.
    int timeoutMs = armed || active.empty() ? 50 : 1;
    poll(fds, armed ? 2 : 1, timeoutMs);
    uint64_t v;
    while (read(wakeFd, &v, sizeof v) > 0) {
    }
  }

  void run() {
    for (;;) {
      std::deque<std::unique_ptr<Job>> fresh;
      std::unordered_map<std::string, uint32_t> toCancel;
      bool idle;
      {
        std::lock_guard<std::mutex> lock(mu);
        idle = incoming.empty() && cancels.empty() && !stopping;
      }
      for (auto& j : active) idle = idle && waiting(*j);
      if (idle) sleepUntilWork();
      {
        std::unique_lock<std::mutex> lock(mu);
        fresh.swap(incoming);
        toCancel.swap(cancels);
        if (stopping && fresh.empty() && active.empty()) break;
        // A receive a peer is still writing into may not end; past a grace, the worker goes with it.
        if (stopping && stoppedAt != Clock::time_point{} && Clock::now() - stoppedAt > 4 * kCancelGrace) break;
        if (stopping && stoppedAt == Clock::time_point{}) stoppedAt = Clock::now();
        if (stopping) {
          for (auto& j : fresh) j->cancelled = true;
          for (auto& j : active) j->cancelled = true;
        }
      }
      // Shutting down: whatever a peer has not taken is not waited for.
      if (stopping)
        for (auto& j : active)
          if (!j->receive && j->request) dropEndpoint(j->address);
      for (auto& j : fresh) {
        queued--;
        running++;
        active.push_back(std::move(j));
      }
      for (auto& j : active) {
        if (toCancel.count(j->room) && !j->cancelled) {
          j->cancelled = true;
          j->cancelledAt = Clock::now();
        }
      }
      for (int i = 0; i < 64 && u.workerProgress(worker) > 0; i++) {
      }
      step();
    }
    // Receives a peer was still writing into when the grace ran out: their owners hear
    // `cancelled` (the worker, destroyed next, takes their requests with it).
    for (auto& j : active) {
      if (j->error.empty()) j->error = "the UCX node shut down while the message was arriving";
      finish(j, "cancelled");
    }
    active.clear();
    for (auto& [addr, ep] : endpoints) closeEndpoint(ep, true);
    endpoints.clear();
  }

  void closeEndpoint(ucp_ep_h ep, bool force) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t req = u.epCloseNbx(ep, &p);
    if (req == nullptr || UCS_PTR_IS_ERR(req)) return;
    auto until = Clock::now() + std::chrono::milliseconds(500);
    while (u.requestCheckStatus(req) == UCS_INPROGRESS && Clock::now() < until) u.workerProgress(worker);
    u.requestFree(req);
  }

  ucp_ep_h endpoint(const std::string& address, std::string* error) {
    auto it = endpoints.find(address);
    if (it != endpoints.end()) return it->second;
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.address = reinterpret_cast<const ucp_address_t*>(address.data());
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ucp_ep_h ep = nullptr;
    ucs_status_t s = u.epCreate(worker, &p, &ep);
    if (s != UCS_OK) {
      *error = "cannot reach the peer's UCX worker (ucp_ep_create: " + status(s) + ")";
      return nullptr;
    }
    endpoints.emplace(address, ep);
    return ep;
  }

  // A peer whose transfer stalled or failed: its endpoint is closed by force, which ends every
  // request on it, and the next transfer to it makes a new one.
  void dropEndpoint(const std::string& address) {
    auto it = endpoints.find(address);
    if (it == endpoints.end()) return;
    ucp_ep_h ep = it->second;
    endpoints.erase(it);
    for (auto& j : active) {
      if (j->ep == ep) j->ep = nullptr;
    }
    closeEndpoint(ep, true);
  }

  // Starts a send; false with job.error when it cannot start.
  bool start(Job& j) {
    const uint64_t pageBytes = j.pool->header().pageBytes;
    if (j.pool->onDevice()) {
      j.error = "UCX sends from a device pool are not supported; keep KV in host memory across hosts";
      return false;
    }
    uint32_t crc = 0;
    for (uint32_t page : j.pages) crc = crc32c(crc, j.pool->page(page), pageBytes);
    j.result.checksum = crc;
    j.result.bytes = j.pages.size() * pageBytes;
    j.ep = endpoint(j.address, &j.error);
    if (!j.ep) return false;
    if (j.fault.kind == FaultKind::Corrupt && !j.pages.empty()) {
      const uint8_t* first = j.pool->page(j.pages[0]);
      j.corrupted.assign(first, first + pageBytes);
      j.corrupted[0] ^= 0xFF;
    }
    j.iov = runs(*j.pool, j.pages, j.corrupted.empty() ? nullptr : j.corrupted.data());
    ucp_request_param_t p{};
    void* buffer;
    size_t count;
    describe(j.iov, &p, &buffer, &count);
    // Synchronous: it completes once the receiver matched it to the receive it posted.
    ucs_status_ptr_t r = u.tagSendSyncNbx(j.ep, buffer, count, j.tag, &p);
    j.posted = true;
    return track(j, r, "ucp_tag_send_sync_nbx");
  }

  // Posts a receive into the room's pages, never anywhere else.
  void postReceive(Job& j) {
    j.iov = runs(*j.pool, j.pages, nullptr);
    ucp_request_param_t p{};
    void* buffer;
    size_t count;
    describe(j.iov, &p, &buffer, &count);
    // Always a request, even for a message already here: ucp_tag_recv_request_test says its length.
    p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    ucs_status_ptr_t r = u.tagRecvNbx(worker, buffer, count, j.tag, ~ucp_tag_t{0}, &p);
    j.posted = true;
    track(j, r, "ucp_tag_recv_nbx");
  }

  bool track(Job& j, ucs_status_ptr_t r, const char* what) {
    if (UCS_PTR_IS_ERR(r)) {
      j.error = std::string(what) + ": " + status(UCS_PTR_STATUS(r));
      j.done = true;
      j.ended = UCS_PTR_STATUS(r);
      return false;
    }
    j.request = r;
    j.done = r == nullptr;
    return true;
  }

  // Whether the job's request ended; then `ended` (and a receive's `info`) say how.
  bool settle(Job& j) {
    if (j.done) return true;
    if (j.request == nullptr) {  // never posted
      j.done = true;
      j.ended = UCS_ERR_CANCELED;
      return true;
    }
    ucs_status_t s = j.receive ? u.tagRecvRequestTest(j.request, &j.info) : u.requestCheckStatus(j.request);
    if (s == UCS_INPROGRESS) return false;
    u.requestFree(j.request);
    j.request = nullptr;
    j.done = true;
    j.ended = s;
    return true;
  }

  void finish(std::unique_ptr<Job>& j, const char* what) {
    // A send whose endpoint was closed under it: UCX frees the request when it ends.
    if (j->request && !j->receive) u.requestFree(j->request);
    j->request = nullptr;
    TransferResult r = std::move(j->result);
    r.id = j->id;
    r.room = j->room;
    r.status = what;
    if (std::string(what) != "ok") r.error = j->error;
    if (std::string(what) == "ok") {
      ok++;
      bytes += r.bytes;
    } else if (std::string(what) == "cancelled") {
      cancelled++;
    } else if (std::string(what) == "stalled") {
      stalled++;
    } else {
      failed++;
    }
    r.micros = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - j->started).count());
    running--;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = inFlight.find(r.room);
      if (it != inFlight.end() && --it->second == 0) inFlight.erase(it);
    }
    complete(std::move(r));
    j.reset();
  }

  // A receive: posted at once, and it ends only when its request did — a cancel asks UCX, which
  // may still be writing a matched message into the pages: they are free only after that.
  void stepReceive(std::unique_ptr<Job>& jp) {
    Job& j = *jp;
    if (!j.posted) {
      if (j.cancelled) return finish(jp, "cancelled");
      postReceive(j);
    }
    if (j.cancelled && !j.done && !j.cancelAsked) {
      u.requestCancel(worker, j.request);
      j.cancelAsked = true;
    }
    if (!settle(j)) return;
    const uint64_t expected = j.pages.size() * j.pool->header().pageBytes;
    if (j.ended == UCS_ERR_CANCELED || (j.cancelled && j.ended == UCS_OK && j.info.length != expected))
      return finish(jp, "cancelled");
    if (j.ended == UCS_ERR_MESSAGE_TRUNCATED) {
      j.error = "a message longer than the " + std::to_string(expected) +
                " bytes of the room's pages arrived; UCX kept it out of them";
      return finish(jp, "failed");
    }
    if (j.ended != UCS_OK) {
      if (j.error.empty()) j.error = status(j.ended);
      return finish(jp, "failed");
    }
    if (j.info.length != expected) {
      j.error = "received " + std::to_string(j.info.length) + " bytes, the room's pages hold " +
                std::to_string(expected);
      return finish(jp, "failed");
    }
    // No checksum here: the decode engine verifies the pages itself against the committed one.
    j.result.bytes = expected;
    finish(jp, "ok");
  }

  void stepSend(std::unique_ptr<Job>& jp, Clock::time_point now) {
    Job& j = *jp;
    if (!j.posted) {
      if (j.cancelled) return finish(jp, "cancelled");
      if (j.fault.kind == FaultKind::Fail) {
        j.error = "injected failure";
        return finish(jp, "failed");
      }
      if (now >= j.deadline) {
        j.error = "the message was not sent before the deadline";
        return finish(jp, "stalled");
      }
      if (j.fault.kind == FaultKind::Stall || now < j.startAt) return;
      if (!start(j)) {
        // What was posted must end before the pages may be reused: drop the endpoint.
        if (j.request) dropEndpoint(j.address);
        settle(j);
        return finish(jp, "failed");
      }
    }
    if (settle(j)) {
      if (j.cancelled) return finish(jp, "cancelled");
      if (j.ended != UCS_OK) {
        if (j.error.empty()) j.error = status(j.ended);
        return finish(jp, "failed");
      }
      return finish(jp, "ok");
    }
    if (j.cancelled && now - j.cancelledAt >= kCancelGrace) {
      // Cancelled, and the peer does not take the message (a cut link): a cancel is not left to
      // wait for the deadline. The pages may be reused only once nothing is in flight.
      dropEndpoint(j.address);
      settle(j);
      return finish(jp, "cancelled");
    }
    if (now >= j.deadline) {
      // The peer did not match the message (no receive posted) or does not take the bytes.
      j.error = "the receiver did not take the message before the deadline";
      dropEndpoint(j.address);
      settle(j);
      return finish(jp, "stalled");
    }
  }

  void step() {
    const auto now = Clock::now();
    for (auto& jp : active) {
      if (jp->receive) stepReceive(jp);
      else stepSend(jp, now);
    }
    std::vector<std::unique_ptr<Job>> still;
    for (auto& j : active)
      if (j) still.push_back(std::move(j));
    active.swap(still);
  }

  void queue(std::unique_ptr<Job> j) {
    {
      std::lock_guard<std::mutex> lock(mu);
      auto f = faults.find(j->room);
      if (f == faults.end()) f = faults.find("");
      if (!j->receive && f != faults.end()) j->fault = f->second;
      if (j->fault.kind == FaultKind::Delay) j->startAt += std::chrono::milliseconds(j->fault.ms);
      queued++;
      inFlight[j->room]++;
      incoming.push_back(std::move(j));
    }
    wake();
  }
};

bool ucxCheckPeer(const std::string& address, std::string* error) {
  const Loaded& l = loaded();
  if (!l.ok) {
    *error = l.reason;
    return false;
  }
  const Ucx& u = l.ucx;
  ucp_config_t* config = nullptr;
  if (u.configRead(nullptr, nullptr, &config) != UCS_OK) {
    *error = "ucp_config_read failed";
    return false;
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  ucp_context_h context = nullptr;
  ucs_status_t s = u.initVersion(UCP_API_MAJOR, UCP_API_MINOR, &params, config, &context);
  u.configRelease(config);
  if (s != UCS_OK) {
    *error = std::string("ucp_init: ") + u.statusString(s);
    return false;
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  bool ok = false;
  if ((s = u.workerCreate(context, &wp, &worker)) != UCS_OK) {
    *error = std::string("ucp_worker_create: ") + u.statusString(s);
  } else {
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.address = reinterpret_cast<const ucp_address_t*>(address.data());
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ucp_ep_h ep = nullptr;
    if ((s = u.epCreate(worker, &p, &ep)) != UCS_OK) {
      *error = std::string("the worker address does not unpack: ") + u.statusString(s);
    } else {
      ok = true;
      ucp_request_param_t cp{};
      cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t req = u.epCloseNbx(ep, &cp);
      if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
        while (u.requestCheckStatus(req) == UCS_INPROGRESS) u.workerProgress(worker);
        u.requestFree(req);
      }
    }
    u.workerDestroy(worker);
  }
  u.cleanup(context);
  return ok;
}

UcxNode::UcxNode(Complete complete) : impl_(std::make_unique<Impl>()) {
  const Loaded& l = loaded();
  if (!l.ok) throw std::runtime_error(l.reason);
  Impl& m = *impl_;
  m.complete = std::move(complete);
  const Ucx& u = l.ucx;
  ucp_config_t* config = nullptr;
  ucs_status_t s = u.configRead(nullptr, nullptr, &config);
  if (s != UCS_OK) throw std::runtime_error("ucp_config_read: " + std::string(u.statusString(s)));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  // No UCP_FEATURE_RMA: a peer's put or get through UCP is not executed here.
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  s = u.initVersion(UCP_API_MAJOR, UCP_API_MINOR, &params, config, &m.context);
  u.configRelease(config);
  if (s != UCS_OK) throw std::runtime_error("ucp_init: " + std::string(u.statusString(s)));
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  s = u.workerCreate(m.context, &wp, &m.worker);
  if (s != UCS_OK) {
    u.cleanup(m.context);
    throw std::runtime_error("ucp_worker_create: " + std::string(u.statusString(s)));
  }
  ucp_address_t* address = nullptr;
  size_t length = 0;
  s = u.workerGetAddress(m.worker, &address, &length);
  if (s != UCS_OK) {
    u.workerDestroy(m.worker);
    u.cleanup(m.context);
    throw std::runtime_error("ucp_worker_get_address: " + std::string(u.statusString(s)));
  }
  address_.assign(reinterpret_cast<const char*>(address), length);
  u.workerReleaseAddress(m.worker, address);
  m.wakeFd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (m.wakeFd < 0) {
    int e = errno;
    u.workerDestroy(m.worker);
    u.cleanup(m.context);
    m.worker = nullptr;
    m.context = nullptr;
    throw std::runtime_error("eventfd: " + std::string(strerror(e)));
  }
  // Without one (a transport with no event fd) the thread polls instead: see sleepUntilWork.
  if (u.workerGetEfd(m.worker, &m.workerFd) != UCS_OK) m.workerFd = -1;
  // From here on the worker belongs to the thread.
  m.thread = std::thread([&m] { m.run(); });
}

UcxNode::~UcxNode() { shutdown(); }

void UcxNode::post(uint64_t id, std::string room, uint64_t epoch, std::shared_ptr<Mapping> src, std::string address,
                   std::vector<uint32_t> pages, uint32_t deadlineMs) {
  auto j = std::make_unique<Job>();
  j->id = id;
  j->tag = ucxRoomTag(room, epoch);
  j->room = std::move(room);
  j->pool = std::move(src);
  j->address = std::move(address);
  j->pages = std::move(pages);
  j->started = Clock::now();
  j->deadline = j->started + std::chrono::milliseconds(deadlineMs);
  j->startAt = j->started;
  impl_->queue(std::move(j));
}

void UcxNode::receive(uint64_t id, std::string room, uint64_t epoch, std::shared_ptr<Mapping> dst,
                      std::vector<uint32_t> pages) {
  auto j = std::make_unique<Job>();
  j->receive = true;
  j->id = id;
  j->tag = ucxRoomTag(room, epoch);
  j->room = std::move(room);
  j->pool = std::move(dst);
  j->pages = std::move(pages);
  j->started = Clock::now();
  impl_->queue(std::move(j));
}

uint32_t UcxNode::cancel(const std::string& room) {
  Impl& m = *impl_;
  uint32_t n = 0;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    auto it = m.inFlight.find(room);
    if (it == m.inFlight.end()) return 0;
    n = it->second;
    m.cancels[room]++;
  }
  m.wake();
  return n;
}

void UcxNode::inject(const std::string& room, Fault fault) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (fault.kind == FaultKind::None) impl_->faults.erase(room);
  else impl_->faults[room] = fault;
}

void UcxNode::clearFaults() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->faults.clear();
}

TransferStats UcxNode::stats() const {
  const Impl& m = *impl_;
  TransferStats s;
  s.bytes = m.bytes;
  s.queued = m.queued;
  s.running = m.running;
  s.ok = m.ok;
  s.cancelled = m.cancelled;
  s.stalled = m.stalled;
  s.failed = m.failed;
  return s;
}

void UcxNode::shutdown() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.stopping) return;
    m.stopping = true;
  }
  m.wake();
  if (m.thread.joinable()) m.thread.join();
  if (m.worker) m.u.workerDestroy(m.worker);
  if (m.context) m.u.cleanup(m.context);
  if (m.wakeFd >= 0) close(m.wakeFd);
  m.wakeFd = -1;
  m.worker = nullptr;
  m.context = nullptr;
}

#endif

}  // namespace pdctl
