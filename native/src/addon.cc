// The addon's JavaScript surface. Arguments are validated in TypeScript first
// (src/transfer/pool.ts, src/transfer/core.ts); the checks here only keep a wrong call from crashing the process.
// Everything runs on the JS thread; the pool mappings are shared with page views (see pool.h).
#include <napi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include "crc32c.h"
#include "cuda.h"
#include "pool.h"
#include "transfer.h"
#include "ucx.h"

namespace {

using pdctl::Mapping;
using Holder = std::shared_ptr<Mapping>;  // empty once the pool handle is closed

[[noreturn]] void throwCoded(const Napi::Env& env, const std::string& code, const std::string& message) {
  Napi::Error e = Napi::Error::New(env, message);
  e.Set("code", Napi::String::New(env, code));
  throw e;
}

void need(const Napi::CallbackInfo& info, size_t count) {
  if (info.Length() < count) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "too few arguments");
}

uint64_t uintArg(const Napi::CallbackInfo& info, size_t i, uint64_t max, const char* what) {
  if (!info[i].IsNumber()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", std::string(what) + " must be a number");
  double v = info[i].As<Napi::Number>().DoubleValue();
  if (!(v >= 0) || v > static_cast<double>(max) || v != static_cast<double>(static_cast<uint64_t>(v))) {
    throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", std::string(what) + " is out of range");
  }
  return static_cast<uint64_t>(v);
}

std::string nameArg(const Napi::CallbackInfo& info, size_t i) {
  if (!info[i].IsString()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "pool name must be a string");
  return info[i].As<Napi::String>().Utf8Value();
}

Napi::Value wrap(Napi::Env env, Holder mapping) {
  return Napi::External<Holder>::New(env, new Holder(std::move(mapping)),
                                     [](Napi::Env, Holder* h) { delete h; });
}

const Holder& held(const Napi::CallbackInfo& info, size_t i) {
  if (!info[i].IsExternal()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "not a pool handle");
  Holder* h = info[i].As<Napi::External<Holder>>().Data();
  if (!*h) throwCoded(info.Env(), "TRANSFER_POOL_CLOSED", "the pool is closed");
  return *h;
}

Napi::Value fail(const Napi::Env& env, const pdctl::PoolError& err) { throwCoded(env, err.code, err.message); }

Napi::Value PoolCreate(const Napi::CallbackInfo& info) {
  need(info, 5);
  std::string name = nameArg(info, 0);
  auto pages = static_cast<uint32_t>(uintArg(info, 1, 0xFFFFFFFFu, "pages"));
  uint64_t pageBytes = uintArg(info, 2, uint64_t{1} << 40, "pageBytes");
  bool replace = info[3].ToBoolean();
  // -1: host shared memory; otherwise a CUDA device ordinal.
  int device = info[4].IsNull() ? -1 : static_cast<int>(uintArg(info, 4, 1023, "device"));
  pdctl::PoolError err;
  auto m = pdctl::createPool(name, pages, pageBytes, device, replace, &err);
  if (!m) return fail(info.Env(), err);
  return wrap(info.Env(), std::move(m));
}

Napi::Value PoolOpen(const Napi::CallbackInfo& info) {
  need(info, 1);
  pdctl::PoolError err;
  auto m = pdctl::openPool(nameArg(info, 0), &err);
  if (!m) return fail(info.Env(), err);
  return wrap(info.Env(), std::move(m));
}

Napi::Value PoolInfo(const Napi::CallbackInfo& info) {
  need(info, 1);
  const Holder& m = held(info, 0);
  const auto& h = m->header();
  Napi::Object o = Napi::Object::New(info.Env());
  o.Set("name", m->name());
  o.Set("pages", Napi::Number::New(info.Env(), h.pages));
  o.Set("pageBytes", Napi::Number::New(info.Env(), static_cast<double>(h.pageBytes)));
  o.Set("epoch", Napi::Number::New(info.Env(), static_cast<double>(h.epoch)));
  o.Set("createdMs", Napi::Number::New(info.Env(), static_cast<double>(h.createdMs)));
  o.Set("device", m->onDevice() ? Napi::Number::New(info.Env(), m->device()) : info.Env().Null());
  return o;
}

// A view of one page, without copying. The view keeps the mapping alive (see pool.h).
Napi::Value PoolPage(const Napi::CallbackInfo& info) {
  need(info, 2);
  const Holder& m = held(info, 0);
  auto index = static_cast<uint32_t>(uintArg(info, 1, 0xFFFFFFFFu, "page index"));
  if (index >= m->header().pages) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "page index out of range");
  if (m->onDevice()) {
    throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "pool " + m->name() + " is in GPU memory: its pages cannot be viewed, only read or written");
  }
  auto* keep = new Holder(m);
  return Napi::ArrayBuffer::New(
      info.Env(), m->page(index), m->header().pageBytes, [](Napi::Env, void*, Holder* h) { delete h; }, keep);
}

Napi::Value PoolChecksum(const Napi::CallbackInfo& info) {
  need(info, 3);
  const Holder& m = held(info, 0);
  uint64_t first = uintArg(info, 1, 0xFFFFFFFFu, "first page");
  uint64_t count = uintArg(info, 2, 0xFFFFFFFFu, "page count");
  if (first + count > m->header().pages) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "page range out of range");
  uint32_t crc = 0;
  pdctl::PoolError err;
  if (!pdctl::crcPages(*m, static_cast<uint32_t>(first), count, &crc, &err)) return fail(info.Env(), err);
  return Napi::Number::New(info.Env(), crc);
}

Napi::Uint32Array pageListArg(const Napi::CallbackInfo& info, size_t i) {
  if (!info[i].IsTypedArray() || info[i].As<Napi::TypedArray>().TypedArrayType() != napi_uint32_array) {
    throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "pages must be a Uint32Array");
  }
  return info[i].As<Napi::Uint32Array>();
}

// CRC32C over a list of pages in order: what the destination checks a transfer against.
Napi::Value PoolChecksumPages(const Napi::CallbackInfo& info) {
  need(info, 2);
  const Holder& m = held(info, 0);
  auto pages = pageListArg(info, 1);
  uint32_t crc = 0;
  pdctl::PoolError err;
  for (size_t i = 0; i < pages.ElementLength(); i++) {
    if (pages[i] >= m->header().pages) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "page index out of range");
    if (!pdctl::crcPages(*m, pages[i], 1, &crc, &err)) return fail(info.Env(), err);
  }
  return Napi::Number::New(info.Env(), crc);
}

// Bytes from page `first` on, copied to or from a Uint8Array: how JavaScript reaches the pages of
// a device pool (and any pool, with a copy).
Napi::Value PoolCopy(const Napi::CallbackInfo& info, bool write) {
  need(info, 3);
  const Holder& m = held(info, 0);
  uint64_t first = uintArg(info, 1, 0xFFFFFFFFu, "first page");
  if (!info[2].IsTypedArray() || info[2].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
    throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "data must be a Uint8Array");
  }
  auto data = info[2].As<Napi::Uint8Array>();
  const auto& h = m->header();
  if (first >= h.pages || data.ByteLength() > (h.pages - first) * h.pageBytes) {
    throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "the bytes run past the pool's last page");
  }
  pdctl::PoolError err;
  auto page = static_cast<uint32_t>(first);
  bool ok = write ? pdctl::writePages(*m, page, data.Data(), data.ByteLength(), &err)
                  : pdctl::readPages(*m, page, data.ByteLength(), data.Data(), &err);
  if (!ok) return fail(info.Env(), err);
  return info.Env().Undefined();
}

Napi::Value PoolRead(const Napi::CallbackInfo& info) { return PoolCopy(info, false); }
Napi::Value PoolWrite(const Napi::CallbackInfo& info) { return PoolCopy(info, true); }

Napi::Value PoolClose(const Napi::CallbackInfo& info) {
  need(info, 1);
  if (!info[0].IsExternal()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "not a pool handle");
  info[0].As<Napi::External<Holder>>().Data()->reset();
  return info.Env().Undefined();
}

Napi::Value PoolUnlink(const Napi::CallbackInfo& info) {
  need(info, 1);
  bool existed = false;
  pdctl::PoolError err;
  if (!pdctl::unlinkPool(nameArg(info, 0), &existed, &err)) return fail(info.Env(), err);
  return Napi::Boolean::New(info.Env(), existed);
}

Napi::Value Crc32c(const Napi::CallbackInfo& info) {
  need(info, 2);
  if (!info[0].IsTypedArray()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "crc32c needs a Uint8Array");
  auto a = info[0].As<Napi::Uint8Array>();
  bool software = info[1].ToBoolean();
  uint32_t crc = software ? pdctl::crc32cSoftware(0, a.Data(), a.ByteLength()) : pdctl::crc32c(0, a.Data(), a.ByteLength());
  return Napi::Number::New(info.Env(), crc);
}

// The baseline of bench:transfer: a bare memcpy of the first `bytes` of one pool into another,
// `rounds` times, on this thread; a synchronous cudaMemcpy when either pool is on a device.
// Returns nanoseconds.
Napi::Value MemcpyNanos(const Napi::CallbackInfo& info) {
  need(info, 4);
  const Holder& src = held(info, 0);
  const Holder& dst = held(info, 1);
  uint64_t bytes = uintArg(info, 2, uint64_t{1} << 40, "bytes");
  uint64_t rounds = uintArg(info, 3, 1u << 20, "rounds");
  uint64_t limit = std::min(src->header().pages * src->header().pageBytes, dst->header().pages * dst->header().pageBytes);
  if (bytes > limit) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "bytes exceed the pools");
  const pdctl::CudaRuntime* cuda = nullptr;
  if (src->onDevice() || dst->onDevice()) {
    if (!(cuda = pdctl::cudaRuntime())) throwCoded(info.Env(), "TRANSFER_BACKEND_UNAVAILABLE", pdctl::cudaUnavailableReason());
    cuda->setDevice(dst->onDevice() ? dst->device() : src->device());
  }
  auto t0 = std::chrono::steady_clock::now();
  for (uint64_t r = 0; r < rounds; r++) {
    if (!cuda) {
      std::memcpy(dst->page(0), src->page(0), bytes);
    } else if (int rc = cuda->memcpy(dst->page(0), src->page(0), bytes, pdctl::kCudaMemcpyDefault); rc != pdctl::kCudaSuccess) {
      throwCoded(info.Env(), "TRANSFER_SYSTEM", cuda->error("cudaMemcpy", rc));
    }
  }
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  return Napi::Number::New(info.Env(), static_cast<double>(ns));
}

// What is available: shared memory always; CUDA only if libcudart loads and sees a device.
Napi::Value Backends(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object cuda = Napi::Object::New(env);
  const pdctl::CudaRuntime* r = pdctl::cudaRuntime();
  cuda.Set("available", r != nullptr);
  cuda.Set("reason", r ? r->library + ": " + std::to_string(r->devices) + " device(s)" : pdctl::cudaUnavailableReason());
  cuda.Set("devices", Napi::Number::New(env, r ? r->devices : 0));
  Napi::Object o = Napi::Object::New(env);
  o.Set("shm", true);
  o.Set("crc32cHardware", pdctl::crc32cHardware());
  o.Set("cuda", cuda);
  return o;
}

// The network backend: whether UCX loads here (it is loaded by this call, and only by a process
// that asks: a process that never moves KV across hosts never has UCX in it).
Napi::Value UcxBackend(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string reason, version;
  bool ok = pdctl::ucxAvailable(&reason, &version);
  Napi::Object ucx = Napi::Object::New(env);
  ucx.Set("available", ok);
  ucx.Set("reason", ok ? "UCX " + version : reason);
  ucx.Set("version", ok ? Napi::String::New(env, version) : env.Null());
  return ucx;
}

// ---- transfers ----------------------------------------------------------------------------

struct WorkersHolder {
  std::unique_ptr<pdctl::TransferWorkers> workers;
  Napi::ThreadSafeFunction tsfn;
  int inFlight = 0;      // JS thread only: the tsfn keeps the event loop alive while > 0
  bool closed = false;   // JS thread only
};

Napi::Object resultObject(Napi::Env env, const pdctl::TransferResult& r) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("id", Napi::Number::New(env, static_cast<double>(r.id)));
  o.Set("room", r.room);
  o.Set("status", r.status);
  o.Set("bytes", Napi::Number::New(env, static_cast<double>(r.bytes)));
  o.Set("micros", Napi::Number::New(env, static_cast<double>(r.micros)));
  o.Set("checksum", Napi::Number::New(env, r.checksum));
  o.Set("error", r.error.empty() ? env.Null() : Napi::String::New(env, r.error));
  return o;
}

// Shared by the JS handle and the thread-safe function: whichever goes last frees the holder.
using WorkersRef = std::shared_ptr<WorkersHolder>;

// Runs on the JS thread for every completion.
void settled(WorkersHolder* h, Napi::Env env) {
  if (--h->inFlight == 0 && !h->closed) h->tsfn.Unref(env);
}

WorkersHolder* workersArg(const Napi::CallbackInfo& info, size_t i) {
  if (!info[i].IsExternal()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "not a transfer workers handle");
  WorkersHolder* h = info[i].As<Napi::External<WorkersRef>>().Data()->get();
  if (h->closed) throwCoded(info.Env(), "TRANSFER_WORKERS_CLOSED", "the transfer workers are closed");
  return h;
}

Napi::Value WorkersCreate(const Napi::CallbackInfo& info) {
  need(info, 2);
  auto threads = static_cast<unsigned>(uintArg(info, 0, 64, "threads"));
  if (threads == 0) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "threads must be at least 1");
  if (!info[1].IsFunction()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "onComplete must be a function");
  auto shared = std::make_shared<WorkersHolder>();
  WorkersHolder* h = shared.get();
  h->tsfn = Napi::ThreadSafeFunction::New(info.Env(), info[1].As<Napi::Function>(), "pdctl-transfer", 0, 1,
                                          [](Napi::Env, WorkersRef* ref) { delete ref; }, new WorkersRef(shared));
  h->tsfn.Unref(info.Env());
  h->workers = std::make_unique<pdctl::TransferWorkers>(threads, [h](pdctl::TransferResult r) {
    // Worker thread: hand the result to the JS thread. The queue is unbounded, so this never blocks.
    h->tsfn.NonBlockingCall(new pdctl::TransferResult(std::move(r)),
                            [h](Napi::Env env, Napi::Function cb, pdctl::TransferResult* data) {
                              std::unique_ptr<pdctl::TransferResult> owned(data);
                              settled(h, env);
                              cb.Call({resultObject(env, *owned)});
                            });
  });
  return Napi::External<WorkersRef>::New(info.Env(), new WorkersRef(shared), [](Napi::Env, WorkersRef* ref) {
    // Collected without close(): stop the workers and let the thread-safe function go.
    WorkersHolder* holder = ref->get();
    if (!holder->closed) {
      holder->workers->shutdown();
      holder->closed = true;
      holder->tsfn.Release();
    }
    delete ref;
  });
}

Napi::Value WorkersPost(const Napi::CallbackInfo& info) {
  need(info, 8);
  WorkersHolder* h = workersArg(info, 0);
  uint64_t id = uintArg(info, 1, uint64_t{1} << 53, "id");
  if (!info[2].IsString()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "room must be a string");
  std::string room = info[2].As<Napi::String>().Utf8Value();
  const Holder& src = held(info, 3);
  const Holder& dst = held(info, 4);
  if (!info[5].IsTypedArray() || info[5].As<Napi::TypedArray>().TypedArrayType() != napi_uint32_array) {
    throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "pairs must be a Uint32Array of [src, dst, src, dst, ...]");
  }
  auto flat = info[5].As<Napi::Uint32Array>();
  if (flat.ElementLength() % 2 != 0) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "pairs must have an even length");
  std::vector<std::pair<uint32_t, uint32_t>> pairs;
  pairs.reserve(flat.ElementLength() / 2);
  for (size_t i = 0; i < flat.ElementLength(); i += 2) {
    uint32_t s = flat[i], d = flat[i + 1];
    if (s >= src->header().pages || d >= dst->header().pages) {
      throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "a page pair is out of range");
    }
    pairs.emplace_back(s, d);
  }
  uint64_t epoch = uintArg(info, 6, uint64_t{1} << 53, "epoch");
  auto deadlineMs = static_cast<uint32_t>(uintArg(info, 7, 24u * 3600u * 1000u, "deadlineMs"));
  pdctl::TransferResult immediate;
  if (!h->workers->post(id, std::move(room), src, dst, std::move(pairs), epoch, deadlineMs, &immediate)) {
    return resultObject(info.Env(), immediate);
  }
  if (h->inFlight++ == 0) h->tsfn.Ref(info.Env());
  return info.Env().Null();
}

Napi::Value WorkersCancel(const Napi::CallbackInfo& info) {
  need(info, 2);
  WorkersHolder* h = workersArg(info, 0);
  if (!info[1].IsString()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "room must be a string");
  return Napi::Number::New(info.Env(), h->workers->cancel(info[1].As<Napi::String>().Utf8Value()));
}

// (handle, room, kind, ms) → the fault; arguments 1 to 3.
pdctl::Fault faultArgs(const Napi::CallbackInfo& info) {
  if (!info[1].IsString() || !info[2].IsString()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "room and kind must be strings");
  std::string kind = info[2].As<Napi::String>().Utf8Value();
  pdctl::Fault f;
  if (kind == "stall") f.kind = pdctl::FaultKind::Stall;
  else if (kind == "delay") f.kind = pdctl::FaultKind::Delay;
  else if (kind == "corrupt") f.kind = pdctl::FaultKind::Corrupt;
  else if (kind == "fail") f.kind = pdctl::FaultKind::Fail;
  else if (kind == "none") f.kind = pdctl::FaultKind::None;
  else throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "unknown fault kind " + kind);
  f.ms = static_cast<uint32_t>(uintArg(info, 3, 3600u * 1000u, "ms"));
  return f;
}

Napi::Value WorkersInject(const Napi::CallbackInfo& info) {
  need(info, 4);
  WorkersHolder* h = workersArg(info, 0);
  pdctl::Fault f = faultArgs(info);
  h->workers->inject(info[1].As<Napi::String>().Utf8Value(), f);
  return info.Env().Undefined();
}

Napi::Value WorkersClearFaults(const Napi::CallbackInfo& info) {
  need(info, 1);
  workersArg(info, 0)->workers->clearFaults();
  return info.Env().Undefined();
}

Napi::Value WorkersStats(const Napi::CallbackInfo& info) {
  need(info, 1);
  pdctl::TransferStats s = workersArg(info, 0)->workers->stats();
  Napi::Env env = info.Env();
  Napi::Object o = Napi::Object::New(env);
  o.Set("bytes", Napi::Number::New(env, static_cast<double>(s.bytes)));
  o.Set("queued", Napi::Number::New(env, static_cast<double>(s.queued)));
  o.Set("running", Napi::Number::New(env, static_cast<double>(s.running)));
  o.Set("ok", Napi::Number::New(env, static_cast<double>(s.ok)));
  o.Set("cancelled", Napi::Number::New(env, static_cast<double>(s.cancelled)));
  o.Set("stalled", Napi::Number::New(env, static_cast<double>(s.stalled)));
  o.Set("epochMismatch", Napi::Number::New(env, static_cast<double>(s.epochMismatch)));
  o.Set("failed", Napi::Number::New(env, static_cast<double>(s.failed)));
  return o;
}

// Cancels what is queued or running and joins the workers; their completions still arrive
// (as `cancelled`) before the thread-safe function is released.
Napi::Value WorkersClose(const Napi::CallbackInfo& info) {
  need(info, 1);
  if (!info[0].IsExternal()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "not a transfer workers handle");
  WorkersHolder* h = info[0].As<Napi::External<WorkersRef>>().Data()->get();
  if (h->closed) return info.Env().Undefined();
  h->workers->shutdown();
  h->closed = true;
  h->tsfn.Release();
  return info.Env().Undefined();
}

// ---- UCX: a room's pages to a pool on another host, as tagged messages ---------------------------------------------------

struct UcxHolder {
  std::unique_ptr<pdctl::UcxNode> node;
  Napi::ThreadSafeFunction tsfn;
  int inFlight = 0;     // JS thread only
  bool closed = false;  // JS thread only
};
using UcxRef = std::shared_ptr<UcxHolder>;

UcxHolder* ucxArg(const Napi::CallbackInfo& info, size_t i) {
  if (!info[i].IsExternal()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "not a UCX node handle");
  UcxHolder* h = info[i].As<Napi::External<UcxRef>>().Data()->get();
  if (h->closed) throwCoded(info.Env(), "TRANSFER_WORKERS_CLOSED", "the UCX node is closed");
  return h;
}

std::string bytesArg(const Napi::CallbackInfo& info, size_t i, const char* what) {
  if (!info[i].IsBuffer()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", std::string(what) + " must be a Buffer");
  auto b = info[i].As<Napi::Buffer<uint8_t>>();
  if (b.Length() == 0 || b.Length() > 65536) {
    throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", std::string(what) + " must be 1 to 65536 bytes");
  }
  return std::string(reinterpret_cast<const char*>(b.Data()), b.Length());
}

void ucxClose(UcxHolder* h) {
  if (h->closed) return;
  h->node->shutdown();
  h->closed = true;
  h->tsfn.Release();
}

Napi::Value UcxCreate(const Napi::CallbackInfo& info) {
  need(info, 1);
  if (!info[0].IsFunction()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "onComplete must be a function");
  auto shared = std::make_shared<UcxHolder>();
  UcxHolder* h = shared.get();
  h->tsfn = Napi::ThreadSafeFunction::New(info.Env(), info[0].As<Napi::Function>(), "pdctl-ucx", 0, 1,
                                          [](Napi::Env, UcxRef* ref) { delete ref; }, new UcxRef(shared));
  h->tsfn.Unref(info.Env());
  try {
    h->node = std::make_unique<pdctl::UcxNode>([h](pdctl::TransferResult r) {
      h->tsfn.NonBlockingCall(new pdctl::TransferResult(std::move(r)),
                              [h](Napi::Env env, Napi::Function cb, pdctl::TransferResult* data) {
                                std::unique_ptr<pdctl::TransferResult> owned(data);
                                if (--h->inFlight == 0 && !h->closed) h->tsfn.Unref(env);
                                cb.Call({resultObject(env, *owned)});
                              });
    });
  } catch (const std::exception& e) {
    h->closed = true;
    h->tsfn.Release();
    throwCoded(info.Env(), "TRANSFER_BACKEND_UNAVAILABLE", e.what());
  }
  return Napi::External<UcxRef>::New(info.Env(), new UcxRef(shared), [](Napi::Env, UcxRef* ref) {
    ucxClose(ref->get());
    delete ref;
  });
}

Napi::Value UcxAddress(const Napi::CallbackInfo& info) {
  need(info, 1);
  const std::string& a = ucxArg(info, 0)->node->address();
  return Napi::Buffer<uint8_t>::Copy(info.Env(), reinterpret_cast<const uint8_t*>(a.data()), a.size());
}

// The pages of a send or receive: each in range, none twice (a message writes each page once).
std::vector<uint32_t> ucxPagesArg(const Napi::CallbackInfo& info, size_t i, const pdctl::Mapping& pool) {
  auto list = pageListArg(info, i);
  std::vector<uint32_t> pages(list.ElementLength());
  std::vector<bool> seen(pool.header().pages, false);
  for (size_t k = 0; k < pages.size(); k++) {
    uint32_t p = list[k];
    if (p >= pool.header().pages) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "a page is out of range");
    if (seen[p]) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "a page is named twice");
    seen[p] = true;
    pages[k] = p;
  }
  if (pages.empty()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "no pages");
  return pages;
}

// ucxPost(node, id, room, epoch, srcPool, address, pages, deadlineMs)
Napi::Value UcxPost(const Napi::CallbackInfo& info) {
  need(info, 8);
  UcxHolder* h = ucxArg(info, 0);
  uint64_t id = uintArg(info, 1, uint64_t{1} << 53, "id");
  if (!info[2].IsString()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "room must be a string");
  std::string room = info[2].As<Napi::String>().Utf8Value();
  uint64_t epoch = uintArg(info, 3, uint64_t{1} << 53, "epoch");
  const Holder& src = held(info, 4);
  std::string address = bytesArg(info, 5, "the peer's worker address");
  std::vector<uint32_t> pages = ucxPagesArg(info, 6, *src);
  auto deadlineMs = static_cast<uint32_t>(uintArg(info, 7, 24u * 3600u * 1000u, "deadlineMs"));
  h->node->post(id, std::move(room), epoch, src, std::move(address), std::move(pages), deadlineMs);
  if (h->inFlight++ == 0) h->tsfn.Ref(info.Env());
  return info.Env().Null();
}

// ucxReceive(node, id, room, epoch, dstPool, pages)
Napi::Value UcxReceive(const Napi::CallbackInfo& info) {
  need(info, 6);
  UcxHolder* h = ucxArg(info, 0);
  uint64_t id = uintArg(info, 1, uint64_t{1} << 53, "id");
  if (!info[2].IsString()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "room must be a string");
  std::string room = info[2].As<Napi::String>().Utf8Value();
  uint64_t epoch = uintArg(info, 3, uint64_t{1} << 53, "epoch");
  const Holder& dst = held(info, 4);
  if (dst->onDevice()) {
    throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "UCX receives into a device pool are not supported");
  }
  std::vector<uint32_t> pages = ucxPagesArg(info, 5, *dst);
  h->node->receive(id, std::move(room), epoch, dst, std::move(pages));
  if (h->inFlight++ == 0) h->tsfn.Ref(info.Env());
  return info.Env().Null();
}

Napi::Value UcxCancel(const Napi::CallbackInfo& info) {
  need(info, 2);
  UcxHolder* h = ucxArg(info, 0);
  if (!info[1].IsString()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "room must be a string");
  return Napi::Number::New(info.Env(), h->node->cancel(info[1].As<Napi::String>().Utf8Value()));
}

Napi::Value UcxInject(const Napi::CallbackInfo& info) {
  need(info, 4);
  UcxHolder* h = ucxArg(info, 0);
  pdctl::Fault f = faultArgs(info);
  h->node->inject(info[1].As<Napi::String>().Utf8Value(), f);
  return info.Env().Undefined();
}

// ucxCheckPeer(address): null when an endpoint to it can be made; else why. May abort the process
// on a malformed address (UCX does): call it only in a throwaway process.
Napi::Value UcxCheckPeer(const Napi::CallbackInfo& info) {
  need(info, 1);
  std::string address = bytesArg(info, 0, "the peer's worker address");
  std::string error;
  if (pdctl::ucxCheckPeer(address, &error)) return info.Env().Null();
  return Napi::String::New(info.Env(), error);
}

Napi::Value UcxClearFaults(const Napi::CallbackInfo& info) {
  need(info, 1);
  ucxArg(info, 0)->node->clearFaults();
  return info.Env().Undefined();
}

Napi::Value UcxClose(const Napi::CallbackInfo& info) {
  need(info, 1);
  if (!info[0].IsExternal()) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "not a UCX node handle");
  ucxClose(info[0].As<Napi::External<UcxRef>>().Data()->get());
  return info.Env().Undefined();
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("ucxBackend", Napi::Function::New(env, UcxBackend));
  exports.Set("ucxCreate", Napi::Function::New(env, UcxCreate));
  exports.Set("ucxAddress", Napi::Function::New(env, UcxAddress));
  exports.Set("ucxPost", Napi::Function::New(env, UcxPost));
  exports.Set("ucxReceive", Napi::Function::New(env, UcxReceive));
  exports.Set("ucxCancel", Napi::Function::New(env, UcxCancel));
  exports.Set("ucxInject", Napi::Function::New(env, UcxInject));
  exports.Set("ucxClearFaults", Napi::Function::New(env, UcxClearFaults));
  exports.Set("ucxCheckPeer", Napi::Function::New(env, UcxCheckPeer));
  exports.Set("ucxClose", Napi::Function::New(env, UcxClose));
  exports.Set("poolCreate", Napi::Function::New(env, PoolCreate));
  exports.Set("poolOpen", Napi::Function::New(env, PoolOpen));
  exports.Set("poolInfo", Napi::Function::New(env, PoolInfo));
  exports.Set("poolPage", Napi::Function::New(env, PoolPage));
  exports.Set("poolChecksum", Napi::Function::New(env, PoolChecksum));
  exports.Set("poolChecksumPages", Napi::Function::New(env, PoolChecksumPages));
  exports.Set("poolRead", Napi::Function::New(env, PoolRead));
  exports.Set("poolWrite", Napi::Function::New(env, PoolWrite));
  exports.Set("poolClose", Napi::Function::New(env, PoolClose));
  exports.Set("poolUnlink", Napi::Function::New(env, PoolUnlink));
  exports.Set("crc32c", Napi::Function::New(env, Crc32c));
  exports.Set("backends", Napi::Function::New(env, Backends));
  exports.Set("memcpyNanos", Napi::Function::New(env, MemcpyNanos));
  exports.Set("workersCreate", Napi::Function::New(env, WorkersCreate));
  exports.Set("workersPost", Napi::Function::New(env, WorkersPost));
  exports.Set("workersCancel", Napi::Function::New(env, WorkersCancel));
  exports.Set("workersInject", Napi::Function::New(env, WorkersInject));
  exports.Set("workersClearFaults", Napi::Function::New(env, WorkersClearFaults));
  exports.Set("workersStats", Napi::Function::New(env, WorkersStats));
  exports.Set("workersClose", Napi::Function::New(env, WorkersClose));
  return exports;
}

}  // namespace

NODE_API_MODULE(pdctl_native, Init)
