#include "cuda.h"

#include <dlfcn.h>

#include <cstdlib>
#include <unordered_map>

namespace pdctl {
namespace {

struct Loaded {
  CudaRuntime runtime;
  bool ok = false;
  std::string reason;
};

template <typename Fn>
bool bind(void* lib, const char* name, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (!*out && missing->empty()) *missing = name;
  return *out != nullptr;
}

Loaded load() {
  Loaded l;
  void* lib = nullptr;
  std::string tried;
  if (const char* path = std::getenv("PDCTL_CUDART"); path && *path) {
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    tried = path;
    if (!lib) {
      const char* why = dlerror();
      l.reason = "PDCTL_CUDART=" + tried + " could not be loaded: " + (why ? why : "unknown error");
      return l;
    }
  } else {
    for (const char* name : {"libcudart.so", "libcudart.so.13", "libcudart.so.12"}) {
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) {
        tried = name;
        break;
      }
    }
    if (!lib) {
      l.reason = "libcudart not found (set PDCTL_CUDART to its path, or add its folder to LD_LIBRARY_PATH)";
      return l;
    }
  }
  // The library stays loaded for the life of the process: streams and IPC mappings made through
  // it live in worker threads and pool mappings that may outlast any one caller.
  CudaRuntime& r = l.runtime;
  r.library = tried;
  std::string missing;
  bind(lib, "cudaGetDeviceCount", &r.getDeviceCount, &missing);
  bind(lib, "cudaSetDevice", &r.setDevice, &missing);
  bind(lib, "cudaMalloc", &r.malloc, &missing);
  bind(lib, "cudaFree", &r.free, &missing);
  bind(lib, "cudaMallocHost", &r.mallocHost, &missing);
  bind(lib, "cudaFreeHost", &r.freeHost, &missing);
  bind(lib, "cudaMemcpy", &r.memcpy, &missing);
  bind(lib, "cudaMemcpyAsync", &r.memcpyAsync, &missing);
  bind(lib, "cudaStreamCreateWithFlags", &r.streamCreateWithFlags, &missing);
  bind(lib, "cudaStreamDestroy", &r.streamDestroy, &missing);
  bind(lib, "cudaStreamQuery", &r.streamQuery, &missing);
  bind(lib, "cudaStreamSynchronize", &r.streamSynchronize, &missing);
  bind(lib, "cudaIpcGetMemHandle", &r.ipcGetMemHandle, &missing);
  bind(lib, "cudaIpcOpenMemHandle", &r.ipcOpenMemHandle, &missing);
  bind(lib, "cudaIpcCloseMemHandle", &r.ipcCloseMemHandle, &missing);
  bind(lib, "cudaGetErrorString", &r.getErrorString, &missing);
  if (!missing.empty()) {
    l.reason = tried + " has no " + missing;
    return l;
  }
  int rc = r.getDeviceCount(&r.devices);
  if (rc != kCudaSuccess) {
    l.reason = r.error("cudaGetDeviceCount", rc) + " (no device or no driver)";
    return l;
  }
  if (r.devices <= 0) {
    l.reason = tried + " loaded, but it sees no device";
    return l;
  }
  l.ok = true;
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();  // thread-safe once (C++11)
  return l;
}

// The calling thread's streams, one per device, destroyed when the thread ends.
struct ThreadStreams {
  std::unordered_map<int, CudaStream> byDevice;
  ~ThreadStreams() {
    if (const CudaRuntime* r = cudaRuntime()) {
      for (auto& [device, stream] : byDevice) {
        r->setDevice(device);
        r->streamDestroy(stream);
      }
    }
  }
};

struct ThreadStaging {
  void* ptr = nullptr;
  size_t bytes = 0;
  ~ThreadStaging() {
    if (const CudaRuntime* r = cudaRuntime(); r && ptr) r->freeHost(ptr);
  }
};

}  // namespace

std::string CudaRuntime::error(const char* call, int rc) const {
  const char* text = getErrorString ? getErrorString(rc) : nullptr;
  return std::string(call) + ": " + (text ? text : "error") + " (" + std::to_string(rc) + ")";
}

const CudaRuntime* cudaRuntime() { return loaded().ok ? &loaded().runtime : nullptr; }

const std::string& cudaUnavailableReason() { return loaded().reason; }

CudaStream threadStream(int device, std::string* err) {
  const CudaRuntime* r = cudaRuntime();
  if (!r) {
    *err = cudaUnavailableReason();
    return nullptr;
  }
  thread_local ThreadStreams streams;
  int rc = r->setDevice(device);
  if (rc != kCudaSuccess) {
    *err = r->error("cudaSetDevice", rc);
    return nullptr;
  }
  if (auto it = streams.byDevice.find(device); it != streams.byDevice.end()) return it->second;
  CudaStream s = nullptr;
  rc = r->streamCreateWithFlags(&s, kCudaStreamNonBlocking);
  if (rc != kCudaSuccess) {
    *err = r->error("cudaStreamCreateWithFlags", rc);
    return nullptr;
  }
  streams.byDevice[device] = s;
  return s;
}

uint8_t* threadStaging(size_t bytes, std::string* err) {
  const CudaRuntime* r = cudaRuntime();
  if (!r) {
    *err = cudaUnavailableReason();
    return nullptr;
  }
  thread_local ThreadStaging staging;
  if (staging.bytes >= bytes) return static_cast<uint8_t*>(staging.ptr);
  if (staging.ptr) r->freeHost(staging.ptr);
  staging.ptr = nullptr;
  staging.bytes = 0;
  int rc = r->mallocHost(&staging.ptr, bytes);
  if (rc != kCudaSuccess) {
    staging.ptr = nullptr;
    *err = r->error("cudaMallocHost", rc);
    return nullptr;
  }
  staging.bytes = bytes;
  return static_cast<uint8_t*>(staging.ptr);
}

}  // namespace pdctl
