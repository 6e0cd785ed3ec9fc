#include "pool.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <unordered_map>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"

namespace pdctl {
namespace {

std::string sys(const std::string& what, const std::string& name) {
  return what + " " + name + ": " + std::strerror(errno);
}

uint64_t newEpoch() {
  std::random_device rd;
  uint64_t e = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  e &= (uint64_t{1} << 53) - 1;
  return e == 0 ? 1 : e;
}

uint8_t* mapFd(int fd, const std::string& name, size_t size, PoolError* err) {
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    *err = {"TRANSFER_SYSTEM", sys("mmap", name)};
    return nullptr;
  }
  return static_cast<uint8_t*>(base);
}

// Device pages this process holds, by pool name and epoch. CUDA will not open an IPC handle in
// the process that made it, and two imports of one allocation would map it twice: a pool opened
// again here shares what is already held.
std::mutex registryMu;
std::unordered_map<std::string, std::weak_ptr<DeviceMemory>> registry;

std::string registryKey(const std::string& name, uint64_t epoch) { return name + "@" + std::to_string(epoch); }

void remember(const std::string& name, uint64_t epoch, const std::shared_ptr<DeviceMemory>& memory) {
  std::lock_guard<std::mutex> lock(registryMu);
  for (auto it = registry.begin(); it != registry.end();) it = it->second.expired() ? registry.erase(it) : std::next(it);
  registry[registryKey(name, epoch)] = memory;
}

std::shared_ptr<DeviceMemory> held(const std::string& name, uint64_t epoch) {
  std::lock_guard<std::mutex> lock(registryMu);
  auto it = registry.find(registryKey(name, epoch));
  return it == registry.end() ? nullptr : it->second.lock();
}

const CudaRuntime* needCuda(PoolError* err) {
  const CudaRuntime* r = cudaRuntime();
  if (!r) *err = {"TRANSFER_BACKEND_UNAVAILABLE", "CUDA is not available: " + cudaUnavailableReason()};
  return r;
}

// Allocates the pages of a new device pool and writes their IPC handle into its header.
std::shared_ptr<DeviceMemory> allocateDevice(const std::string& name, int device, uint64_t bytes, PoolHeader* h,
                                             PoolError* err) {
  const CudaRuntime* r = needCuda(err);
  if (!r) return nullptr;
  if (device >= r->devices) {
    *err = {"TRANSFER_BACKEND_UNAVAILABLE",
            "CUDA device " + std::to_string(device) + " does not exist: " + r->library + " sees " +
                std::to_string(r->devices)};
    return nullptr;
  }
  int rc = r->setDevice(device);
  auto memory = std::make_shared<DeviceMemory>();
  memory->device = device;
  void* ptr = nullptr;
  if (rc == kCudaSuccess) rc = r->malloc(&ptr, bytes);
  if (rc != kCudaSuccess) {
    *err = {"TRANSFER_SYSTEM", "pool " + name + ": " + r->error("cudaMalloc", rc)};
    return nullptr;
  }
  memory->ptr = static_cast<uint8_t*>(ptr);
  rc = r->ipcGetMemHandle(&h->ipc, ptr);
  if (rc != kCudaSuccess) {
    *err = {"TRANSFER_SYSTEM", "pool " + name + ": " + r->error("cudaIpcGetMemHandle", rc)};
    return nullptr;  // memory's destructor frees the allocation
  }
  return memory;
}

// Maps another process's device pages through the IPC handle in the header.
std::shared_ptr<DeviceMemory> importDevice(const std::string& name, const PoolHeader& h, PoolError* err) {
  if (auto mine = held(name, h.epoch)) return mine;
  const CudaRuntime* r = needCuda(err);
  if (!r) return nullptr;
  auto memory = std::make_shared<DeviceMemory>();
  memory->device = h.device;
  memory->imported = true;
  void* ptr = nullptr;
  int rc = r->setDevice(h.device);
  if (rc == kCudaSuccess) rc = r->ipcOpenMemHandle(&ptr, h.ipc, kCudaIpcMemLazyEnablePeerAccess);
  if (rc != kCudaSuccess) {
    *err = {"TRANSFER_SYSTEM", "pool " + name + " (CUDA device " + std::to_string(h.device) +
                                   "): " + r->error("cudaIpcOpenMemHandle", rc)};
    return nullptr;
  }
  memory->ptr = static_cast<uint8_t*>(ptr);
  remember(name, h.epoch, memory);
  return memory;
}

// Marks the pool under `name` retired, through its header alone: a device pool's pages need not be
// (and, once their owner is gone, cannot be) mapped for that.
void retire(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return;
  struct stat st {};
  PoolError ignored;
  uint8_t* base = fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= kHeaderBytes
                      ? mapFd(fd, name, kHeaderBytes, &ignored)
                      : nullptr;
  close(fd);
  if (!base) return;
  auto* h = reinterpret_cast<PoolHeader*>(base);
  if (std::memcmp(h->magic, kPoolMagic, sizeof kPoolMagic) == 0) __atomic_store_n(&h->retired, 1u, __ATOMIC_RELEASE);
  munmap(base, kHeaderBytes);
}

// cudaMemcpy between a device pool's pages and host memory, on the pool's device.
bool deviceCopy(const Mapping& m, void* to, const void* from, uint64_t bytes, PoolError* err) {
  const CudaRuntime* r = needCuda(err);
  if (!r) return false;
  int rc = r->setDevice(m.device());
  if (rc == kCudaSuccess) rc = r->memcpy(to, from, bytes, kCudaMemcpyDefault);
  if (rc != kCudaSuccess) *err = {"TRANSFER_SYSTEM", "pool " + m.name() + ": " + r->error("cudaMemcpy", rc)};
  return rc == kCudaSuccess;
}

// For host copies of device pages: bounded, so a checksum of a large pool needs no large buffer.
constexpr uint64_t kStagingBytes = 4 << 20;

}  // namespace

Mapping::~Mapping() { munmap(base_, size_); }

DeviceMemory::~DeviceMemory() {
  const CudaRuntime* r = cudaRuntime();
  if (!ptr || !r) return;
  r->setDevice(device);
  if (imported) r->ipcCloseMemHandle(ptr);
  else r->free(ptr);
}

std::shared_ptr<Mapping> createPool(const std::string& name, uint32_t pages, uint64_t pageBytes, int device,
                                    bool replace, PoolError* err) {
  // A device pool fails early on a machine without CUDA, before any name is taken or retired.
  if (device >= 0 && !needCuda(err)) return nullptr;
  if (replace) {
    // Retire the old region first, so transfers still aimed at it fail their epoch check.
    retire(name);
    shm_unlink(name.c_str());
  }
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    *err = {errno == EEXIST ? "TRANSFER_POOL_EXISTS" : "TRANSFER_SYSTEM", sys("shm_open", name)};
    return nullptr;
  }
  const uint64_t pageArea = static_cast<uint64_t>(pages) * pageBytes;
  size_t size = kHeaderBytes + (device >= 0 ? 0 : pageArea);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    *err = {"TRANSFER_SYSTEM", sys("ftruncate", name)};
    close(fd);
    shm_unlink(name.c_str());
    return nullptr;
  }
  uint8_t* base = mapFd(fd, name, size, err);
  close(fd);
  if (!base) {
    shm_unlink(name.c_str());
    return nullptr;
  }
  auto* h = reinterpret_cast<PoolHeader*>(base);
  h->version = kPoolVersion;
  h->pages = pages;
  h->pageBytes = pageBytes;
  h->epoch = newEpoch();
  h->retired = 0;
  h->device = device;
  std::shared_ptr<DeviceMemory> memory;
  if (device >= 0) {
    memory = allocateDevice(name, device, pageArea, h, err);
    if (!memory) {
      munmap(base, size);
      shm_unlink(name.c_str());
      return nullptr;
    }
    remember(name, h->epoch, memory);
  }
  auto m = std::make_shared<Mapping>(name, base, size, std::move(memory));
  h->createdMs = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  // The magic goes last: a reader that sees it sees a complete header.
  __atomic_thread_fence(__ATOMIC_RELEASE);
  std::memcpy(h->magic, kPoolMagic, sizeof kPoolMagic);
  return m;
}

std::shared_ptr<Mapping> openPool(const std::string& name, PoolError* err) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    *err = {errno == ENOENT ? "TRANSFER_POOL_NOT_FOUND" : "TRANSFER_SYSTEM", sys("shm_open", name)};
    return nullptr;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < kHeaderBytes) {
    *err = {"TRANSFER_POOL_CORRUPT", "shared memory " + name + " is too small to be a pdctl pool"};
    close(fd);
    return nullptr;
  }
  const auto size = static_cast<size_t>(st.st_size);
  uint8_t* base = mapFd(fd, name, size, err);
  close(fd);
  if (!base) return nullptr;
  const PoolHeader& h = *reinterpret_cast<const PoolHeader*>(base);
  if (std::memcmp(h.magic, kPoolMagic, sizeof kPoolMagic) != 0 || h.version != kPoolVersion || h.pageBytes == 0 ||
      size != kHeaderBytes + (h.device >= 0 ? 0 : static_cast<uint64_t>(h.pages) * h.pageBytes)) {
    munmap(base, size);
    *err = {"TRANSFER_POOL_CORRUPT", "shared memory " + name + " is not a pdctl pool of version " +
                                         std::to_string(kPoolVersion)};
    return nullptr;
  }
  std::shared_ptr<DeviceMemory> memory;
  if (h.device >= 0 && !(memory = importDevice(name, h, err))) {
    munmap(base, size);
    return nullptr;
  }
  return std::make_shared<Mapping>(name, base, size, std::move(memory));
}

bool readPages(const Mapping& m, uint32_t first, uint64_t bytes, uint8_t* out, PoolError* err) {
  if (m.onDevice()) return deviceCopy(m, out, m.page(first), bytes, err);
  std::memcpy(out, m.page(first), bytes);
  return true;
}

bool writePages(const Mapping& m, uint32_t first, const uint8_t* in, uint64_t bytes, PoolError* err) {
  if (m.onDevice()) return deviceCopy(m, m.page(first), in, bytes, err);
  std::memcpy(m.page(first), in, bytes);
  return true;
}

bool crcPages(const Mapping& m, uint32_t first, uint64_t count, uint32_t* crc, PoolError* err) {
  const uint64_t total = count * m.header().pageBytes;
  if (!m.onDevice()) {
    // Pages are contiguous in the mapping, so a range is one span.
    *crc = crc32c(*crc, m.page(first), total);
    return true;
  }
  std::vector<uint8_t> staging(std::min(total, kStagingBytes));
  for (uint64_t done = 0; done < total;) {
    uint64_t n = std::min<uint64_t>(total - done, staging.size());
    if (!deviceCopy(m, staging.data(), m.page(first) + done, n, err)) return false;
    *crc = crc32c(*crc, staging.data(), n);
    done += n;
  }
  return true;
}

bool unlinkPool(const std::string& name, bool* existed, PoolError* err) {
  if (shm_unlink(name.c_str()) == 0) {
    *existed = true;
    return true;
  }
  if (errno == ENOENT) {
    *existed = false;
    return true;
  }
  *err = {"TRANSFER_SYSTEM", sys("shm_unlink", name)};
  return false;
}

}  // namespace pdctl
