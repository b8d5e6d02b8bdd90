// SPDX-License-Identifier: Apache-2.0
#include "buffer/cuda_runtime.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string_view>

namespace fastpersist::buffer {
namespace {

CudaRuntime load() {
  CudaRuntime rt;
  const char* disable = std::getenv("FASTPERSIST_DISABLE_CUDA");
  if (disable != nullptr && std::string_view(disable) != "0" && std::string_view(disable) != "") {
    rt.reason = "disabled by FASTPERSIST_DISABLE_CUDA";
    return rt;
  }
  // Newest first; an already-loaded copy (e.g. PyTorch's) is found by its soname.
  for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"}) {
    void* lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) continue;
    auto reg = reinterpret_cast<int (*)(void*, size_t, unsigned)>(::dlsym(lib, "cudaHostRegister"));
    auto unreg = reinterpret_cast<int (*)(void*)>(::dlsym(lib, "cudaHostUnregister"));
    if (reg == nullptr || unreg == nullptr) {
      ::dlclose(lib);
      continue;
    }
    rt.available = true;
    rt.library = name;
    rt.host_register = reg;
    rt.host_unregister = unreg;
    return rt;  // the library stays loaded for the life of the process
  }
  rt.reason = "libcudart not found by dlopen (no CUDA runtime installed or not on the loader path)";
  return rt;
}

}  // namespace

const CudaRuntime& cuda_runtime() {
  static const CudaRuntime rt = load();
  return rt;
}

}  // namespace fastpersist::buffer
