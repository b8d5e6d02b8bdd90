// SPDX-License-Identifier: Apache-2.0
// DeepSpeed tags without a manifest (foreign_checkpoint.h).
#include "fastpersist/foreign_checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string_view>

#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/layout.h"

namespace fastpersist {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// DeepSpeed's names: mp_rank_XX_model_states.pt, zero_pp_rank_R_mp_rank_XX_model_states.pt,
// [bf16_]zero_pp_rank_R_mp_rank_XX_optim_states.pt, layer_XX-model_states.pt (pipeline),
// expp_rank_R_mp_rank_XX_optim_states.pt and *_model_states.pt of experts (MoE).
bool deepspeed_file_name(std::string_view name) {
  return ends_with(name, "model_states.pt") || ends_with(name, "optim_states.pt");
}

}  // namespace

std::optional<ForeignTag> detect_deepspeed_tag(const std::string& dir) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return std::nullopt;
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return std::nullopt;
  }
  ForeignTag tag;
  std::string_view base(dir);
  while (!base.empty() && base.back() == '/') base.remove_suffix(1);
  size_t slash = base.rfind('/');
  tag.tag = std::string(slash == std::string_view::npos ? base : base.substr(slash + 1));
  bool has_manifest = false;
  while (dirent* e = ::readdir(d)) {
    std::string_view name(e->d_name);
    if (name == kManifestFileName) has_manifest = true;
    if (!deepspeed_file_name(name)) continue;
    struct stat f;
    if (::fstatat(::dirfd(d), e->d_name, &f, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(f.st_mode))
      continue;
    ++tag.files;
    tag.bytes += static_cast<uint64_t>(f.st_size);
    tag.listing.emplace_back(std::string(name), static_cast<uint64_t>(f.st_size));
  }
  ::closedir(d);
  std::sort(tag.listing.begin(), tag.listing.end());
  if (has_manifest || tag.files == 0) return std::nullopt;
  return tag;
}

std::vector<ForeignTag> deepspeed_tags(const std::string& root) {
  std::vector<ForeignTag> out;
  DIR* d = ::opendir(root.c_str());
  if (d == nullptr) return out;
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    std::string name(e->d_name);
    if (validate_tag(name).is_ok()) names.push_back(std::move(name));
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (auto t = detect_deepspeed_tag(checkpoint::join_path(root, name)))
      out.push_back(std::move(*t));
  }
  return out;
}

}  // namespace fastpersist
