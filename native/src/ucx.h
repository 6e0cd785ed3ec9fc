// The UCX network backend of the transfer core: a room's pages to a pool on another host, as
// two-sided tagged messages (docs/design.md §6). UCX (libucp, libucs) is loaded at run time with
// dlopen, as the CUDA runtime is, so the addon builds and runs where UCX is absent; its headers
// are needed at build time (Debian libucx-dev) — without them the backend is compiled out and says so.
//
// The receiver decides where bytes land. A node is one UCX context and worker per process, made
// without UCX's RMA feature: no memory is registered, no remote key exists, and a put or get a
// peer sends through UCP is never executed (docs/security.md, "The KV network"). `receive` posts a
// tagged receive into the pages a room reserved, its tag derived from the room and the pool's
// epoch; `post` sends a room's source pages as one synchronous tagged message to a peer's worker
// address, and completes once the receiver matched it. A message longer than the pages posted is
// truncated by UCX, never written past them. Each send has a deadline that ends it `stalled`;
// `cancel(room)` ends sends and receives; a send carries the CRC32C of the source bytes in page
// order (a receive none: the receiver verifies its pages against the sender's committed one).
//
// Threads: the worker is created in UCS_THREAD_MODE_SINGLE and touched only by the node's own
// progress thread; the JS thread hands it work through a queue. Completions go back through the
// callback the owner supplies.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pool.h"
#include "transfer.h"

namespace pdctl {

// Whether UCX can be used here, and why not ("" when it can); the version that loaded.
bool ucxAvailable(std::string* reason, std::string* version);

// The tag of a room's KV message: the room id and the receiving pool's epoch, hashed. Both ends
// derive it; a receive matches only this tag, every bit of it.
uint64_t ucxRoomTag(const std::string& room, uint64_t epoch);

// Connects to a peer's worker address with a context of its own, and closes it. UCX aborts the
// process on a malformed address, so this is meant for a throwaway process
// (src/transfer/ucx-check.ts): an address from another engine is checked there before any engine
// process uses it. False with *error for what UCX refused without aborting.
bool ucxCheckPeer(const std::string& address, std::string* error);

class UcxNode {
 public:
  using Complete = std::function<void(TransferResult)>;

  // Throws std::runtime_error with the reason when UCX cannot be set up.
  explicit UcxNode(Complete complete);
  ~UcxNode();
  UcxNode(const UcxNode&) = delete;
  UcxNode& operator=(const UcxNode&) = delete;

  const std::string& address() const { return address_; }
  // Queues a send of `pages` of `src`, in that order, to the peer worker at `address`: the
  // room's message under the tag of (room, epoch). Completes once the receiver matched it.
  void post(uint64_t id, std::string room, uint64_t epoch, std::shared_ptr<Mapping> src, std::string address,
            std::vector<uint32_t> pages, uint32_t deadlineMs);
  // Posts a receive of the room's message into `pages` of `dst`, in that order. Completes `ok`
  // when exactly that many bytes arrived, `failed` on any other length, `cancelled` by cancel().
  void receive(uint64_t id, std::string room, uint64_t epoch, std::shared_ptr<Mapping> dst,
               std::vector<uint32_t> pages);
  // Ends the room's sends and receives; returns how many were in flight.
  uint32_t cancel(const std::string& room);
  void inject(const std::string& room, Fault fault);
  void clearFaults();
  TransferStats stats() const;
  // Ends every transfer (cancelled), closes endpoints, stops the thread; idempotent.
  void shutdown();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

}  // namespace pdctl
