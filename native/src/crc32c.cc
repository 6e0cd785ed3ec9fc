#include "crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace pdctl {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

std::array<uint32_t, 256> makeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}

const std::array<uint32_t, 256> kTable = makeTable();

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32cSse42(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = ~crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}
__attribute__((target("sse4.2"))) uint32_t crc32cCopySse42(uint32_t crc, uint8_t* d, const uint8_t* p, size_t n) {
  uint64_t c = ~crc;
  // Each word is loaded once, folded into the CRC and stored: the copy and the checksum share
  // one pass over memory, so the transfer runs at memcpy speed.
  while (n >= 32) {
    uint64_t v0, v1, v2, v3;
    std::memcpy(&v0, p, 8);
    std::memcpy(&v1, p + 8, 8);
    std::memcpy(&v2, p + 16, 8);
    std::memcpy(&v3, p + 24, 8);
    c = _mm_crc32_u64(c, v0);
    c = _mm_crc32_u64(c, v1);
    c = _mm_crc32_u64(c, v2);
    c = _mm_crc32_u64(c, v3);
    std::memcpy(d, &v0, 8);
    std::memcpy(d + 8, &v1, 8);
    std::memcpy(d + 16, &v2, 8);
    std::memcpy(d + 24, &v3, 8);
    p += 32;
    d += 32;
    n -= 32;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n-- > 0) {
    c32 = _mm_crc32_u8(c32, *p);
    *d++ = *p++;
  }
  return ~c32;
}
const bool kHasSse42 = __builtin_cpu_supports("sse4.2");
#else
const bool kHasSse42 = false;
#endif

}  // namespace

uint32_t crc32cSoftware(uint32_t crc, const uint8_t* p, size_t n) {
  uint32_t c = ~crc;
  while (n-- > 0) c = kTable[(c ^ *p++) & 0xFF] ^ (c >> 8);
  return ~c;
}

bool crc32cHardware() { return kHasSse42; }

uint32_t crc32cCopy(uint32_t crc, uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__x86_64__)
  if (kHasSse42) return crc32cCopySse42(crc, dst, src, n);
#endif
  std::memcpy(dst, src, n);
  return crc32cSoftware(crc, src, n);
}

uint32_t crc32c(uint32_t crc, const uint8_t* data, size_t len) {
#if defined(__x86_64__)
  if (kHasSse42) return crc32cSse42(crc, data, len);
#endif
  return crc32cSoftware(crc, data, len);
}

}  // namespace pdctl
