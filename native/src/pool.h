// KV page pools: named POSIX shared-memory regions of fixed-size pages, one per engine, mapped
// by every process on the host that opens the name. The first 4 KiB hold a header; pages follow,
// page-aligned. Each creation draws a new random epoch, so a restarted engine's pool is never
// mistaken for the one a transfer was prepared against.
//
// Ownership: a Mapping is shared (std::shared_ptr) by the pool handle and by every page view
// handed to JavaScript; the region is unmapped only when the last of them is gone, so closing a
// pool while JS still holds a page view cannot leave a dangling pointer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace pdctl {

constexpr char kPoolMagic[8] = {'P', 'D', 'K', 'V', 'P', 'O', 'O', 'L'};
constexpr uint32_t kPoolVersion = 1;
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
};

class Mapping {
 public:
  Mapping(std::string name, uint8_t* base, size_t size) : name_(std::move(name)), base_(base), size_(size) {}
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  const std::string& name() const { return name_; }
  const PoolHeader& header() const { return *reinterpret_cast<const PoolHeader*>(base_); }
  bool retired() const { return __atomic_load_n(&reinterpret_cast<const PoolHeader*>(base_)->retired, __ATOMIC_ACQUIRE) != 0; }
  uint8_t* base() const { return base_; }
  uint8_t* page(uint32_t index) const { return base_ + kHeaderBytes + static_cast<size_t>(index) * header().pageBytes; }

 private:
  std::string name_;
  uint8_t* base_;
  size_t size_;
};

struct PoolError {
  std::string code;  // TRANSFER_POOL_EXISTS, TRANSFER_POOL_NOT_FOUND, TRANSFER_POOL_CORRUPT, TRANSFER_SYSTEM
  std::string message;
};

std::shared_ptr<Mapping> createPool(const std::string& name, uint32_t pages, uint64_t pageBytes, bool replace,
                                    PoolError* err);
std::shared_ptr<Mapping> openPool(const std::string& name, PoolError* err);
// Returns false (with err) only on a system error; a name that does not exist is not an error.
bool unlinkPool(const std::string& name, bool* existed, PoolError* err);

}  // namespace pdctl
