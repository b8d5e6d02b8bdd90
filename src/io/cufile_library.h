// SPDX-License-Identifier: Apache-2.0
// NVIDIA cuFile (GPUDirect Storage), found with dlopen at run time: fastpersist never needs it
// (nor CUDA) to build, and a machine without it runs every host path unchanged. This is the
// only file that knows cuFile's entry points; they are declared here with plain C types, whose
// layout cuFile has kept since GDS 1.0: CUfileError_t is {int err; int cu_err} (the cuFile code
// and the CUDA driver's CUresult), CUfileHandle_t an opaque pointer, CUfileDescr_t
// {int type; union {int fd; void* handle}; const void* fs_ops}.
//
// Where it looks, first hit wins:
//   1. FASTPERSIST_CUFILE_LIBRARY: the library file, or a folder holding libcufile.so.0 (such as
//      site-packages/nvidia/cufile/lib of PyPI's nvidia-cufile wheels; the Python package sets
//      it to that folder when the wheel is installed and the variable is not set);
//   2. a libcufile already loaded in the process (e.g. by PyTorch), whatever its version;
//   3. libcufile.so.0, then libcufile.so, on the loader path.
// FASTPERSIST_DISABLE_CUDA=1 skips the lookup (no cuFile without CUDA).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

namespace fastpersist::io {

using CuFileHandle = void*;  // CUfileHandle_t

struct CuFileError {  // CUfileError_t
  int err = 0;        // CUfileOpError: 0 success, 5000+ cuFile's own codes
  int cu_err = 0;     // CUresult of the CUDA driver, when err says it failed
};

struct CuFileDescr {  // CUfileDescr_t
  int type = 0;
  union {
    int fd;
    void* handle;
  } handle{};
  const void* fs_ops = nullptr;
};

inline constexpr int kCuFileSuccess = 0;
inline constexpr int kCuFileHandleTypeOpaqueFd = 1;

struct CuFileLibrary {
  bool available = false;
  std::string library;  // the file that was loaded
  std::string reason;   // why not available

  CuFileError (*driver_open)() = nullptr;
  CuFileError (*handle_register)(CuFileHandle* handle, CuFileDescr* descr) = nullptr;
  void (*handle_deregister)(CuFileHandle handle) = nullptr;
  CuFileError (*buf_register)(const void* base, size_t bytes, int flags) = nullptr;
  CuFileError (*buf_deregister)(const void* base) = nullptr;
  // Bytes moved (may be short), -1 with errno set, or -(cuFile error code).
  ssize_t (*read)(CuFileHandle handle, void* base, size_t bytes, off_t file_offset,
                  off_t base_offset) = nullptr;
  ssize_t (*write)(CuFileHandle handle, const void* base, size_t bytes, off_t file_offset,
                   off_t base_offset) = nullptr;
  // Optional (null when the library lacks it). Fills CUfileDrvProps_t; only its first field,
  // nvfs.major_version (0 when nvidia-fs is not in use), is read here, from a larger zeroed
  // block, so a grown struct never writes past our memory.
  CuFileError (*driver_get_properties)(void* props) = nullptr;
};

// Loaded once per process; thread-safe. Loading opens no driver and creates no CUDA context.
const CuFileLibrary& cufile_library();
// The search itself, uncached (tests; everyone else calls cufile_library()).
CuFileLibrary load_cufile_library();

// "cuFile error 5011 (CUDA driver error 0)"-style text of an error, or of a negative return.
std::string cufile_error_text(CuFileError error);
std::string cufile_result_text(ssize_t result, int saved_errno);

// The GPUDirect Storage driver as seen from user space, without opening cuFile's driver (which
// would create a CUDA context): whether the nvidia-fs kernel module is loaded, and whether
// cuFile will run in compatibility mode (data moved through host memory with POSIX I/O, correct
// but no faster than AioHandle's staging).
struct GdsDriverInfo {
  bool nvidia_fs_loaded = false;    // /proc/driver/nvidia-fs exists
  std::string nvidia_fs_version;    // first line of /proc/driver/nvidia-fs/version, if readable
  bool forced_compat_mode = false;  // CUFILE_FORCE_COMPAT_MODE=true in the environment
  bool compat_mode = false;         // what cuFile will most likely do (see `mode`)
  std::string mode;                 // one sentence: "GPUDirect ..." or "compatibility mode: why"
};

// `proc_root` is "/proc" except in tests.
GdsDriverInfo probe_gds_driver(const std::string& proc_root = "/proc");

}  // namespace fastpersist::io
