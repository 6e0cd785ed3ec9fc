// A stand-in for libcudart, for testing the transfer core's CUDA backend on machines without a
// GPU (CI). It is never used unless PDCTL_CUDART names it. It implements the entry points that
// native/src/cuda.h loads, with the behaviour the backend relies on:
//
// - "Device memory" is host shared memory (one shm object per cudaMalloc, named
//   /pdctl-fakecuda-PID-N), so an IPC handle can be opened by another process as with CUDA. The
//   pointers handed out are non-canonical (bit 62 set): the host faults on any direct access, so a
//   backend that touches device memory without going through cudaMemcpy crashes here as it would
//   on a GPU. Copies check that a device range lies inside one allocation.
// - Streams are real threads: cudaMemcpyAsync returns before the copy is made, and
//   cudaStreamQuery answers "not ready" until it is. FAKE_CUDA_COPY_US delays each queued copy,
//   so tests can catch a transfer mid-flight.
// - As with CUDA, a process cannot open the IPC handle it exported, and cudaFree of an imported
//   pointer fails.
// - FAKE_CUDA_DEVICES sets the device count (default 1).
// - At exit the process's allocations are unlinked, as a GPU frees a dead process's memory.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;
constexpr int kMemoryAllocation = 2;
constexpr int kInvalidDevice = 101;
constexpr int kInvalidResourceHandle = 400;
constexpr int kNotReady = 600;
constexpr uintptr_t kTag = uintptr_t{1} << 62;

struct Alloc {
  uint8_t* real;
  size_t bytes;
  std::string name;
  bool owned;  // made by cudaMalloc here, rather than opened from a handle
};

std::mutex mu;
std::map<uintptr_t, Alloc> allocs;  // by tagged base address

// A GPU's memory goes with the process that allocated it; here the shm names would stay behind
// in /dev/shm. So at exit (not on SIGKILL) this process's allocations are unlinked.
struct UnlinkAtExit {
  ~UnlinkAtExit() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [tagged, a] : allocs) {
      if (a.owned) shm_unlink(a.name.c_str());
    }
  }
} unlinkAtExit;
std::atomic<unsigned> seq{0};
thread_local int current = 0;

int devices() {
  const char* v = std::getenv("FAKE_CUDA_DEVICES");
  return v ? std::atoi(v) : 1;
}

// The host address behind a pointer: device pointers are translated (and their range checked),
// host pointers pass through.
uint8_t* resolve(const void* p, size_t bytes) {
  auto addr = reinterpret_cast<uintptr_t>(p);
  if (!(addr & kTag)) return const_cast<uint8_t*>(static_cast<const uint8_t*>(p));
  std::lock_guard<std::mutex> lock(mu);
  auto it = allocs.upper_bound(addr);
  if (it == allocs.begin()) return nullptr;
  --it;
  if (addr + bytes > it->first + it->second.bytes) return nullptr;
  return it->second.real + (addr - it->first);
}

uint8_t* mapShm(const std::string& name, int flags, size_t* bytes) {
  int fd = shm_open(name.c_str(), flags, 0600);
  if (fd < 0) return nullptr;
  struct stat st {};
  if ((flags & O_CREAT) ? ftruncate(fd, static_cast<off_t>(*bytes)) != 0 : fstat(fd, &st) != 0) {
    close(fd);
    return nullptr;
  }
  if (!(flags & O_CREAT)) *bytes = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, *bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

void* track(uint8_t* real, size_t bytes, std::string name, bool owned) {
  auto tagged = reinterpret_cast<uintptr_t>(real) | kTag;
  std::lock_guard<std::mutex> lock(mu);
  allocs[tagged] = {real, bytes, std::move(name), owned};
  return reinterpret_cast<void*>(tagged);
}

struct Stream {
  struct Copy {
    uint8_t* to;
    const uint8_t* from;
    size_t bytes;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Copy> queue;
  size_t pending = 0;
  bool stopping = false;
  unsigned delayUs = 0;
  std::thread worker;

  Stream() {
    if (const char* v = std::getenv("FAKE_CUDA_COPY_US")) delayUs = static_cast<unsigned>(std::atoi(v));
    worker = std::thread([this] { run(); });
  }
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    worker.join();
  }
  void run() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [this] { return stopping || !queue.empty(); });
      if (queue.empty()) return;
      Copy c = queue.front();
      queue.pop_front();
      lock.unlock();
      if (delayUs) std::this_thread::sleep_for(std::chrono::microseconds(delayUs));
      std::memcpy(c.to, c.from, c.bytes);
      lock.lock();
      pending--;
      cv.notify_all();
    }
  }
};

}  // namespace

extern "C" {

int cudaGetDeviceCount(int* n) {
  *n = devices();
  return kSuccess;
}

int cudaSetDevice(int device) {
  if (device < 0 || device >= devices()) return kInvalidDevice;
  current = device;
  return kSuccess;
}

int cudaMalloc(void** p, size_t bytes) {
  std::string name = "/pdctl-fakecuda-" + std::to_string(getpid()) + "-" + std::to_string(seq++);
  uint8_t* real = mapShm(name, O_CREAT | O_EXCL | O_RDWR, &bytes);
  if (!real) return kMemoryAllocation;
  *p = track(real, bytes, name, true);
  return kSuccess;
}

int cudaFree(void* p) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocs.end() || !it->second.owned) return kInvalidValue;
  munmap(it->second.real, it->second.bytes);
  shm_unlink(it->second.name.c_str());
  allocs.erase(it);
  return kSuccess;
}

int cudaMallocHost(void** p, size_t bytes) {
  *p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  return *p ? kSuccess : kMemoryAllocation;
}

int cudaFreeHost(void* p) {
  std::free(p);
  return kSuccess;
}

int cudaMemcpy(void* dst, const void* src, size_t bytes, int /*kind*/) {
  uint8_t* to = resolve(dst, bytes);
  const uint8_t* from = resolve(src, bytes);
  if (!to || !from) return kInvalidValue;
  std::memcpy(to, from, bytes);
  return kSuccess;
}

int cudaStreamCreateWithFlags(void** stream, unsigned /*flags*/) {
  *stream = new Stream();
  return kSuccess;
}

int cudaStreamDestroy(void* stream) {
  delete static_cast<Stream*>(stream);
  return kSuccess;
}

int cudaMemcpyAsync(void* dst, const void* src, size_t bytes, int /*kind*/, void* stream) {
  uint8_t* to = resolve(dst, bytes);
  const uint8_t* from = resolve(src, bytes);
  if (!to || !from || !stream) return kInvalidValue;
  auto* s = static_cast<Stream*>(stream);
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->queue.push_back({to, from, bytes});
    s->pending++;
  }
  s->cv.notify_all();
  return kSuccess;
}

int cudaStreamQuery(void* stream) {
  auto* s = static_cast<Stream*>(stream);
  std::lock_guard<std::mutex> lock(s->mu);
  return s->pending == 0 ? kSuccess : kNotReady;
}

int cudaStreamSynchronize(void* stream) {
  auto* s = static_cast<Stream*>(stream);
  std::unique_lock<std::mutex> lock(s->mu);
  s->cv.wait(lock, [s] { return s->pending == 0; });
  return kSuccess;
}

// The handle: "FAKECUDA", the exporting pid, then the shm name.
int cudaIpcGetMemHandle(void* handle, void* p) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocs.end() || !it->second.owned || it->second.name.size() >= 64 - 12) return kInvalidValue;
  auto* h = static_cast<char*>(handle);
  std::memset(h, 0, 64);
  std::memcpy(h, "FAKECUDA", 8);
  int32_t pid = getpid();
  std::memcpy(h + 8, &pid, 4);
  std::memcpy(h + 12, it->second.name.c_str(), it->second.name.size());
  return kSuccess;
}

struct Handle {
  char bytes[64];
};

int cudaIpcOpenMemHandle(void** p, Handle handle, unsigned /*flags*/) {
  int32_t pid = 0;
  std::memcpy(&pid, handle.bytes + 8, 4);
  if (std::memcmp(handle.bytes, "FAKECUDA", 8) != 0) return kInvalidResourceHandle;
  if (pid == getpid()) return kInvalidResourceHandle;  // CUDA refuses a handle in its own process
  handle.bytes[63] = 0;
  std::string name(handle.bytes + 12);
  size_t bytes = 0;
  uint8_t* real = mapShm(name, O_RDWR, &bytes);
  if (!real) return kInvalidResourceHandle;
  *p = track(real, bytes, name, false);
  return kSuccess;
}

int cudaIpcCloseMemHandle(void* p) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocs.end() || it->second.owned) return kInvalidValue;
  munmap(it->second.real, it->second.bytes);
  allocs.erase(it);
  return kSuccess;
}

const char* cudaGetErrorString(int rc) {
  switch (rc) {
    case kSuccess: return "no error";
    case kInvalidValue: return "invalid argument";
    case kMemoryAllocation: return "out of memory";
    case kInvalidDevice: return "invalid device ordinal";
    case kInvalidResourceHandle: return "invalid resource handle";
    case kNotReady: return "device not ready";
    default: return "unknown error";
  }
}

}  // extern "C"
