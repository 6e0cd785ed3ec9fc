#include "transfer.h"

#include <pthread.h>

#include <algorithm>
#include <cstring>

#include "crc32c.h"

namespace pdctl {
namespace {

constexpr size_t kChunkBytes = 1 << 20;  // cancel and deadline are checked between chunks
// Device copies are queued on a CUDA stream a window at a time, and cancel and deadline are
// checked between windows: a GPU moves 16 MiB in tens of microseconds, so a smaller window would
// spend its time launching copies rather than making them. Scattered pages are one copy each, so a
// window also ends after 64 copies.
constexpr size_t kDeviceWindowBytes = 16 << 20;
constexpr size_t kDeviceWindowCopies = 64;

using Clock = std::chrono::steady_clock;

}  // namespace

TransferWorkers::TransferWorkers(unsigned threads, Complete complete) : complete_(std::move(complete)) {
  for (unsigned i = 0; i < threads; i++) workers_.emplace_back([this] { work(); });
}

TransferWorkers::~TransferWorkers() { shutdown(); }

void TransferWorkers::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& [room, flags] : byRoom_) {
      for (auto& f : flags) f->store(true);
    }
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

bool TransferWorkers::post(uint64_t id, std::string room, std::shared_ptr<Mapping> src, std::shared_ptr<Mapping> dst,
                          std::vector<std::pair<uint32_t, uint32_t>> pairs, uint64_t epoch, uint32_t deadlineMs,
                          TransferResult* immediate) {
  if (dst->retired() || dst->header().epoch != epoch) {
    *immediate = {id, room, "epoch_mismatch", 0, 0, 0, "the destination pool was re-created since the transfer was prepared"};
    count(immediate->status);
    return false;
  }
  auto flag = std::make_shared<std::atomic<bool>>(false);
  auto now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      *immediate = {id, room, "cancelled", 0, 0, 0, "the transfer workers are closed"};
      count(immediate->status);
      return false;
    }
    Fault fault;
    if (auto it = faults_.find(room); it != faults_.end()) fault = it->second;
    else if (auto all = faults_.find(""); all != faults_.end()) fault = all->second;
    byRoom_[room].push_back(flag);
    queue_.push_back(Job{id, std::move(room), std::move(src), std::move(dst), std::move(pairs), epoch, now,
                         now + std::chrono::milliseconds(deadlineMs), flag, fault});
  }
  cv_.notify_one();
  return true;
}

uint32_t TransferWorkers::cancel(const std::string& room) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = byRoom_.find(room);
  if (it == byRoom_.end()) return 0;
  uint32_t n = 0;
  for (auto& f : it->second) {
    if (!f->exchange(true)) n++;
  }
  return n;
}

void TransferWorkers::inject(const std::string& room, Fault fault) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_[room] = fault;
}

void TransferWorkers::clearFaults() {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.clear();
}

TransferStats TransferWorkers::stats() const {
  TransferStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.queued = queue_.size();
  }
  s.bytes = bytes_.load();
  s.running = running_.load();
  s.ok = ok_.load();
  s.cancelled = cancelled_.load();
  s.stalled = stalled_.load();
  s.epochMismatch = epochMismatch_.load();
  s.failed = failed_.load();
  return s;
}

void TransferWorkers::count(const std::string& status) {
  if (status == "ok") ok_++;
  else if (status == "cancelled") cancelled_++;
  else if (status == "stalled") stalled_++;
  else if (status == "epoch_mismatch") epochMismatch_++;
  else failed_++;
}

void TransferWorkers::forget(const Job& job) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = byRoom_.find(job.room);
  if (it == byRoom_.end()) return;
  auto& flags = it->second;
  flags.erase(std::remove(flags.begin(), flags.end(), job.cancelled), flags.end());
  if (flags.empty()) byRoom_.erase(it);
}

void TransferWorkers::work() {
  // Named, so that `top -H` and /proc/PID/task/*/comm tell the copy threads from node's own.
  pthread_setname_np(pthread_self(), "pdctl-transfer");
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to finish as cancelled
      job = std::move(queue_.front());
      queue_.pop_front();
      running_++;
    }
    TransferResult r = run(job);
    forget(job);
    count(r.status);
    // Drop this job's pools before reporting it: once JavaScript sees the completion, no worker
    // holds them, and a pool closed then is unmapped (its device memory freed) at once, not
    // whenever this thread next takes a job.
    job.src.reset();
    job.dst.reset();
    running_--;
    complete_(std::move(r));
  }
}

TransferResult TransferWorkers::run(Job& job) {
  TransferResult r{job.id, job.room, "ok", 0, 0, 0, ""};
  const uint64_t srcBytes = job.src->header().pageBytes;
  const uint64_t dstBytes = job.dst->header().pageBytes;
  auto finish = [&](const char* status, std::string error = "") {
    r.status = status;
    r.error = std::move(error);
    r.micros = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - job.started).count());
    return r;
  };
  // Between chunks: cancelled first (an explicit request), then a re-created destination, then
  // the deadline.
  auto interrupted = [&]() -> const char* {
    if (job.cancelled->load()) return "cancelled";
    if (job.dst->retired()) return "epoch_mismatch";
    if (Clock::now() >= job.deadline) return "stalled";
    return nullptr;
  };
  auto wait = [&](std::chrono::milliseconds total, bool untilInterrupted) -> const char* {
    auto until = Clock::now() + total;
    for (;;) {
      if (const char* why = interrupted()) return why;
      if (!untilInterrupted && Clock::now() >= until) return nullptr;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  if (srcBytes != dstBytes) return finish("failed", "source and destination pools have different page sizes");
  if (job.fault.kind == FaultKind::Fail) return finish("failed", "injected failure");
  if (job.fault.kind == FaultKind::Stall) return finish(wait(std::chrono::milliseconds(0), true));
  if (job.fault.kind == FaultKind::Delay) {
    if (const char* why = wait(std::chrono::milliseconds(job.fault.ms), false)) return finish(why);
  }
  // Contiguous runs of pages (contiguous on both sides) become segments of at most one chunk.
  const bool device = job.src->onDevice() || job.dst->onDevice();
  const size_t chunkBytes = device ? kDeviceWindowBytes : kChunkBytes;
  std::vector<Segment> segments;
  for (size_t i = 0, n = job.pairs.size(); i < n;) {
    size_t j = i + 1;
    while (j < n && job.pairs[j].first == job.pairs[j - 1].first + 1 && job.pairs[j].second == job.pairs[j - 1].second + 1) j++;
    const uint8_t* from = job.src->page(job.pairs[i].first);
    uint8_t* to = job.dst->page(job.pairs[i].second);
    for (size_t left = (j - i) * srcBytes; left > 0;) {
      size_t chunk = std::min(left, chunkBytes);
      segments.push_back({from, to, chunk});
      from += chunk;
      to += chunk;
      left -= chunk;
    }
    i = j;
  }
  uint32_t crc = 0;
  if (device) {
    std::string error;
    if (const char* why = copyOnDevice(job, segments, &crc, &r.bytes, interrupted, &error)) return finish(why, error);
  } else {
    for (const Segment& seg : segments) {
      if (const char* why = interrupted()) return finish(why);
      crc = crc32cCopy(crc, seg.to, seg.from, seg.bytes);
      r.bytes += seg.bytes;
      bytes_ += seg.bytes;
    }
  }
  if (job.fault.kind == FaultKind::Corrupt && !job.pairs.empty()) {
    PoolError ignored;
    uint8_t byte = 0;
    if (readPages(*job.dst, job.pairs[0].second, 1, &byte, &ignored)) {
      byte ^= 0xFF;
      writePages(*job.dst, job.pairs[0].second, &byte, 1, &ignored);
    }
  }
  r.checksum = crc;
  // The destination may have been re-created while we copied: then nobody may read what we wrote.
  if (job.dst->retired()) return finish("epoch_mismatch", "the destination pool was re-created during the transfer");
  return finish("ok");
}

const char* TransferWorkers::copyOnDevice(const Job& job, const std::vector<Segment>& segments, uint32_t* crc,
                                         uint64_t* moved, const std::function<const char*()>& interrupted,
                                         std::string* error) {
  const CudaRuntime* r = cudaRuntime();
  if (!r) {
    *error = "CUDA is not available: " + cudaUnavailableReason();
    return "failed";
  }
  // The stream belongs to the destination's device when it is on one (the copy engine that writes
  // it), else to the source's.
  const int device = job.dst->onDevice() ? job.dst->device() : job.src->device();
  CudaStream stream = threadStream(device, error);
  if (!stream) return "failed";
  // A device source is checksummed from a pinned host copy made on the same stream; a host
  // source on the CPU while the stream copies it.
  const bool srcOnDevice = job.src->onDevice();
  uint8_t* staging = srcOnDevice ? threadStaging(kDeviceWindowBytes, error) : nullptr;
  if (srcOnDevice && !staging) return "failed";
  for (size_t i = 0; i < segments.size();) {
    if (const char* why = interrupted()) return why;
    size_t windowBytes = 0, j = i, polls = 0;
    int rc = kCudaSuccess;
    for (; j < segments.size() && j - i < kDeviceWindowCopies && windowBytes + segments[j].bytes <= kDeviceWindowBytes &&
           rc == kCudaSuccess;
         j++) {
      const Segment& seg = segments[j];
      rc = r->memcpyAsync(seg.to, seg.from, seg.bytes, kCudaMemcpyDefault, stream);
      if (rc == kCudaSuccess && srcOnDevice) {
        rc = r->memcpyAsync(staging + windowBytes, seg.from, seg.bytes, kCudaMemcpyDefault, stream);
      }
      windowBytes += seg.bytes;
    }
    if (!srcOnDevice) {
      for (size_t k = i; k < j; k++) *crc = crc32c(*crc, segments[k].from, segments[k].bytes);
    }
    // Wait for the window, checking cancel and deadline meanwhile. Copies already queued cannot be
    // taken back: an interrupted transfer waits for them, so that nothing writes its pages after
    // it has completed.
    while (rc == kCudaSuccess) {
      if ((rc = r->streamQuery(stream)) != kCudaErrorNotReady) break;
      rc = kCudaSuccess;
      if (const char* why = interrupted()) {
        rc = r->streamSynchronize(stream);
        if (rc == kCudaSuccess) {
          *moved += windowBytes;
          bytes_ += windowBytes;
        }
        return why;
      }
      // Spin briefly (a window usually takes microseconds), then stop burning the core.
      if (++polls < 1000) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (rc != kCudaSuccess) {
      r->streamSynchronize(stream);
      *error = r->error("cudaMemcpyAsync", rc);
      return "failed";
    }
    if (srcOnDevice) *crc = crc32c(*crc, staging, windowBytes);
    *moved += windowBytes;
    bytes_ += windowBytes;
    i = j;
  }
  return nullptr;
}

}  // namespace pdctl
