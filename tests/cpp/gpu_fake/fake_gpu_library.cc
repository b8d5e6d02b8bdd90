// SPDX-License-Identifier: Apache-2.0
// A fake CUDA runtime and cuFile in one shared library, loaded by fastpersist through
// FASTPERSIST_CUDA_RUNTIME_LIBRARY and FASTPERSIST_CUFILE_LIBRARY (the same file, so one state),
// so the GPU code paths run on machines without a GPU: "device memory" is host memory handed
// out by fake_cuda_malloc, and the fake checks what the real libraries would refuse or what
// would go wrong on a GPU:
//   - a copy's device side must lie in fake device memory and its host side must not (a
//     direction mix-up fails), and copies happen only at cudaStreamSynchronize (a slot used
//     before its copy was waited for holds stale bytes);
//   - cuFile I/O needs a device selected on the calling thread, a registered file handle, and
//     for memory inside a registered buffer that buffer's base (cuFile's rule); it moves at
//     most 1 MiB + 3 bytes per call, so short transfers must be resumed;
//   - which devices were ever selected (a context on a device nobody used is a bug).
// Not part of the library: built only for tests/cpp/gpu_fake.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <vector>

namespace {

constexpr int kDevices = 2;
constexpr int kCudaErrorInvalidValue = 1;
constexpr int kCudaErrorInvalidDevice = 101;
constexpr int kCuFileInvalidValue = 5022;
constexpr size_t kMaxCuFileCall = (size_t{1} << 20) + 3;

struct Copy {
  void* dst;
  const void* src;
  size_t bytes;
  bool to_device;
};
struct Stream {
  int device;
  std::vector<Copy> pending;
};
struct Allocation {
  size_t bytes;
  int device;
};
struct CuFileHandle {
  int fd;
};

std::mutex mu;
std::map<uintptr_t, Allocation> device_memory;  // by start
std::map<uintptr_t, size_t> registered;         // cuFileBufRegister'ed ranges
std::set<int> devices_used;
int live_handles = 0;
uint64_t bytes_to_device = 0;  // host-to-device bytes copied at stream syncs
int driver_opens = 0;
thread_local int current_device = -1;

// The allocation holding [p, p + n), or nullptr.
const std::pair<const uintptr_t, Allocation>* find_device(const void* p, size_t n) {
  auto a = reinterpret_cast<uintptr_t>(p);
  auto it = device_memory.upper_bound(a);
  if (it == device_memory.begin()) return nullptr;
  --it;
  if (a + n > it->first + it->second.bytes) return nullptr;
  return &*it;
}

struct CuFileError {
  int err;
  int cu_err;
};
struct CuFileDescr {
  int type;
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};

}  // namespace

extern "C" {

// ------------------------------------------------------------------ test hooks
void* fake_cuda_malloc(size_t bytes, int device) {
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  std::lock_guard lock(mu);
  device_memory[reinterpret_cast<uintptr_t>(p)] = {bytes, device};
  return p;
}
void fake_cuda_free(void* p) {
  {
    std::lock_guard lock(mu);
    device_memory.erase(reinterpret_cast<uintptr_t>(p));
  }
  std::free(p);
}
int fake_cuda_device_used(int device) {
  std::lock_guard lock(mu);
  return devices_used.count(device) ? 1 : 0;
}
uint64_t fake_cuda_bytes_to_device() {
  std::lock_guard lock(mu);
  return bytes_to_device;
}
int fake_cufile_live_handles() {
  std::lock_guard lock(mu);
  return live_handles;
}
int fake_cufile_driver_opens() {
  std::lock_guard lock(mu);
  return driver_opens;
}

// ------------------------------------------------------------------ CUDA runtime
int cudaHostRegister(void*, size_t, unsigned) { return 0; }
int cudaHostUnregister(void*) { return 0; }
int cudaSetDevice(int device) {
  if (device < 0 || device >= kDevices) return kCudaErrorInvalidDevice;
  std::lock_guard lock(mu);
  devices_used.insert(device);
  current_device = device;
  return 0;
}
int cudaStreamCreateWithFlags(void** stream, unsigned) {
  if (current_device < 0) return kCudaErrorInvalidValue;
  *stream = new Stream{current_device, {}};
  return 0;
}
int cudaStreamDestroy(void* stream) {
  delete static_cast<Stream*>(stream);
  return 0;
}
int cudaMemcpyAsync(void* dst, const void* src, size_t bytes, int kind, void* stream) {
  auto* s = static_cast<Stream*>(stream);
  std::lock_guard lock(mu);
  const void* device_side = kind == 2 ? src : dst;  // 2: device to host, 1: host to device
  const void* host_side = kind == 2 ? dst : src;
  auto* alloc = find_device(device_side, bytes);
  if ((kind != 1 && kind != 2) || alloc == nullptr || alloc->second.device != s->device ||
      find_device(host_side, 1) != nullptr || current_device != s->device) {
    return kCudaErrorInvalidValue;
  }
  s->pending.push_back({dst, src, bytes, kind == 1});
  return 0;
}
int cudaStreamSynchronize(void* stream) {
  auto* s = static_cast<Stream*>(stream);
  for (const Copy& c : s->pending) {
    std::memcpy(c.dst, c.src, c.bytes);
    if (c.to_device) {
      std::lock_guard lock(mu);
      bytes_to_device += c.bytes;
    }
  }
  s->pending.clear();
  return 0;
}
const char* cudaGetErrorString(int) { return "fake CUDA error"; }
int cudaGetLastError() { return 0; }

// ------------------------------------------------------------------ cuFile
CuFileError cuFileDriverOpen() {
  std::lock_guard lock(mu);
  ++driver_opens;
  return {0, 0};
}
CuFileError cuFileDriverGetProperties(void* props) {
  std::memset(props, 0, 64);  // nvfs.major_version 0: no nvidia-fs, compatibility mode
  return {0, 0};
}
CuFileError cuFileHandleRegister(void** handle, CuFileDescr* descr) {
  if (descr->type != 1 || current_device < 0) return {kCuFileInvalidValue, 0};
  *handle = new CuFileHandle{descr->handle.fd};
  std::lock_guard lock(mu);
  ++live_handles;
  return {0, 0};
}
void cuFileHandleDeregister(void* handle) {
  delete static_cast<CuFileHandle*>(handle);
  std::lock_guard lock(mu);
  --live_handles;
}
CuFileError cuFileBufRegister(const void* base, size_t bytes, int) {
  std::lock_guard lock(mu);
  if (current_device < 0 || find_device(base, bytes) == nullptr) return {kCuFileInvalidValue, 0};
  registered[reinterpret_cast<uintptr_t>(base)] = bytes;
  return {0, 0};
}
CuFileError cuFileBufDeregister(const void* base) {
  std::lock_guard lock(mu);
  if (registered.erase(reinterpret_cast<uintptr_t>(base)) == 0) return {kCuFileInvalidValue, 0};
  return {0, 0};
}

namespace {
ssize_t cufile_io(void* handle, const void* base, size_t size, off_t file_offset, off_t base_offset,
                  bool write) {
  auto* at = static_cast<const char*>(base) + base_offset;
  {
    std::lock_guard lock(mu);
    auto* alloc = find_device(at, size);
    if (current_device < 0 || alloc == nullptr || alloc->second.device != current_device) {
      return -kCuFileInvalidValue;
    }
    // Inside a registered buffer, cuFile wants that buffer's base (and an offset into it).
    auto b = reinterpret_cast<uintptr_t>(base);
    auto a = reinterpret_cast<uintptr_t>(at);
    auto it = registered.upper_bound(a);
    if (it != registered.begin()) {
      --it;
      if (a < it->first + it->second && b != it->first) return -kCuFileInvalidValue;
    }
  }
  size_t n = size < kMaxCuFileCall ? size : kMaxCuFileCall;
  int fd = static_cast<CuFileHandle*>(handle)->fd;
  return write ? ::pwrite(fd, at, n, file_offset)
               : ::pread(fd, const_cast<char*>(at), n, file_offset);
}
}  // namespace

ssize_t cuFileRead(void* handle, void* base, size_t size, off_t file_offset, off_t base_offset) {
  return cufile_io(handle, base, size, file_offset, base_offset, false);
}
ssize_t cuFileWrite(void* handle, const void* base, size_t size, off_t file_offset,
                    off_t base_offset) {
  return cufile_io(handle, base, size, file_offset, base_offset, true);
}

}  // extern "C"
