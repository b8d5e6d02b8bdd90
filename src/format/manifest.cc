// SPDX-License-Identifier: Apache-2.0
// manifest.json: encoding (always the current format version), the model fingerprint, reading
// the file, and where its file names lie. Decoding is manifest_decode.cc.
#include "fastpersist/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <new>

#include "common/regular_file.h"
#include "common/unique_fd.h"
#include "fastpersist/checksum.h"
#include "format/format_internal.h"
#include "format/manifest_fields.h"

namespace fastpersist {
namespace {

using Json = format_internal::ManifestJson;

std::string dump(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Json file_json(const ManifestFile& f) {
  Json out = {{"name", f.name},
              {"role", f.role},
              {"size", f.size},
              {"checksum", checksum_to_hex(f.checksum)},
              {"checksum_bytes", f.checksum_bytes}};
  if (f.rank) out["rank"] = *f.rank;
  return out;
}

Json tensor_json(const ManifestTensor& t) {
  Json out = {{"name", t.name},
              {"dtype", t.dtype},
              {"shape", t.shape},
              {"file", t.file},
              {"offset", t.offset},
              {"length", t.length},
              {"checksum", checksum_to_hex(t.checksum)},
              {"encoding", t.encoding},
              {"stored_length", t.stored_length}};
  // Only a rank's block of a distributed tensor has them: whole tensors stay one short line.
  if (!t.global_shape.empty() || !t.shard_offsets.empty()) {
    out["global_shape"] = t.global_shape;
    out["shard_offsets"] = t.shard_offsets;
  }
  if (t.digest) out["xxh3_128"] = digest_to_hex(*t.digest);
  if (t.delta_base) {
    const DeltaBase& b = *t.delta_base;
    out["delta_base"] = {{"file", b.file},
                         {"offset", b.offset},
                         {"stored_length", b.stored_length},
                         {"encoding", b.encoding},
                         {"checksum", checksum_to_hex(b.checksum)}};
  }
  return out;
}

}  // namespace

uint64_t Manifest::tensor_bytes() const {
  uint64_t total = 0;
  for (const ManifestTensor& t : tensors) total += t.length;
  return total;
}

std::optional<size_t> Manifest::find_tensor(std::string_view name) const {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == name) return i;
  }
  return std::nullopt;
}

const ManifestFile* Manifest::find_file(std::string_view name) const {
  for (const ManifestFile& f : files) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string manifest_fingerprint(const std::vector<ManifestTensor>& tensors) {
  std::vector<std::string> lines;
  lines.reserve(tensors.size());
  for (const ManifestTensor& t : tensors) {
    std::string line = t.name + ":" + t.dtype + ":";
    for (size_t i = 0; i < t.shape.size(); ++i) line += (i ? "," : "") + std::to_string(t.shape[i]);
    lines.push_back(std::move(line));
  }
  std::sort(lines.begin(), lines.end());
  std::string joined;
  for (size_t i = 0; i < lines.size(); ++i) joined += (i ? "\n" : "") + lines[i];
  return checksum_to_hex(xxh3_64(joined.data(), joined.size()));
}

namespace {
std::string dims(const std::vector<uint64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}
}  // namespace

std::string manifest_content_hash(const Manifest& manifest) {
  if (manifest.checksum_algorithm == kNoChecksum) return "";
  std::vector<std::string> lines;
  lines.reserve(manifest.tensors.size());
  for (const ManifestTensor& t : manifest.tensors) {
    const std::vector<uint64_t>& shape = t.global_shape.empty() ? t.shape : t.global_shape;
    lines.push_back(t.name + ":" + t.dtype + ":" + dims(shape) + ":" + dims(t.shard_offsets) + ":" +
                    checksum_to_hex(t.checksum));
  }
  std::sort(lines.begin(), lines.end());
  Xxh3Stream hash;
  for (const std::string& line : lines) {
    hash.update(line.data(), line.size());
    hash.update("\n", 1);
  }
  return checksum_to_hex(hash.digest());
}

Status check_metadata_json(std::string_view json) {
  std::string why;
  // One level less than a manifest may nest: the metadata sits inside the manifest's object.
  std::optional<Json> metadata =
      format_internal::parse_json_strict<Json>(json, &why, format_internal::kMaxJsonDepth - 1);
  if (!metadata) return Status(StatusCode::kInvalidArgument, "checkpoint metadata is " + why);
  if (!metadata->is_object()) {
    return Status(StatusCode::kInvalidArgument, "checkpoint metadata must be a JSON object");
  }
  return Status::ok();
}

std::string encode_manifest(const Manifest& m) {
  // metadata_json is checked by the caller (check_metadata_json); should it fail those checks,
  // {} is written rather than a manifest that no reader would accept.
  std::string why;
  Json metadata = format_internal::parse_json_strict<Json>(m.metadata_json, &why,
                                                           format_internal::kMaxJsonDepth - 1)
                      .value_or(Json::object());
  if (!metadata.is_object()) metadata = Json::object();
  const std::pair<std::string_view, Json> head[] = {
      {"format", std::string(kManifestFormatName)},
      {"format_version", kManifestFormatVersion},
      {"tag", m.tag},
      {"step", m.step ? Json(*m.step) : Json(nullptr)},
      {"sequence", m.sequence},
      {"created_unix", m.created_unix},
      {"checksum_algorithm", m.checksum_algorithm},
      {"versions", m.versions},
      {"fingerprint", m.fingerprint},
      {"metadata", std::move(metadata)},
      {"aliases", m.aliases},
      {"world_size", m.world_size},
  };
  // One top-level field, file or tensor per line: readable, and diffs of two manifests line up.
  std::string out = "{\n";
  for (const auto& [key, value] : head) out += "  " + dump(Json(key)) + ": " + dump(value) + ",\n";
  if (m.blocking_seconds)
    out += "  \"blocking_seconds\": " + dump(Json(*m.blocking_seconds)) + ",\n";
  auto list = [&out](std::string_view key, const std::vector<Json>& items, bool last) {
    out += "  \"" + std::string(key) + "\": [";
    for (size_t i = 0; i < items.size(); ++i) out += (i ? ",\n    " : "\n    ") + dump(items[i]);
    out += items.empty() ? "]" : "\n  ]";
    out += last ? "\n" : ",\n";
  };
  std::vector<Json> items;
  for (const ManifestFile& f : m.files) items.push_back(file_json(f));
  list("files", items, false);
  items.clear();
  for (const ManifestTensor& t : m.tensors) items.push_back(tensor_json(t));
  list("tensors", items, true);
  return out + "}\n";
}

std::string_view referenced_checkpoint(const ManifestFile& file) {
  size_t slash = file.name.find('/');
  if (slash == std::string::npos) return {};
  return std::string_view(file.name).substr(0, slash);
}

std::string manifest_file_path(const std::string& checkpoint_dir, const ManifestFile& file) {
  std::string_view dir = checkpoint_dir;
  if (referenced_checkpoint(file).empty()) {
    return std::string(dir) + (dir.ends_with('/') ? "" : "/") + file.name;
  }
  // The root is the checkpoint directory's parent.
  while (dir.size() > 1 && dir.ends_with('/')) dir.remove_suffix(1);
  size_t slash = dir.rfind('/');
  std::string root = slash == std::string_view::npos ? std::string(".")
                     : slash == 0                    ? std::string("/")
                                                     : std::string(dir.substr(0, slash));
  return root + (root.ends_with('/') ? "" : "/") + file.name;
}

Result<Manifest> read_manifest(const std::string& dir) {
  const std::string path = dir + "/" + std::string(kManifestFileName);
  FP_ASSIGN_OR_RETURN(RegularFile file, open_regular_file(path, Symlinks::kRefuse, "the manifest"));
  if (file.size > kMaxManifestBytes) {
    return Status(StatusCode::kDataLoss, "the manifest is " + std::to_string(file.size) +
                                             " bytes, more than any manifest holds (" +
                                             std::to_string(kMaxManifestBytes) + ")")
        .with_path(path);
  }
  std::string text;
  try {
    text.resize(static_cast<size_t>(file.size));
  } catch (const std::bad_alloc&) {
    return Status::from_errno(ENOMEM, "cannot allocate " + std::to_string(file.size) +
                                          " bytes to read the manifest")
        .with_path(path);
  }
  FP_RETURN_IF_ERROR(
      format_internal::pread_exact(file.fd.get(), text.data(), text.size(), 0, path));
  return decode_manifest(text, path);
}

}  // namespace fastpersist
