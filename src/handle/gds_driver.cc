// SPDX-License-Identifier: Apache-2.0
#include "handle/gds_driver.h"

#include <cstring>
#include <mutex>

#include "buffer/cuda_runtime.h"
#include "io/cufile_library.h"

namespace fastpersist::handle {
namespace {

std::mutex driver_mu;
bool driver_tried = false;
Status driver_status;
std::string driver_mode;

// The first field of CUfileDrvProps_t is nvfs {unsigned major_version; unsigned minor_version;
// ...}; cuFile reports 0.0 when the nvidia-fs driver is not in use. The struct has grown
// between releases, so it is filled into a block far larger than any version of it.
std::string read_driver_mode(const io::CuFileLibrary& lib) {
  if (lib.driver_get_properties == nullptr) return "";
  alignas(16) unsigned char props[4096] = {};
  if (lib.driver_get_properties(props).err != io::kCuFileSuccess) return "";
  unsigned major = 0;
  unsigned minor = 0;
  std::memcpy(&major, props, sizeof major);
  std::memcpy(&minor, props + sizeof major, sizeof minor);
  if (major == 0) return "cuFile driver: nvidia-fs not in use (compatibility mode)";
  return "cuFile driver: nvidia-fs " + std::to_string(major) + "." + std::to_string(minor);
}

}  // namespace

Status select_device(int device) {
  const buffer::CudaRuntime& rt = buffer::cuda_runtime();
  if (!rt.available) {
    return Status(StatusCode::kUnavailable,
                  "the CUDA runtime is not available (" + rt.reason + ")");
  }
  if (int rc = rt.set_device(device); rc != buffer::kCudaSuccess) {
    const char* text = rt.get_error_string(rc);
    return Status(StatusCode::kUnavailable,
                  "cudaSetDevice(" + std::to_string(device) +
                      ") failed: " + (text != nullptr ? text : "CUDA error"));
  }
  return Status::ok();
}

Status open_cufile_driver() {
  std::lock_guard lock(driver_mu);
  if (driver_tried) return driver_status;
  driver_tried = true;
  const io::CuFileLibrary& lib = io::cufile_library();
  if (!lib.available) {
    driver_status =
        Status(StatusCode::kUnavailable, "cuFile is not available (" + lib.reason + ")");
    return driver_status;
  }
  io::CuFileError e = lib.driver_open();
  if (e.err != io::kCuFileSuccess) {
    driver_status = Status(StatusCode::kUnavailable,
                           "cuFileDriverOpen failed: " + io::cufile_error_text(e) +
                               " (is the CUDA driver loaded? `fastpersist report` shows cuFile's "
                               "state)");
    return driver_status;
  }
  driver_mode = read_driver_mode(lib);
  return driver_status;
}

std::string cufile_driver_mode() {
  std::lock_guard lock(driver_mu);
  return driver_mode;
}

}  // namespace fastpersist::handle
