// SPDX-License-Identifier: Apache-2.0
#include "buffer/cuda_runtime.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fastpersist::buffer {
namespace {

CudaRuntime load() {
  CudaRuntime rt;
  const char* disable = std::getenv("FASTPERSIST_DISABLE_CUDA");
  if (disable != nullptr && std::string_view(disable) != "0" && std::string_view(disable) != "") {
    rt.reason = "disabled by FASTPERSIST_DISABLE_CUDA";
    return rt;
  }
  // A copy already loaded in the process (PyTorch's) comes first, whatever its version: a
  // second, newer runtime from the system might need a newer driver than torch's. Then the
  // newest found on the loader path.
  const char* names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"};
  std::vector<std::pair<std::string, int>> attempts;
  // An explicit choice comes before everything (a runtime outside the loader path, such as
  // PyPI's nvidia-cuda-runtime, or the tests' fake one).
  if (const char* configured = std::getenv("FASTPERSIST_CUDA_RUNTIME_LIBRARY");
      configured != nullptr && *configured != '\0') {
    attempts.emplace_back(configured, 0);
  }
  for (const char* name : names) attempts.emplace_back(name, RTLD_NOLOAD);
  for (const char* name : names) attempts.emplace_back(name, 0);
  for (const auto& [name, mode] : attempts) {
    void* lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | mode);
    if (lib == nullptr) continue;
    auto sym = [lib](const char* symbol) { return ::dlsym(lib, symbol); };
    CudaRuntime found;
    found.host_register =
        reinterpret_cast<int (*)(void*, size_t, unsigned)>(sym("cudaHostRegister"));
    found.host_unregister = reinterpret_cast<int (*)(void*)>(sym("cudaHostUnregister"));
    found.set_device = reinterpret_cast<int (*)(int)>(sym("cudaSetDevice"));
    found.stream_create_with_flags =
        reinterpret_cast<int (*)(CudaStream*, unsigned)>(sym("cudaStreamCreateWithFlags"));
    found.stream_destroy = reinterpret_cast<int (*)(CudaStream)>(sym("cudaStreamDestroy"));
    found.memcpy_async = reinterpret_cast<int (*)(void*, const void*, size_t, int, CudaStream)>(
        sym("cudaMemcpyAsync"));
    found.stream_synchronize = reinterpret_cast<int (*)(CudaStream)>(sym("cudaStreamSynchronize"));
    found.get_error_string = reinterpret_cast<const char* (*)(int)>(sym("cudaGetErrorString"));
    found.get_last_error = reinterpret_cast<int (*)()>(sym("cudaGetLastError"));
    if (found.host_register == nullptr || found.host_unregister == nullptr ||
        found.set_device == nullptr || found.stream_create_with_flags == nullptr ||
        found.stream_destroy == nullptr || found.memcpy_async == nullptr ||
        found.stream_synchronize == nullptr || found.get_error_string == nullptr ||
        found.get_last_error == nullptr) {
      ::dlclose(lib);
      continue;
    }
    rt = std::move(found);
    rt.available = true;
    rt.library = name;
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
