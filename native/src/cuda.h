// The CUDA runtime, loaded at run time with dlopen: nothing links against CUDA and no CUDA header
// is needed to build, so the addon builds and runs on machines without a GPU. The few runtime
// entry points the transfer core uses are declared here with the ABI that libcudart has kept
// stable since CUDA 4 (int error codes, opaque stream pointers, a 64-byte IPC handle).
//
// Which library: $PDCTL_CUDART when set (a path, for a runtime outside the loader's path or for
// the test runtime in native/test/), else libcudart.so, .so.13, .so.12. It is loaded once per
// process, on first use; `cudaRuntime()` is null when there is no library, a symbol is missing or
// no device answers, and `cudaUnavailableReason()` then says which.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace pdctl {

constexpr int kCudaSuccess = 0;
constexpr int kCudaErrorNotReady = 600;  // cudaStreamQuery: work still pending
constexpr int kCudaMemcpyDefault = 4;    // direction from the pointers (unified addressing)
constexpr int kCudaStreamNonBlocking = 1;
constexpr unsigned kCudaIpcMemLazyEnablePeerAccess = 1;

struct CudaIpcHandle {
  char reserved[64];
};
using CudaStream = void*;

struct CudaRuntime {
  std::string library;  // what was loaded, for backends()
  int devices = 0;

  int (*getDeviceCount)(int*);
  int (*setDevice)(int);
  int (*malloc)(void**, size_t);
  int (*free)(void*);
  int (*mallocHost)(void**, size_t);
  int (*freeHost)(void*);
  int (*memcpy)(void*, const void*, size_t, int);
  int (*memcpyAsync)(void*, const void*, size_t, int, CudaStream);
  int (*streamCreateWithFlags)(CudaStream*, unsigned);
  int (*streamDestroy)(CudaStream);
  int (*streamQuery)(CudaStream);
  int (*streamSynchronize)(CudaStream);
  int (*ipcGetMemHandle)(CudaIpcHandle*, void*);
  int (*ipcOpenMemHandle)(void**, CudaIpcHandle, unsigned);
  int (*ipcCloseMemHandle)(void*);
  const char* (*getErrorString)(int);

  // "cudaMalloc: out of memory (2)" from a call's name and its return code.
  std::string error(const char* call, int rc) const;
};

const CudaRuntime* cudaRuntime();
// Why cudaRuntime() is null ("" when it is not).
const std::string& cudaUnavailableReason();

// A stream of one device for the calling thread, created on first use and kept for the thread's
// life; null (with *err) when it cannot be created. It also makes that device current.
CudaStream threadStream(int device, std::string* err);
// A pinned host buffer of at least `bytes` for the calling thread, kept for the thread's life;
// null (with *err) when it cannot be allocated.
uint8_t* threadStaging(size_t bytes, std::string* err);

}  // namespace pdctl
