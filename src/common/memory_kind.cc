// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/memory_kind.h"

namespace fastpersist {

const char* memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kCudaDevice:
      return "cuda";
  }
  return "unknown";
}

}  // namespace fastpersist
