// SPDX-License-Identifier: Apache-2.0
// manifest.json: encoding, and decoding that checks everything a reader will rely on before it
// opens a data file. Every decoding failure is kDataLoss naming the field, because a manifest
// is only ever written by fastpersist: anything else in it means damage or a foreign file.
#include "fastpersist/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <set>

#include "common/unique_fd.h"
#include "fastpersist/checksum.h"
#include "fastpersist/safetensors.h"
#include "format/format_internal.h"
#include "format/manifest_fields.h"

namespace fastpersist {
namespace {

using format_internal::Fields;
using Json = format_internal::ManifestJson;

std::string dump(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Json file_json(const ManifestFile& f) {
  return {{"name", f.name},
          {"role", f.role},
          {"size", f.size},
          {"checksum", checksum_to_hex(f.checksum)},
          {"checksum_bytes", f.checksum_bytes}};
}

Json tensor_json(const ManifestTensor& t) {
  return {{"name", t.name},
          {"dtype", t.dtype},
          {"shape", t.shape},
          {"file", t.file},
          {"offset", t.offset},
          {"length", t.length},
          {"checksum", checksum_to_hex(t.checksum)}};
}

Status decode_header(const Fields& top, Manifest* m) {
  FP_ASSIGN_OR_RETURN(std::string format, top.string("format"));
  if (format != kManifestFormatName) {
    return top.error("format",
                     "is \"" + format + "\", not \"" + std::string(kManifestFormatName) + "\"");
  }
  FP_ASSIGN_OR_RETURN(const Json* version, top.get("format_version"));
  if (!version->is_number_integer()) return top.error("format_version", "is not an integer");
  if (version->is_number_unsigned() &&
      version->get<uint64_t>() > static_cast<uint64_t>(kManifestFormatVersion)) {
    return top.error("format_version", "is " + dump(*version) +
                                           ": written by a newer fastpersist (this one reads " +
                                           std::to_string(kManifestFormatVersion) + ")");
  }
  if (version->get<int64_t>() != kManifestFormatVersion) {
    return top.error("format_version", "is " + dump(*version) + ", which no fastpersist wrote");
  }
  m->format_version = kManifestFormatVersion;
  FP_ASSIGN_OR_RETURN(m->tag, top.string("tag", /*non_empty=*/true));
  FP_ASSIGN_OR_RETURN(const Json* step, top.get("step"));
  if (step->is_number_unsigned()) {
    if (step->get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()}) {
      return top.error("step", "does not fit in 64 bits");
    }
    m->step = step->get<int64_t>();
  } else if (step->is_number_integer()) {
    m->step = step->get<int64_t>();
  } else if (!step->is_null()) {
    return top.error("step", "is neither an integer nor null");
  }
  FP_ASSIGN_OR_RETURN(m->sequence, top.u64("sequence"));
  FP_ASSIGN_OR_RETURN(const Json* created, top.get("created_unix"));
  if (!created->is_number()) return top.error("created_unix", "is not a number");
  m->created_unix = created->get<double>();
  FP_ASSIGN_OR_RETURN(m->checksum_algorithm, top.string("checksum_algorithm"));
  if (m->checksum_algorithm != kChecksumAlgorithm && m->checksum_algorithm != kNoChecksum) {
    return top.error("checksum_algorithm", "is \"" + m->checksum_algorithm +
                                               "\"; this reader knows only \"" +
                                               std::string(kChecksumAlgorithm) + "\"");
  }
  FP_ASSIGN_OR_RETURN(m->versions, top.string_map("versions"));
  FP_ASSIGN_OR_RETURN(m->fingerprint, top.string("fingerprint"));
  FP_ASSIGN_OR_RETURN(const Json* metadata, top.get("metadata"));
  if (!metadata->is_object()) return top.error("metadata", "is not an object");
  m->metadata_json = dump(*metadata);
  FP_ASSIGN_OR_RETURN(m->aliases, top.string_map("aliases"));
  return Status::ok();
}

Status decode_files(const Fields& top, const std::string& path, Manifest* m) {
  FP_ASSIGN_OR_RETURN(const Json* files, top.array("files"));
  std::set<std::string> seen;
  for (size_t i = 0; i < files->size(); ++i) {
    const Json& entry = (*files)[i];
    const std::string where = "files[" + std::to_string(i) + "]";
    if (!entry.is_object()) return top.error(where, "is not an object");
    Fields f(entry, where, path);
    ManifestFile file;
    FP_ASSIGN_OR_RETURN(file.name, f.string("name", /*non_empty=*/true));
    if (file.name.find('/') != std::string::npos || file.name == "." || file.name == "..") {
      return f.error("name", "\"" + file.name + "\" is not a plain file name");
    }
    if (!seen.insert(file.name).second) return f.error("name", "\"" + file.name + "\" twice");
    FP_ASSIGN_OR_RETURN(file.role, f.string("role"));
    if (file.role != "tensors" && file.role != "objects") {
      return f.error("role", "is \"" + file.role + "\", not \"tensors\" or \"objects\"");
    }
    FP_ASSIGN_OR_RETURN(file.size, f.u64("size"));
    FP_ASSIGN_OR_RETURN(file.checksum, f.checksum("checksum"));
    FP_ASSIGN_OR_RETURN(file.checksum_bytes, f.u64("checksum_bytes"));
    if (file.checksum_bytes > file.size) return f.error("checksum_bytes", "exceeds the size");
    m->files.push_back(std::move(file));
  }
  return Status::ok();
}

Status decode_tensors(const Fields& top, const std::string& path, Manifest* m) {
  FP_ASSIGN_OR_RETURN(const Json* tensors, top.array("tensors"));
  std::set<std::string> seen;
  for (size_t i = 0; i < tensors->size(); ++i) {
    const Json& entry = (*tensors)[i];
    const std::string where = "tensors[" + std::to_string(i) + "]";
    if (!entry.is_object()) return top.error(where, "is not an object");
    Fields f(entry, where, path);
    ManifestTensor t;
    FP_ASSIGN_OR_RETURN(t.name, f.string("name", /*non_empty=*/true));
    if (!seen.insert(t.name).second) return f.error("name", "\"" + t.name + "\" twice");
    FP_ASSIGN_OR_RETURN(t.dtype, f.string("dtype"));
    std::optional<size_t> element = safetensors_dtype_size(t.dtype);
    if (!element) return f.error("dtype", "\"" + t.dtype + "\" is not a safetensors dtype");
    FP_ASSIGN_OR_RETURN(const Json* shape, f.array("shape"));
    for (const Json& dim : *shape) {
      if (!dim.is_number_unsigned()) return f.error("shape", "holds a non-integer or negative");
      t.shape.push_back(dim.get<uint64_t>());
    }
    FP_ASSIGN_OR_RETURN(t.file, f.string("file"));
    const ManifestFile* file = m->find_file(t.file);
    if (file == nullptr || file->role != "tensors") {
      return f.error("file", "\"" + t.file + "\" is not listed in 'files' as a tensors file");
    }
    FP_ASSIGN_OR_RETURN(t.offset, f.u64("offset"));
    FP_ASSIGN_OR_RETURN(t.length, f.u64("length"));
    if (t.offset > file->size || t.length > file->size - t.offset) {
      return f.error("length", "with offset " + std::to_string(t.offset) +
                                   " runs past the end of \"" + t.file + "\" (" +
                                   std::to_string(file->size) + " bytes)");
    }
    std::optional<uint64_t> nbytes = format_internal::tensor_nbytes(t.shape, *element);
    if (!nbytes || *nbytes != t.length) {
      return f.error("length", "is " + std::to_string(t.length) + " but dtype and shape need " +
                                   (nbytes ? std::to_string(*nbytes) : "more than 2^64"));
    }
    FP_ASSIGN_OR_RETURN(t.checksum, f.checksum("checksum"));
    m->tensors.push_back(std::move(t));
  }
  for (const auto& [alias, target] : m->aliases) {
    if (seen.count(alias) != 0) {
      return top.error("aliases." + alias, "is also the name of a stored tensor");
    }
    if (seen.count(target) == 0) {
      return top.error("aliases." + alias, "points at \"" + target + "\", not a stored tensor");
    }
  }
  return Status::ok();
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

std::string encode_manifest(const Manifest& m) {
  // metadata_json is checked by the caller; should it not be a JSON object, {} is written rather
  // than a manifest that no reader would accept.
  Json metadata = Json::parse(m.metadata_json, nullptr, /*allow_exceptions=*/false);
  if (!metadata.is_object()) metadata = Json::object();
  const std::pair<std::string_view, Json> head[] = {
      {"format", std::string(kManifestFormatName)},
      {"format_version", m.format_version},
      {"tag", m.tag},
      {"step", m.step ? Json(*m.step) : Json(nullptr)},
      {"sequence", m.sequence},
      {"created_unix", m.created_unix},
      {"checksum_algorithm", m.checksum_algorithm},
      {"versions", m.versions},
      {"fingerprint", m.fingerprint},
      {"metadata", std::move(metadata)},
      {"aliases", m.aliases},
  };
  // One top-level field, file or tensor per line: readable, and diffs of two manifests line up.
  std::string out = "{\n";
  for (const auto& [key, value] : head) out += "  " + dump(Json(key)) + ": " + dump(value) + ",\n";
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

Result<Manifest> decode_manifest(std::string_view json, const std::string& path) {
  std::string why;
  std::optional<Json> doc = format_internal::parse_json_strict<Json>(json, &why);
  if (!doc) return Status(StatusCode::kDataLoss, "bad manifest: " + why).with_path(path);
  if (!doc->is_object()) {
    return Status(StatusCode::kDataLoss, "manifest is not a JSON object").with_path(path);
  }
  Fields top(*doc, "", path);
  Manifest m;
  FP_RETURN_IF_ERROR(decode_header(top, &m));
  FP_RETURN_IF_ERROR(decode_files(top, path, &m));
  FP_RETURN_IF_ERROR(decode_tensors(top, path, &m));
  return m;
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
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::from_errno(errno, "cannot open the manifest").with_path(path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::from_errno(errno, "fstat failed").with_path(path);
  std::string text(static_cast<size_t>(st.st_size), '\0');
  FP_RETURN_IF_ERROR(format_internal::pread_exact(fd.get(), text.data(), text.size(), 0, path));
  return decode_manifest(text, path);
}

}  // namespace fastpersist
