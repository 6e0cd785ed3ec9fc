// Transfers: copy (source page, destination page) lists from one pool into another on worker
// threads, off the JavaScript thread. What NIXL-based stacks lack, each transfer has: a deadline
// that ends in `stalled`, cancel by room, an epoch check at post and at completion, and an exact
// room tag on its completion.
//
// Threads: post() and cancel() run on the JS thread; copies run on the workers' threads and
// touch only the job they took and the mappings it holds (shared_ptr, so a pool closed meanwhile
// stays mapped). Completions go back through a callback the owner supplies (addon.cc sends them
// through a thread-safe function to the JS thread).
#pragma once
#include <atomic>
#include <chrono>
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

namespace pdctl {

enum class FaultKind { None, Stall, Delay, Corrupt, Fail };

struct Fault {
  FaultKind kind = FaultKind::None;
  uint32_t ms = 0;  // Delay: how long to wait before copying
};

struct TransferResult {
  uint64_t id = 0;
  std::string room;
  std::string status;  // ok, cancelled, stalled, epoch_mismatch, failed
  uint64_t bytes = 0;
  uint64_t micros = 0;
  uint32_t checksum = 0;  // CRC32C of the source bytes in pair order
  std::string error;
};

struct TransferStats {
  uint64_t bytes = 0;
  uint64_t queued = 0;
  uint64_t running = 0;
  uint64_t ok = 0, cancelled = 0, stalled = 0, epochMismatch = 0, failed = 0;
};

class TransferWorkers {
 public:
  using Complete = std::function<void(TransferResult)>;

  TransferWorkers(unsigned threads, Complete complete);
  ~TransferWorkers();
  TransferWorkers(const TransferWorkers&) = delete;
  TransferWorkers& operator=(const TransferWorkers&) = delete;

  // Queues a transfer; returns false with a result to deliver at once if it cannot start
  // (epoch mismatch). Pairs are (source page, destination page), already range-checked.
  bool post(uint64_t id, std::string room, std::shared_ptr<Mapping> src, std::shared_ptr<Mapping> dst,
            std::vector<std::pair<uint32_t, uint32_t>> pairs, uint64_t epoch, uint32_t deadlineMs,
            TransferResult* immediate);
  // Cancels every queued or running transfer of the room; returns how many.
  uint32_t cancel(const std::string& room);
  // Faults for drills: for one room, or for every transfer when room is empty.
  void inject(const std::string& room, Fault fault);
  void clearFaults();
  TransferStats stats() const;
  // Cancels everything and joins the workers; idempotent.
  void shutdown();

 private:
  struct Job {
    uint64_t id;
    std::string room;
    std::shared_ptr<Mapping> src, dst;
    std::vector<std::pair<uint32_t, uint32_t>> pairs;
    uint64_t epoch;
    std::chrono::steady_clock::time_point started, deadline;
    std::shared_ptr<std::atomic<bool>> cancelled;
    Fault fault;
  };

  // One contiguous piece of a transfer: at most a chunk (host) or a window (device).
  struct Segment {
    const uint8_t* from;
    uint8_t* to;
    size_t bytes;
  };

  void work();
  TransferResult run(Job& job);
  // Copies segments through the CUDA runtime when either pool is on a device. Returns the status
  // that ended it early (cancelled, stalled, epoch_mismatch, failed with *error), or null.
  const char* copyOnDevice(const Job& job, const std::vector<Segment>& segments, uint32_t* crc, uint64_t* moved,
                           const std::function<const char*()>& interrupted, std::string* error);
  void forget(const Job& job);
  void count(const std::string& status);

  Complete complete_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::unordered_map<std::string, std::vector<std::shared_ptr<std::atomic<bool>>>> byRoom_;
  std::unordered_map<std::string, Fault> faults_;
  std::vector<std::thread> workers_;
  bool stopping_ = false;
  std::atomic<uint64_t> bytes_{0}, running_{0}, ok_{0}, cancelled_{0}, stalled_{0}, epochMismatch_{0}, failed_{0};
};

}  // namespace pdctl
