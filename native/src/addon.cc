// The addon's JavaScript surface. Arguments are validated in TypeScript first
// (src/transfer/pool.ts); the checks here only keep a wrong call from crashing the process.
// Everything runs on the JS thread; the pool mappings are shared with page views (see pool.h).
#include <dlfcn.h>
#include <napi.h>

#include <memory>
#include <string>

#include "crc32c.h"
#include "pool.h"

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
  need(info, 4);
  std::string name = nameArg(info, 0);
  auto pages = static_cast<uint32_t>(uintArg(info, 1, 0xFFFFFFFFu, "pages"));
  uint64_t pageBytes = uintArg(info, 2, uint64_t{1} << 40, "pageBytes");
  bool replace = info[3].ToBoolean();
  pdctl::PoolError err;
  auto m = pdctl::createPool(name, pages, pageBytes, replace, &err);
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
  return o;
}

// A view of one page, without copying. The view keeps the mapping alive (see pool.h).
Napi::Value PoolPage(const Napi::CallbackInfo& info) {
  need(info, 2);
  const Holder& m = held(info, 0);
  auto index = static_cast<uint32_t>(uintArg(info, 1, 0xFFFFFFFFu, "page index"));
  if (index >= m->header().pages) throwCoded(info.Env(), "TRANSFER_BAD_ARGUMENT", "page index out of range");
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
  // Pages are contiguous in the mapping, so a range is one span.
  uint32_t crc = pdctl::crc32c(0, m->page(static_cast<uint32_t>(first)), count * m->header().pageBytes);
  return Napi::Number::New(info.Env(), crc);
}

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

// What is available: shared memory always; CUDA only if libcudart loads and sees a device.
Napi::Value Backends(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object cuda = Napi::Object::New(env);
  void* lib = dlopen("libcudart.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    cuda.Set("available", false);
    cuda.Set("reason", "libcudart not found");
  } else {
    using CountFn = int (*)(int*);
    auto count = reinterpret_cast<CountFn>(dlsym(lib, "cudaGetDeviceCount"));
    int n = 0;
    int rc = count ? count(&n) : -1;
    cuda.Set("available", rc == 0 && n > 0);
    cuda.Set("reason", rc == 0 ? (n > 0 ? std::to_string(n) + " device(s)" : "no device")
                               : "cudaGetDeviceCount returned " + std::to_string(rc) + " (no device or no driver)");
    cuda.Set("devices", Napi::Number::New(env, rc == 0 ? n : 0));
    dlclose(lib);
  }
  Napi::Object o = Napi::Object::New(env);
  o.Set("shm", true);
  o.Set("crc32cHardware", pdctl::crc32cHardware());
  o.Set("cuda", cuda);
  return o;
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("poolCreate", Napi::Function::New(env, PoolCreate));
  exports.Set("poolOpen", Napi::Function::New(env, PoolOpen));
  exports.Set("poolInfo", Napi::Function::New(env, PoolInfo));
  exports.Set("poolPage", Napi::Function::New(env, PoolPage));
  exports.Set("poolChecksum", Napi::Function::New(env, PoolChecksum));
  exports.Set("poolClose", Napi::Function::New(env, PoolClose));
  exports.Set("poolUnlink", Napi::Function::New(env, PoolUnlink));
  exports.Set("crc32c", Napi::Function::New(env, Crc32c));
  exports.Set("backends", Napi::Function::New(env, Backends));
  return exports;
}

}  // namespace

NODE_API_MODULE(pdctl_native, Init)
