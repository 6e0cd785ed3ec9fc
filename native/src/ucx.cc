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

bool ucxCheckPeer(const std::string&, const std::string&, std::string* error) {
  *error = kNoHeaders;
  return false;
}

struct UcxNode::Impl {};
UcxNode::UcxNode(Complete) { throw std::runtime_error(kNoHeaders); }
UcxNode::~UcxNode() = default;
UcxRegistration UcxNode::registerPool(std::shared_ptr<Mapping>) { throw std::runtime_error(kNoHeaders); }
void UcxNode::unregister(uint64_t) {}
void UcxNode::post(uint64_t, std::string, std::shared_ptr<Mapping>, UcxPeer, std::vector<std::pair<uint32_t, uint32_t>>,
                   uint32_t) {}
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
  decltype(&ucp_mem_map) memMap;
  decltype(&ucp_mem_unmap) memUnmap;
  decltype(&ucp_rkey_pack) rkeyPack;
  decltype(&ucp_rkey_buffer_release) rkeyBufferRelease;
  decltype(&ucp_ep_rkey_unpack) epRkeyUnpack;
  decltype(&ucp_rkey_destroy) rkeyDestroy;
  decltype(&ucp_put_nbx) putNbx;
  decltype(&ucp_ep_flush_nbx) epFlushNbx;
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
  // here first, over whatever the environment said: these puts do not need either.
  setenv("UCX_HANDLE_ERRORS", "none", 1);
  setenv("UCX_ERROR_SIGNALS", "", 1);
  setenv("UCX_MEM_EVENTS", "no", 1);
  setenv("UCX_MEM_MALLOC_HOOKS", "no", 1);
  setenv("UCX_MEM_MMAP_HOOK_MODE", "none", 1);
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
  bind(ucp, "ucp_mem_map", &u.memMap, &missing);
  bind(ucp, "ucp_mem_unmap", &u.memUnmap, &missing);
  bind(ucp, "ucp_rkey_pack", &u.rkeyPack, &missing);
  bind(ucp, "ucp_rkey_buffer_release", &u.rkeyBufferRelease, &missing);
  bind(ucp, "ucp_ep_rkey_unpack", &u.epRkeyUnpack, &missing);
  bind(ucp, "ucp_rkey_destroy", &u.rkeyDestroy, &missing);
  bind(ucp, "ucp_put_nbx", &u.putNbx, &missing);
  bind(ucp, "ucp_ep_flush_nbx", &u.epFlushNbx, &missing);
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

// How long puts already posted get to finish after their transfer is cancelled.
constexpr auto kCancelGrace = std::chrono::milliseconds(250);

// Everything in flight for one transfer; touched only by the node's thread once queued.
struct Job {
  uint64_t id = 0;
  std::string room;
  std::shared_ptr<Mapping> src;
  UcxPeer peer;
  std::vector<std::pair<uint32_t, uint32_t>> pairs;
  Clock::time_point started, deadline, startAt;
  Fault fault;
  bool cancelled = false;  // asked to stop
  Clock::time_point cancelledAt{};  // when: puts still out then have kCancelGrace to finish
  bool posted = false;     // puts posted
  bool flushing = false;
  ucp_ep_h ep = nullptr;
  ucp_rkey_h rkey = nullptr;
  std::vector<void*> requests;  // puts (or the flush) in flight
  std::vector<uint8_t> corrupted;  // the first page, altered, for a `corrupt` fault
  TransferResult result;
  std::string error;  // the first error seen; the job fails with it once its requests ended
};

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
  // Wakes the thread for new commands, transfers, cancels and shutdown (an eventfd: a write made
  // before the thread sleeps is not lost). The worker's own fd wakes it for network events.
  int wakeFd = -1;
  int workerFd = -1;
  std::deque<std::function<void()>> commands;  // run on the thread
  std::deque<std::unique_ptr<Job>> incoming;
  std::unordered_map<std::string, Fault> faults;
  std::unordered_map<std::string, uint32_t> cancels;  // room → cancel requests not yet applied
  std::unordered_map<std::string, uint32_t> inFlight;  // room → transfers posted, not completed
  bool stopping = false;
  std::thread thread;

  // Thread only.
  std::vector<std::unique_ptr<Job>> active;
  std::unordered_map<std::string, ucp_ep_h> endpoints;  // by peer address
  std::unordered_map<uint64_t, ucp_mem_h> registrations;
  uint64_t nextRegistration = 1;

  std::atomic<uint64_t> bytes{0}, queued{0}, running{0}, ok{0}, cancelled{0}, stalled{0}, failed{0};

  std::string status(ucs_status_t s) const { return u.statusString(s); }

  void wake() {
    uint64_t one = 1;
    ssize_t n = write(wakeFd, &one, sizeof one);
    (void)n;  // the counter is already non-zero when it cannot grow: the thread wakes either way
  }

  // Sleeps until there is something to do: a command (wakeFd), or a network event for the worker
  // (its fd, armed). Over TCP a put into this node's pool lands only when this worker progresses,
  // so a node that receives must wake when the data arrives, not on a timer.
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
    // Without a worker fd, a node that holds registered pools polls its worker every millisecond.
    int timeoutMs = armed || registrations.empty() ? 50 : 1;
    poll(fds, armed ? 2 : 1, timeoutMs);
    uint64_t v;
    while (read(wakeFd, &v, sizeof v) > 0) {
    }
  }

  void run() {
    for (;;) {
      std::deque<std::function<void()>> cmds;
      std::deque<std::unique_ptr<Job>> fresh;
      std::unordered_map<std::string, uint32_t> toCancel;
      bool idle;
      {
        std::lock_guard<std::mutex> lock(mu);
        idle = commands.empty() && incoming.empty() && cancels.empty() && active.empty() && !stopping;
      }
      if (idle) sleepUntilWork();
      {
        std::unique_lock<std::mutex> lock(mu);
        cmds.swap(commands);
        fresh.swap(incoming);
        toCancel.swap(cancels);
        if (stopping && cmds.empty() && fresh.empty() && active.empty()) break;
        if (stopping) {
          for (auto& j : fresh) j->cancelled = true;
          for (auto& j : active) j->cancelled = true;
        }
      }
      // Shutting down: whatever a peer has not taken is not waited for.
      if (stopping)
        for (auto& j : active)
          if (!j->requests.empty()) dropEndpoint(j->peer.address);
      for (auto& c : cmds) c();
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
    for (auto& [addr, ep] : endpoints) closeEndpoint(ep, true);
    endpoints.clear();
    for (auto& [id, memh] : registrations) u.memUnmap(context, memh);
    registrations.clear();
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

  // Starts a job's puts; false with job.error when it cannot start.
  bool start(Job& j) {
    const uint64_t pageBytes = j.src->header().pageBytes;
    if (j.src->onDevice()) {
      j.error = "UCX puts from a device pool are not supported; keep KV in host memory across hosts";
      return false;
    }
    if (j.peer.pageBytes != pageBytes) {
      j.error = "source and destination pools have different page sizes";
      return false;
    }
    uint32_t crc = 0;
    for (auto& [s, d] : j.pairs) crc = crc32c(crc, j.src->page(s), pageBytes);
    j.result.checksum = crc;
    j.ep = endpoint(j.peer.address, &j.error);
    if (!j.ep) return false;
    ucs_status_t s = u.epRkeyUnpack(j.ep, j.peer.rkey.data(), &j.rkey);
    if (s != UCS_OK) {
      j.error = "the peer's remote key does not unpack (" + status(s) + "): stale or malformed";
      return false;
    }
    if (j.fault.kind == FaultKind::Corrupt && !j.pairs.empty()) {
      const uint8_t* first = j.src->page(j.pairs[0].first);
      j.corrupted.assign(first, first + pageBytes);
      j.corrupted[0] ^= 0xFF;
    }
    ucp_request_param_t p{};
    for (size_t i = 0, n = j.pairs.size(); i < n;) {
      size_t k = i + 1;
      while (k < n && j.pairs[k].first == j.pairs[k - 1].first + 1 && j.pairs[k].second == j.pairs[k - 1].second + 1) k++;
      const uint8_t* from = j.src->page(j.pairs[i].first);
      size_t len = (k - i) * pageBytes;
      uint64_t remote = j.peer.base + static_cast<uint64_t>(j.pairs[i].second) * pageBytes;
      if (i == 0 && !j.corrupted.empty()) {
        ucs_status_ptr_t r = u.putNbx(j.ep, j.corrupted.data(), pageBytes, remote, j.rkey, &p);
        if (!track(j, r)) return false;
        from += pageBytes;
        len -= pageBytes;
        remote += pageBytes;
      }
      if (len > 0) {
        ucs_status_ptr_t r = u.putNbx(j.ep, from, len, remote, j.rkey, &p);
        if (!track(j, r)) return false;
      }
      j.result.bytes += (k - i) * pageBytes;
      i = k;
    }
    j.posted = true;
    return true;
  }

  bool track(Job& j, ucs_status_ptr_t r) {
    if (UCS_PTR_IS_ERR(r)) {
      j.error = "ucp_put_nbx: " + status(UCS_PTR_STATUS(r));
      return false;
    }
    if (r != nullptr) j.requests.push_back(r);
    return true;
  }

  // Drops finished requests; the first error is kept. True when none is left.
  bool settle(Job& j) {
    std::vector<void*> left;
    for (void* r : j.requests) {
      ucs_status_t s = u.requestCheckStatus(r);
      if (s == UCS_INPROGRESS) {
        left.push_back(r);
        continue;
      }
      if (s != UCS_OK && j.error.empty()) j.error = status(s);
      u.requestFree(r);
    }
    j.requests.swap(left);
    return j.requests.empty();
  }

  void finish(std::unique_ptr<Job>& j, const char* what) {
    if (j->rkey) u.rkeyDestroy(j->rkey);
    j->rkey = nullptr;
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

  void step() {
    const auto now = Clock::now();
    for (auto& jp : active) {
      Job& j = *jp;
      if (!j.posted) {
        if (j.cancelled) {
          finish(jp, "cancelled");
          continue;
        }
        if (j.fault.kind == FaultKind::Fail) {
          j.error = "injected failure";
          finish(jp, "failed");
          continue;
        }
        if (now >= j.deadline) {
          j.error = "no put was posted before the deadline";
          finish(jp, "stalled");
          continue;
        }
        if (j.fault.kind == FaultKind::Stall || now < j.startAt) continue;
        if (!start(j)) {
          // What was posted must end before the pages may be reused: drop the endpoint.
          if (!j.requests.empty()) dropEndpoint(j.peer.address);
          settle(j);
          finish(jp, "failed");
        }
        continue;
      }
      bool idle = settle(j);
      if (!j.error.empty()) {
        if (!idle) {
          dropEndpoint(j.peer.address);
          continue;
        }
        finish(jp, "failed");
        continue;
      }
      if (j.cancelled && !idle && now - j.cancelledAt >= kCancelGrace) {
        // Cancelled, and the peer does not take what was posted (a cut link): a cancel is not
        // left to wait for the deadline. The pages may be reused only once nothing is in flight.
        dropEndpoint(j.peer.address);
        settle(j);
        finish(jp, "cancelled");
        continue;
      }
      if (now >= j.deadline && !idle) {
        // The peer does not take the bytes: end every request on it.
        j.error = "the puts did not complete before the deadline";
        dropEndpoint(j.peer.address);
        settle(j);
        finish(jp, "stalled");
        continue;
      }
      if (!idle) continue;
      if (j.cancelled) {
        finish(jp, "cancelled");
        continue;
      }
      if (!j.flushing && j.ep == nullptr) {
        // Another transfer's stall closed the endpoint to this peer under it.
        j.error = "the endpoint to the peer was closed (another transfer to it stalled)";
        finish(jp, "failed");
        continue;
      }
      if (!j.flushing) {
        // Completion of a put only frees the source; the flush says the bytes are at the peer.
        ucp_request_param_t p{};
        ucs_status_ptr_t r = u.epFlushNbx(j.ep, &p);
        if (!track(j, r)) {
          finish(jp, "failed");
          continue;
        }
        j.flushing = true;
        if (r != nullptr) continue;
      }
      if (now >= j.deadline) {
        j.error = "the flush did not complete before the deadline";
        finish(jp, "stalled");
        continue;
      }
      finish(jp, "ok");
    }
    std::vector<std::unique_ptr<Job>> still;
    for (auto& j : active)
      if (j) still.push_back(std::move(j));
    active.swap(still);
  }

  // Runs `fn` on the node's thread and waits for it.
  template <typename T>
  T onThread(std::function<T()> fn) {
    auto task = std::make_shared<std::packaged_task<T()>>(std::move(fn));
    std::future<T> result = task->get_future();
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping) throw std::runtime_error("the UCX node is shut down");
      commands.push_back([task] { (*task)(); });
    }
    wake();
    return result.get();
  }
};

bool ucxCheckPeer(const std::string& address, const std::string& rkey, std::string* error) {
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
  params.features = UCP_FEATURE_RMA;
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
      ucp_rkey_h key = nullptr;
      if ((s = u.epRkeyUnpack(ep, rkey.data(), &key)) != UCS_OK) {
        *error = std::string("the remote key does not unpack: ") + u.statusString(s);
      } else {
        u.rkeyDestroy(key);
        ok = true;
      }
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
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
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

UcxRegistration UcxNode::registerPool(std::shared_ptr<Mapping> pool) {
  if (pool->onDevice()) throw std::runtime_error("UCX registration of device pools is not supported");
  Impl& m = *impl_;
  return m.onThread<UcxRegistration>([&m, pool]() {
    const Ucx& u = m.u;
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    p.address = pool->page(0);
    p.length = static_cast<size_t>(pool->header().pages) * pool->header().pageBytes;
    ucp_mem_h memh = nullptr;
    ucs_status_t s = u.memMap(m.context, &p, &memh);
    if (s != UCS_OK) throw std::runtime_error("ucp_mem_map: " + m.status(s));
    void* packed = nullptr;
    size_t size = 0;
    s = u.rkeyPack(m.context, memh, &packed, &size);
    if (s != UCS_OK) {
      u.memUnmap(m.context, memh);
      throw std::runtime_error("ucp_rkey_pack: " + m.status(s));
    }
    UcxRegistration r;
    r.id = m.nextRegistration++;
    r.base = reinterpret_cast<uint64_t>(pool->page(0));
    r.rkey.assign(static_cast<const char*>(packed), size);
    u.rkeyBufferRelease(packed);
    m.registrations.emplace(r.id, memh);
    return r;
  });
}

void UcxNode::unregister(uint64_t id) {
  Impl& m = *impl_;
  m.onThread<bool>([&m, id]() {
    auto it = m.registrations.find(id);
    if (it == m.registrations.end()) return false;
    m.u.memUnmap(m.context, it->second);
    m.registrations.erase(it);
    return true;
  });
}

void UcxNode::post(uint64_t id, std::string room, std::shared_ptr<Mapping> src, UcxPeer peer,
                   std::vector<std::pair<uint32_t, uint32_t>> pairs, uint32_t deadlineMs) {
  Impl& m = *impl_;
  auto j = std::make_unique<Job>();
  j->id = id;
  j->room = std::move(room);
  j->src = std::move(src);
  j->peer = std::move(peer);
  j->pairs = std::move(pairs);
  j->started = Clock::now();
  j->deadline = j->started + std::chrono::milliseconds(deadlineMs);
  j->startAt = j->started;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    auto f = m.faults.find(j->room);
    if (f == m.faults.end()) f = m.faults.find("");
    if (f != m.faults.end()) j->fault = f->second;
    if (j->fault.kind == FaultKind::Delay) j->startAt += std::chrono::milliseconds(j->fault.ms);
    m.queued++;
    m.inFlight[j->room]++;
    m.incoming.push_back(std::move(j));
  }
  m.wake();
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
