// SPDX-License-Identifier: Apache-2.0
// `fastpersist report`: what this machine and build can do, like DeepSpeed's `ds_report`.
// Every "no" comes with the reason and, where there is one, the fix, because the usual reader
// is someone wondering why their checkpoints are slow.
#include <dlfcn.h>
#include <link.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint_paths.h"
#include "command.h"
#include "fastpersist/gds_handle.h"
#include "fastpersist/io_backend.h"
#include "fastpersist/io_engine.h"
#include "fastpersist/options.h"
#include "fastpersist/pinned_buffer.h"
#include "fastpersist/tensor_codec.h"
#include "format.h"

namespace fastpersist::cli {
namespace {

// Below this, pinned staging buffers of a typical checkpoint writer do not fit and fall back to
// unlocked memory; worth a hint.
constexpr uint64_t kMemlockHintBytes = uint64_t{1} << 30;

// Where the loader found an already-open library: "libcudart.so.13" -> its full path.
std::string loaded_path(const std::string& soname) {
  void* h = ::dlopen(soname.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (h == nullptr) return soname;
  link_map* map = nullptr;
  std::string path = (::dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr &&
                      map->l_name != nullptr && map->l_name[0] != '\0')
                         ? map->l_name
                         : soname;
  ::dlclose(h);
  return path;
}

// CAP_IPC_LOCK (root, or granted) lets mlock ignore RLIMIT_MEMLOCK, which makes a small limit
// harmless; without this check the report would warn root about a limit that does not apply.
bool has_cap_ipc_lock() {
  constexpr int kCapIpcLock = 14;  // linux/capability.h
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    uint64_t caps = std::strtoull(line.c_str() + 7, nullptr, 16);
    return (caps >> kCapIpcLock) & 1;
  }
  return false;
}

struct Report {
  std::array<BackendProbe, 3> backends;
  std::string auto_backend;
  std::string auto_reason;
  std::string folder;
  Result<FileIoMode> folder_mode = Status(StatusCode::kInternal, "not probed");
  MemlockInfo memlock;
  bool cap_ipc_lock = false;
  CudaRuntimeInfo cuda;
  GdsInfo gds;  // cuFile and the GDS driver, probed without opening cuFile's driver
};

Report gather(const std::string& folder) {
  Report r;
  r.backends = probe_all_backends();
  Result<Backend> chosen = resolve_backend(Backend::kAuto, &r.auto_reason);
  if (chosen.is_ok()) {
    r.auto_backend = std::string(backend_name(*chosen));
  } else {
    r.auto_backend = "none";
    r.auto_reason = chosen.status().to_string();
  }
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(folder, ec);
  r.folder = ec ? folder : abs.lexically_normal().string();
  // "/x/." normalizes to "/x/"; print it the way people type it.
  if (r.folder.size() > 1 && r.folder.back() == '/') r.folder.pop_back();
  r.folder_mode = probe_file_io(r.folder);
  r.memlock = memlock_info();
  r.cap_ipc_lock = has_cap_ipc_lock();
  r.cuda = cuda_runtime_info();
  if (r.cuda.available) r.cuda.library = loaded_path(r.cuda.library);
  r.gds = gds_info();
  if (r.gds.cufile_available) r.gds.cufile_library = loaded_path(r.gds.cufile_library);
  return r;
}

nlohmann::json limit_json(uint64_t bytes) {
  return bytes == UINT64_MAX ? nlohmann::json(nullptr) : nlohmann::json(bytes);
}

nlohmann::json to_json(const Report& r) {
  nlohmann::json j;
  j["version"] = FASTPERSIST_VERSION;
  j["backends"] = nlohmann::json::array();
  for (const BackendProbe& p : r.backends) {
    j["backends"].push_back({{"name", backend_name(p.backend)},
                             {"built_in", p.built_in},
                             {"available", p.available},
                             {"reason", p.reason},
                             {"fix", p.fix}});
  }
  j["auto"] = {{"backend", r.auto_backend}, {"reason", r.auto_reason}};
  nlohmann::json folder = {{"path", r.folder}};
  if (r.folder_mode.is_ok()) {
    folder["direct_io"] = r.folder_mode->direct;
    folder["fallback_reason"] = r.folder_mode->fallback_reason;
    folder["offset_alignment"] = r.folder_mode->offset_alignment;
    folder["memory_alignment"] = r.folder_mode->memory_alignment;
  } else {
    folder["error"] = r.folder_mode.status().to_string();
  }
  j["folder"] = folder;
  // null means unlimited: JSON has no integer wide enough to say UINT64_MAX portably.
  j["memlock"] = {{"soft_limit_bytes", limit_json(r.memlock.soft_limit)},
                  {"hard_limit_bytes", limit_json(r.memlock.hard_limit)},
                  {"soft_limit", format_limit(r.memlock.soft_limit)},
                  {"hard_limit", format_limit(r.memlock.hard_limit)},
                  {"cap_ipc_lock", r.cap_ipc_lock},
                  {"fallback_happened", r.memlock.warned}};
  j["cuda_runtime"] = {
      {"found", r.cuda.available}, {"library", r.cuda.library}, {"reason", r.cuda.reason}};
  j["cufile"] = {{"found", r.gds.cufile_available},
                 {"library", r.gds.cufile_library},
                 {"reason", r.gds.cufile_reason},
                 {"nvidia_fs_loaded", r.gds.nvidia_fs_loaded},
                 {"nvidia_fs_version", r.gds.nvidia_fs_version},
                 {"compat_mode", r.gds.compat_mode},
                 {"mode", r.gds.mode}};
  j["build"] = {{"compiler", FASTPERSIST_CXX_COMPILER},
                {"build_type", FASTPERSIST_BUILD_TYPE},
                {"cxx_standard", static_cast<long>(__cplusplus)},
                {"io_uring", FASTPERSIST_BUILT_WITH_URING == 1},
                {"libaio", FASTPERSIST_BUILT_WITH_AIO == 1},
                {"threads", true},
                {"compression", codec_versions()}};
  return j;
}

// "label ........ value", like ds_report, so the eye finds the column.
void row(const std::string& label, const std::string& value, int indent = 0) {
  std::string left = std::string(static_cast<size_t>(indent), ' ') + label + " ";
  if (left.size() < 28) left += std::string(28 - left.size(), '.');
  std::cout << left << " " << value << "\n";
}

void print_text(const Report& r) {
  const std::string rule(72, '-');
  std::cout << rule << "\nfastpersist report\n" << rule << "\n";
  row("version", FASTPERSIST_VERSION);

  std::cout << rule << "\nI/O backends (AUTO prefers them in this order)\n" << rule << "\n";
  for (const BackendProbe& p : r.backends) {
    row(std::string(backend_name(p.backend)), (p.available ? "[OKAY] " : "[NO] ") + p.reason);
    if (!p.available && !p.fix.empty()) row("fix", p.fix, 2);
  }
  row("auto picks", r.auto_backend + ": " + r.auto_reason);

  std::cout << rule << "\nstorage: " << r.folder << "\n" << rule << "\n";
  if (!r.folder_mode.is_ok()) {
    row("O_DIRECT", "[NO] cannot probe: " + r.folder_mode.status().to_string());
  } else if (r.folder_mode->direct) {
    row("O_DIRECT", "[OKAY] supported");
    row("offset alignment", format_bytes(r.folder_mode->offset_alignment) +
                                " (logical block size: file offsets and lengths)");
    row("memory alignment", format_bytes(r.folder_mode->memory_alignment) + " (buffer addresses)");
  } else {
    row("O_DIRECT", "[NO] " + r.folder_mode->fallback_reason);
    row("fix",
        "nothing needed: I/O falls back to the page cache (slower for large files); "
        "use a filesystem with O_DIRECT (ext4, xfs) for full speed",
        2);
  }

  std::cout << rule << "\nmemory and accelerators\n" << rule << "\n";
  row("memlock limit", "soft " + format_limit(r.memlock.soft_limit) + ", hard " +
                           format_limit(r.memlock.hard_limit));
  if (r.cap_ipc_lock) {
    row("note", "this process has CAP_IPC_LOCK, so the limit does not apply to it", 2);
  } else if (r.memlock.soft_limit != UINT64_MAX && r.memlock.soft_limit < kMemlockHintBytes) {
    row("note", "pinned buffers larger than this use unlocked memory (still correct, less fast)",
        2);
    row("fix",
        "ulimit -l unlimited, or 'memlock' in /etc/security/limits.conf, or "
        "docker run --ulimit memlock=-1",
        2);
  }
  row("CUDA runtime", r.cuda.available ? "[OKAY] found: " + r.cuda.library
                                       : "[NO] " + (r.cuda.reason.empty() ? std::string("not found")
                                                                          : r.cuda.reason));
  row("cuFile (GDS)", r.gds.cufile_available ? "[OKAY] found: " + r.gds.cufile_library
                                             : "[NO] " + r.gds.cufile_reason);
  if (!r.gds.cufile_available && r.gds.cufile_reason.find("disabled") == std::string::npos) {
    row("fix",
        "pip install nvidia-cufile-cu12 (then FASTPERSIST_CUFILE_LIBRARY=<site-packages>/nvidia/"
        "cufile/lib for this CLI; Python finds it itself), or the CUDA toolkit's GDS package",
        2);
  }
  row("nvidia-fs driver",
      r.gds.nvidia_fs_loaded
          ? "[OKAY] loaded" +
                (r.gds.nvidia_fs_version.empty() ? std::string() : ": " + r.gds.nvidia_fs_version)
          : "[NO] not loaded (/proc/driver/nvidia-fs is absent)");
  row("GDS mode", (r.gds.compat_mode ? "[COMPAT] " : "[OKAY] ") + r.gds.mode);

  std::cout << rule << "\nbuild\n" << rule << "\n";
  row("compiler", FASTPERSIST_CXX_COMPILER);
  row("build type", FASTPERSIST_BUILD_TYPE[0] != '\0' ? FASTPERSIST_BUILD_TYPE : "(none)");
  row("C++ standard", std::to_string(static_cast<long>(__cplusplus)));
  row("io_uring backend", FASTPERSIST_BUILT_WITH_URING == 1 ? "built in" : "not built in");
  row("libaio backend", FASTPERSIST_BUILT_WITH_AIO == 1 ? "built in" : "not built in");
  row("threads backend", "built in (always)");
  row("compression", codec_versions());
}

}  // namespace

Command add_report_command(CLI::App& parent) {
  struct Args {
    std::string folder = ".";
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* app = parent.add_subcommand(
      "report", "What this machine and build support: backends, O_DIRECT, memlock, CUDA, cuFile");
  app->add_option("--folder", args->folder, "Folder whose O_DIRECT support to probe")
      ->capture_default_str();
  app->add_flag("--json", args->json, "Print one JSON object instead of text");
  return {app, [args] {
            std::error_code ec;
            if (!std::filesystem::is_directory(args->folder, ec)) {
              return fail("report",
                          "--folder '" + args->folder + "': " +
                              (std::filesystem::exists(args->folder, ec) ? "not a directory"
                                                                         : "no such directory"),
                          kExitUsage);
            }
            Report r = gather(args->folder);
            if (args->json) {
              std::cout << json_text(to_json(r)) << "\n";
            } else {
              print_text(r);
            }
            std::cout.flush();
            return kExitOk;
          }};
}

}  // namespace fastpersist::cli
