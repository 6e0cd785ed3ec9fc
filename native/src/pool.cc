#include "pool.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

std::shared_ptr<Mapping> mapFd(int fd, const std::string& name, size_t size, PoolError* err) {
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    *err = {"TRANSFER_SYSTEM", sys("mmap", name)};
    return nullptr;
  }
  return std::make_shared<Mapping>(name, static_cast<uint8_t*>(base), size);
}

}  // namespace

Mapping::~Mapping() { munmap(base_, size_); }

std::shared_ptr<Mapping> createPool(const std::string& name, uint32_t pages, uint64_t pageBytes, bool replace,
                                    PoolError* err) {
  if (replace) {
    // Retire the old region first, so transfers still aimed at it fail their epoch check.
    PoolError ignored;
    if (auto old = openPool(name, &ignored)) {
      __atomic_store_n(&reinterpret_cast<PoolHeader*>(old->base())->retired, 1u, __ATOMIC_RELEASE);
    }
    shm_unlink(name.c_str());
  }
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    *err = {errno == EEXIST ? "TRANSFER_POOL_EXISTS" : "TRANSFER_SYSTEM", sys("shm_open", name)};
    return nullptr;
  }
  size_t size = kHeaderBytes + static_cast<size_t>(pages) * pageBytes;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    *err = {"TRANSFER_SYSTEM", sys("ftruncate", name)};
    close(fd);
    shm_unlink(name.c_str());
    return nullptr;
  }
  auto m = mapFd(fd, name, size, err);
  close(fd);
  if (!m) {
    shm_unlink(name.c_str());
    return nullptr;
  }
  auto* h = reinterpret_cast<PoolHeader*>(m->base());
  h->version = kPoolVersion;
  h->pages = pages;
  h->pageBytes = pageBytes;
  h->epoch = newEpoch();
  h->retired = 0;
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
  auto m = mapFd(fd, name, static_cast<size_t>(st.st_size), err);
  close(fd);
  if (!m) return nullptr;
  const PoolHeader& h = m->header();
  uint64_t expected = kHeaderBytes + static_cast<uint64_t>(h.pages) * h.pageBytes;
  if (std::memcmp(h.magic, kPoolMagic, sizeof kPoolMagic) != 0 || h.version != kPoolVersion ||
      h.pageBytes == 0 || expected != static_cast<uint64_t>(st.st_size)) {
    *err = {"TRANSFER_POOL_CORRUPT", "shared memory " + name + " is not a pdctl pool of version 1"};
    return nullptr;
  }
  return m;
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
