// The UCX network backend of the transfer core: one-sided puts of a room's pages into a pool on
// another host (docs/design.md §6). UCX (libucp, libucs) is loaded at run time with dlopen, as the
// CUDA runtime is, so the addon builds and runs where UCX is absent; its headers are needed at
// build time (Debian libucx-dev) — without them the backend is compiled out and says so.
//
// Shape (NIXL's backend verbs): a node is one UCX context and worker per process. `registerPool`
// maps a pool's memory once and returns the remote key a peer needs; `address` is the worker
// address a peer connects to. `post` puts (source page, destination page) runs into a peer's pool
// and completes only after a flush: the bytes are at the destination. Each transfer has a
// deadline that ends it `stalled`, `cancel(room)`, and a CRC32C of the source bytes in pair order.
//
// Threads: the worker is created in UCS_THREAD_MODE_SINGLE and touched only by the node's own
// progress thread; the JS thread hands it commands through a queue (and waits for the few that
// return a value: registration). Completions go back through the callback the owner supplies.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
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

struct UcxRegistration {
  uint64_t id = 0;       // for unregister
  uint64_t base = 0;     // the address of page 0 in the registering process
  std::string rkey;      // packed remote key (bytes)
};

struct UcxPeer {
  std::string address;   // the peer worker's address (bytes)
  std::string rkey;      // its pool's packed remote key (bytes)
  uint64_t base = 0;     // the address of its page 0
  uint64_t pageBytes = 0;
  uint32_t pages = 0;
};

// Unpacks a peer's worker address and remote key with a context of its own, and closes it.
// UCX aborts the process on a malformed address, so this is meant for a throwaway process
// (src/transfer/ucx-check.ts): a descriptor from another engine is checked there before any
// engine process uses it. False with *error for what UCX refused without aborting.
bool ucxCheckPeer(const std::string& address, const std::string& rkey, std::string* error);

class UcxNode {
 public:
  using Complete = std::function<void(TransferResult)>;

  // Throws std::runtime_error with the reason when UCX cannot be set up.
  explicit UcxNode(Complete complete);
  ~UcxNode();
  UcxNode(const UcxNode&) = delete;
  UcxNode& operator=(const UcxNode&) = delete;

  const std::string& address() const { return address_; }
  // Maps a pool's pages for remote access; throws std::runtime_error on failure.
  UcxRegistration registerPool(std::shared_ptr<Mapping> pool);
  void unregister(uint64_t id);
  // Queues a put of `pairs` (source page, destination page) from `src` into the peer's pool.
  void post(uint64_t id, std::string room, std::shared_ptr<Mapping> src, UcxPeer peer,
            std::vector<std::pair<uint32_t, uint32_t>> pairs, uint32_t deadlineMs);
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
