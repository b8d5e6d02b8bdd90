// SPDX-License-Identifier: Apache-2.0
// XXH3-64 through the system xxHash; the only file of the format layer that includes it.
#include "fastpersist/checksum.h"

// The state's definition (not only a pointer) lets it live inside our State, so creating a
// stream cannot fail with a null XXH3_createState().
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(FASTPERSIST_XXH_DISPATCH)
#include <xxh_x86dispatch.h>  // XXH3 one-shot and update calls become the CPU-dispatched ones
#endif

namespace fastpersist {

uint64_t xxh3_64(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

ContentDigest xxh3_128(const void* data, size_t bytes) {
  XXH128_hash_t h = XXH3_128bits(data, bytes);
  return {h.high64, h.low64};
}

std::string digest_to_hex(const ContentDigest& digest) {
  return checksum_to_hex(digest.high) + checksum_to_hex(digest.low);
}

std::optional<ContentDigest> digest_from_hex(std::string_view text) {
  if (text.size() != 32) return std::nullopt;
  auto high = checksum_from_hex(text.substr(0, 16));
  auto low = checksum_from_hex(text.substr(16));
  if (!high || !low) return std::nullopt;
  return ContentDigest{*high, *low};
}

// XXH3_state_t is 64-byte aligned; make_unique honours that (C++17 aligned new).
struct Xxh3Stream::State {
  XXH3_state_t xxh;
};

Xxh3Stream::Xxh3Stream() : state_(std::make_unique<State>()) { reset(); }
Xxh3Stream::~Xxh3Stream() = default;
// A moved-from stream holds no state: it may only be assigned to or destroyed.
Xxh3Stream::Xxh3Stream(Xxh3Stream&& other) noexcept = default;
Xxh3Stream& Xxh3Stream::operator=(Xxh3Stream&& other) noexcept = default;

void Xxh3Stream::update(const void* data, size_t bytes) {
  // Only fails for a null pointer with a non-zero length, which is a caller bug like memcpy's.
  (void)XXH3_64bits_update(&state_->xxh, data, bytes);
}

uint64_t Xxh3Stream::digest() const { return XXH3_64bits_digest(&state_->xxh); }

// The 64-bit reset and update are the 128-bit ones (one XXH3_state_t, one accumulator); only
// the final mixing differs. checksum_test checks it for short and long inputs.
ContentDigest Xxh3Stream::digest128() const {
  XXH128_hash_t h = XXH3_128bits_digest(&state_->xxh);
  return {h.high64, h.low64};
}

void Xxh3Stream::reset() { (void)XXH3_64bits_reset(&state_->xxh); }

std::string checksum_to_hex(uint64_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i) {
    out[static_cast<size_t>(i)] = kDigits[value & 0xf];
    value >>= 4;
  }
  return out;
}

std::optional<uint64_t> checksum_from_hex(std::string_view text) {
  // Exactly the form checksum_to_hex writes, so one value has one spelling in a manifest.
  if (text.size() != 16) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    uint64_t digit;
    if (c >= '0' && c <= '9') {
      digit = static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = static_cast<uint64_t>(c - 'a') + 10;
    } else {
      return std::nullopt;
    }
    value = (value << 4) | digit;
  }
  return value;
}

}  // namespace fastpersist
