// SPDX-License-Identifier: Apache-2.0
// Checksums of checkpoint bytes: XXH3-64 (xxHash), the one algorithm manifests name today
// ("xxh3-64"). It runs at memory speed, so computing it on bytes while they are staged for a
// write costs little. Values are written as 16 lowercase hex digits.
//
// Thread-safety: the free functions are pure; one Xxh3Stream belongs to one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace fastpersist {

inline constexpr std::string_view kChecksumAlgorithm = "xxh3-64";
// A manifest written without checksums (CheckpointOptions::checksums = false): every checksum
// field is 0 and readers check sizes and headers only.
inline constexpr std::string_view kNoChecksum = "none";

// XXH3-64 (seed 0) of `bytes` bytes at `data`.
uint64_t xxh3_64(const void* data, size_t bytes);

// XXH3-128 (seed 0): the strong content hash incremental checkpoints compare tensors by (a
// manifest's optional per-tensor `xxh3_128`). Collisions are out of reach for any number of
// tensors a root can hold, unlike the 64-bit checksum, which only detects damage.
struct ContentDigest {
  uint64_t high = 0;
  uint64_t low = 0;
  bool operator==(const ContentDigest& other) const = default;
};
ContentDigest xxh3_128(const void* data, size_t bytes);
// 32 lowercase hex digits, `high` first (xxHash's canonical order), and back; nullopt for
// anything else.
std::string digest_to_hex(const ContentDigest& digest);
std::optional<ContentDigest> digest_from_hex(std::string_view text);

// The same digest over data that arrives in pieces: update(a); update(b) == xxh3_64(a + b).
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(Xxh3Stream&& other) noexcept;
  Xxh3Stream& operator=(Xxh3Stream&& other) noexcept;
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;

  void update(const void* data, size_t bytes);
  uint64_t digest() const;
  // XXH3-128 of the same bytes (xxHash's 64- and 128-bit variants share one streaming state,
  // so one pass gives both): digest128() == xxh3_128(all bytes fed since the reset).
  ContentDigest digest128() const;
  void reset();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// "0123456789abcdef" (16 digits, zero-padded) and back; nullopt for anything else.
std::string checksum_to_hex(uint64_t value);
std::optional<uint64_t> checksum_from_hex(std::string_view text);

}  // namespace fastpersist
