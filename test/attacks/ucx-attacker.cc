// The attacker of issue 40 item 6, built by test/attacks/ucx-memory.e2e.test.ts with the system's
// libucp (g++ ... -lucp -lucs): a peer on the KV network that holds a pdctl engine's UCX worker
// address tries to write and read memory of that engine that no transfer offered it.
//
//   ucx-attacker TARGET_PUT TARGET_GET LENGTH   (addresses in the victim's process, decimal)
//   stdin: one line, {"address":"<base64>","rkey":"<base64>"} — rkey "" when the victim
//          published none: the attacker then tries a key it packed for its own memory.
//
// It puts LENGTH bytes of 0xEE at TARGET_PUT, flushes, gets LENGTH bytes from TARGET_GET, and
// prints one JSON line: {"rkey":"victim"|"own"|"none","put":"<status>","get":"<status>",
// "read":"<hex>"}. A status is UCX's word for how the operation ended, "timeout" when it did not
// end within 1.5 s (a victim that drops the request never answers).
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

namespace {

std::string fromBase64(const std::string& in) {
  static const std::string chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int val = 0, bits = -8;
  for (char c : in) {
    size_t p = chars.find(c);
    if (p == std::string::npos) break;
    val = (val << 6) + static_cast<int>(p);
    bits += 6;
    if (bits >= 0) {
      out.push_back(static_cast<char>((val >> bits) & 0xFF));
      bits -= 8;
    }
  }
  return out;
}

std::string field(const std::string& json, const std::string& name) {
  size_t at = json.find("\"" + name + "\"");
  if (at == std::string::npos) return "";
  size_t open = json.find('"', json.find(':', at) + 1);
  size_t close = json.find('"', open + 1);
  return json.substr(open + 1, close - open - 1);
}

// Progresses until the request ends or 1.5 s pass; the status, or "timeout".
std::string wait(ucp_worker_h worker, ucs_status_ptr_t req) {
  if (req == nullptr) return "OK";
  if (UCS_PTR_IS_ERR(req)) return ucs_status_string(UCS_PTR_STATUS(req));
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (ucp_request_check_status(req) == UCS_INPROGRESS) {
    ucp_worker_progress(worker);
    if (std::chrono::steady_clock::now() > until) return "timeout";
  }
  std::string s = ucs_status_string(ucp_request_check_status(req));
  ucp_request_free(req);
  return s == "Success" ? "OK" : s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: ucx-attacker TARGET_PUT TARGET_GET LENGTH < {address, rkey}\n");
    return 2;
  }
  uint64_t putAt = std::strtoull(argv[1], nullptr, 10);
  uint64_t getAt = std::strtoull(argv[2], nullptr, 10);
  size_t length = std::strtoul(argv[3], nullptr, 10);
  std::string line;
  std::getline(std::cin, line);
  std::string address = fromBase64(field(line, "address"));
  std::string victimKey = fromBase64(field(line, "rkey"));

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA;
  ucp_context_h context;
  if (ucp_init(&params, nullptr, &context) != UCS_OK) return 3;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker;
  if (ucp_worker_create(context, &wp, &worker) != UCS_OK) return 3;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ucp_ep_h endpoint;
  if (ucp_ep_create(worker, &ep, &endpoint) != UCS_OK) return 3;

  std::vector<uint8_t> out(length, 0xEE), in(length, 0);
  // Without the victim's key, the best there is: a key packed for the attacker's own buffer.
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = out.data();
  mp.length = length;
  ucp_mem_h memh;
  std::string keyKind = "none", put = "no key", get = "no key";
  if (ucp_mem_map(context, &mp, &memh) == UCS_OK) {
    void* packed = nullptr;
    size_t size = 0;
    std::string own;
    if (ucp_rkey_pack(context, memh, &packed, &size) == UCS_OK) {
      own.assign(static_cast<char*>(packed), size);
      ucp_rkey_buffer_release(packed);
    }
    ucp_rkey_h key = nullptr;
    if (!victimKey.empty() && ucp_ep_rkey_unpack(endpoint, victimKey.data(), &key) == UCS_OK) {
      keyKind = "victim";
    } else if (!own.empty() && ucp_ep_rkey_unpack(endpoint, own.data(), &key) == UCS_OK) {
      keyKind = "own";
    }
    if (key != nullptr) {
      ucp_request_param_t p{};
      put = wait(worker, ucp_put_nbx(endpoint, out.data(), length, putAt, key, &p));
      if (put == "OK") put = wait(worker, ucp_ep_flush_nbx(endpoint, &p));
      get = wait(worker, ucp_get_nbx(endpoint, in.data(), length, getAt, key, &p));
      ucp_rkey_destroy(key);
    }
  }
  std::string hex;
  char b[3];
  for (uint8_t c : in) {
    std::snprintf(b, sizeof b, "%02x", c);
    hex += b;
  }
  std::printf("{\"rkey\":\"%s\",\"put\":\"%s\",\"get\":\"%s\",\"read\":\"%s\"}\n", keyKind.c_str(), put.c_str(),
              get.c_str(), hex.c_str());
  std::fflush(stdout);
  // The victim may never answer: do not wait on a graceful close.
  std::_Exit(0);
}
