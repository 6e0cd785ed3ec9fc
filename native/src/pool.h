// KV page pools: named POSIX shared-memory regions of fixed-size pages, one per engine, mapped
// by every process on the host that opens the name. The first 4 KiB hold a header; pages follow,
// page-aligned. Each creation draws a new random epoch, so a restarted engine's pool is never
// mistaken for the one a transfer was prepared against.
//
// A device pool (CUDA) keeps only its header in shared memory: its pages are one cudaMalloc
// allocation on a GPU, and the header carries the CUDA IPC handle through which other processes
// map them. Its pages are never dereferenced on the host; they are copied with the CUDA runtime.
//
// Ownership: a Mapping is shared (std::shared_ptr) by the pool handle and by every page view
// handed to JavaScript; the region is unmapped only when the last of them is gone, so closing a
// pool while JS still holds a page view cannot leave a dangling pointer. Device pages are freed
// (or their IPC mapping closed) with the last Mapping of them in this process.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "cuda.h"

namespace pdctl {

constexpr char kPoolMagic[8] = {'P', 'D', 'K', 'V', 'P', 'O', 'O', 'L'};
constexpr uint32_t kPoolVersion = 2;  // 2: device pools (device, ipc)
constexpr size_t kHeaderBytes = 4096;

struct PoolHeader {
  char magic[8];
  uint32_t version;
  uint32_t pages;
  uint64_t pageBytes;
  uint64_t epoch;  // < 2^53, so JavaScript numbers hold it exactly
  uint64_t createdMs;
  // Set (never cleared) when the pool is re-created under its name: mappings of the old region
  // then know it is no longer the pool the name stands for.
  uint32_t retired;
  int32_t device;     // -1: pages follow this header in the shared memory; else a CUDA device ordinal
  CudaIpcHandle ipc;  // device pools: how another process maps the pages
};

// Device pages of one pool in this process: allocated here (freed with cudaFree) or mapped from
// another process's allocation (closed with cudaIpcCloseMemHandle).
struct DeviceMemory {
  uint8_t* ptr = nullptr;
  int device = 0;
  bool imported = false;
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory();
};

class Mapping {
 public:
  Mapping(std::string name, uint8_t* base, size_t size, std::shared_ptr<DeviceMemory> device = nullptr)
      : name_(std::move(name)), base_(base), size_(size), device_(std::move(device)) {}
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  const std::string& name() const { return name_; }
  const PoolHeader& header() const { return *reinterpret_cast<const PoolHeader*>(base_); }
  bool retired() const { return __atomic_load_n(&reinterpret_cast<const PoolHeader*>(base_)->retired, __ATOMIC_ACQUIRE) != 0; }
  uint8_t* base() const { return base_; }
  // True for a device pool: page() then points into GPU memory, which the host must not touch.
  bool onDevice() const { return device_ != nullptr; }
  int device() const { return device_ ? device_->device : -1; }
  uint8_t* page(uint32_t index) const {
    uint8_t* pages = device_ ? device_->ptr : base_ + kHeaderBytes;
    return pages + static_cast<size_t>(index) * header().pageBytes;
  }

 private:
  std::string name_;
  uint8_t* base_;
  size_t size_;
  std::shared_ptr<DeviceMemory> device_;
};

struct PoolError {
  // TRANSFER_POOL_EXISTS, TRANSFER_POOL_NOT_FOUND, TRANSFER_POOL_CORRUPT, TRANSFER_BACKEND_UNAVAILABLE,
  // TRANSFER_SYSTEM
  std::string code;
  std::string message;
};

// `device` -1: host shared memory; otherwise the CUDA device to allocate the pages on.
std::shared_ptr<Mapping> createPool(const std::string& name, uint32_t pages, uint64_t pageBytes, int device,
                                    bool replace, PoolError* err);
std::shared_ptr<Mapping> openPool(const std::string& name, PoolError* err);
// Copy `bytes` from page `first` on into host memory, or from host memory into the pool; for a
// device pool through the CUDA runtime. The range is checked by the caller.
bool readPages(const Mapping& m, uint32_t first, uint64_t bytes, uint8_t* out, PoolError* err);
bool writePages(const Mapping& m, uint32_t first, const uint8_t* in, uint64_t bytes, PoolError* err);
// CRC32C of `count` pages from `first`, continuing from `crc`; device pages are read back in chunks.
bool crcPages(const Mapping& m, uint32_t first, uint64_t count, uint32_t* crc, PoolError* err);

// Returns false (with err) only on a system error; a name that does not exist is not an error.
bool unlinkPool(const std::string& name, bool* existed, PoolError* err);

}  // namespace pdctl
