// CRC32C (Castagnoli), the checksum of every transferred page range.
// Uses the SSE4.2 crc32 instruction when the CPU has it, a table otherwise; both give the same
// value. Thread-safe: no state beyond a table built once at load.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pdctl {

// Continues a CRC32C: start with crc = 0; the result of one call can seed the next.
uint32_t crc32c(uint32_t crc, const uint8_t* data, size_t len);
uint32_t crc32cSoftware(uint32_t crc, const uint8_t* data, size_t len);
bool crc32cHardware();
// Copies n bytes from src to dst and returns the CRC32C of them continued from crc, in one pass
// over the memory where the CPU has the crc32 instruction.
uint32_t crc32cCopy(uint32_t crc, uint8_t* dst, const uint8_t* src, size_t n);

}  // namespace pdctl
