// SPDX-License-Identifier: Apache-2.0
#include "io/cufile_library.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string_view>
#include <utility>
#include <vector>

namespace fastpersist::io {
namespace {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string_view(v) != "" && std::string_view(v) != "0";
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Fills the entry points from `lib`; false (and nothing kept) when a required one is missing.
bool bind_symbols(void* lib, CuFileLibrary& out, std::string* missing) {
  auto sym = [&](const char* name) {
    void* p = ::dlsym(lib, name);
    if (p == nullptr && missing->empty()) *missing = name;
    return p;
  };
  out.driver_open = reinterpret_cast<CuFileError (*)()>(sym("cuFileDriverOpen"));
  out.handle_register =
      reinterpret_cast<CuFileError (*)(CuFileHandle*, CuFileDescr*)>(sym("cuFileHandleRegister"));
  out.handle_deregister = reinterpret_cast<void (*)(CuFileHandle)>(sym("cuFileHandleDeregister"));
  out.buf_register =
      reinterpret_cast<CuFileError (*)(const void*, size_t, int)>(sym("cuFileBufRegister"));
  out.buf_deregister = reinterpret_cast<CuFileError (*)(const void*)>(sym("cuFileBufDeregister"));
  out.read =
      reinterpret_cast<ssize_t (*)(CuFileHandle, void*, size_t, off_t, off_t)>(sym("cuFileRead"));
  out.write = reinterpret_cast<ssize_t (*)(CuFileHandle, const void*, size_t, off_t, off_t)>(
      sym("cuFileWrite"));
  if (!missing->empty()) return false;
  // Optional: only used to confirm the mode after the driver is open.
  out.driver_get_properties =
      reinterpret_cast<CuFileError (*)(void*)>(::dlsym(lib, "cuFileDriverGetProperties"));
  return true;
}

}  // namespace

CuFileLibrary load_cufile_library() {
  CuFileLibrary lib;
  if (env_flag("FASTPERSIST_DISABLE_CUDA")) {
    lib.reason = "disabled by FASTPERSIST_DISABLE_CUDA";
    return lib;
  }
  std::vector<std::pair<std::string, int>> attempts;
  if (const char* configured = std::getenv("FASTPERSIST_CUFILE_LIBRARY");
      configured != nullptr && *configured != '\0') {
    std::string path = configured;
    if (is_directory(path)) path += "/libcufile.so.0";
    attempts.emplace_back(path, 0);
  }
  // A copy already in the process comes first: a second one could disagree with the CUDA
  // driver state the first already set up.
  for (const char* name : {"libcufile.so.0", "libcufile.so"})
    attempts.emplace_back(name, RTLD_NOLOAD);
  for (const char* name : {"libcufile.so.0", "libcufile.so"}) attempts.emplace_back(name, 0);

  std::string errors;
  for (const auto& [name, mode] : attempts) {
    ::dlerror();
    void* handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | mode);
    if (handle == nullptr) {
      // Only real load failures are worth reporting; a NOLOAD miss just means "not loaded yet".
      if (mode == 0) {
        const char* why = ::dlerror();
        if (!errors.empty()) errors += "; ";
        errors += why != nullptr ? why : name + ": not found";
      }
      continue;
    }
    CuFileLibrary found;
    std::string missing;
    if (!bind_symbols(handle, found, &missing)) {
      if (!errors.empty()) errors += "; ";
      errors += name + " lacks " + missing;
      ::dlclose(handle);
      continue;
    }
    found.available = true;
    found.library = name;
    return found;  // stays loaded for the life of the process
  }
  lib.reason =
      "libcufile not found by dlopen (install the nvidia-cufile wheel or the GPUDirect "
      "Storage package, or set FASTPERSIST_CUFILE_LIBRARY): " +
      errors;
  return lib;
}

const CuFileLibrary& cufile_library() {
  static const CuFileLibrary lib = load_cufile_library();
  return lib;
}

std::string cufile_error_text(CuFileError error) {
  std::string text = "cuFile error " + std::to_string(error.err);
  if (error.cu_err != 0) text += " (CUDA driver error " + std::to_string(error.cu_err) + ")";
  return text;
}

std::string cufile_result_text(ssize_t result, int saved_errno) {
  if (result == -1) return "cuFile I/O failed with errno " + std::to_string(saved_errno);
  return "cuFile error " + std::to_string(-result);
}

GdsDriverInfo probe_gds_driver(const std::string& proc_root) {
  GdsDriverInfo info;
  const std::string dir = proc_root + "/driver/nvidia-fs";
  info.nvidia_fs_loaded = is_directory(dir);
  if (info.nvidia_fs_loaded) {
    std::ifstream version(dir + "/version");
    std::getline(version, info.nvidia_fs_version);
  }
  const char* force = std::getenv("CUFILE_FORCE_COMPAT_MODE");
  info.forced_compat_mode =
      force != nullptr && (std::string_view(force) == "true" || std::string_view(force) == "1");
  if (info.forced_compat_mode) {
    info.compat_mode = true;
    info.mode =
        "compatibility mode: CUFILE_FORCE_COMPAT_MODE is set, so cuFile moves data "
        "through host memory with POSIX I/O";
  } else if (!info.nvidia_fs_loaded) {
    info.compat_mode = true;
    info.mode = "compatibility mode: the nvidia-fs kernel driver is not loaded (no " + dir +
                "), so cuFile moves data through host memory with POSIX I/O (unless cufile.json "
                "enables the kernel's PCI P2PDMA, which is not checked here)";
  } else {
    info.mode = "GPUDirect Storage: nvidia-fs " +
                (info.nvidia_fs_version.empty() ? std::string("loaded") : info.nvidia_fs_version) +
                " (files on filesystems it does not support still use compatibility mode)";
  }
  return info;
}

}  // namespace fastpersist::io
