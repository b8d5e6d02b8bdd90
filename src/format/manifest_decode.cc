// SPDX-License-Identifier: Apache-2.0
// decode_manifest: checks everything a reader relies on before it opens a data file. Every
// failure is kDataLoss naming the field, because a manifest is only ever written by
// fastpersist: anything else in it means damage or a foreign file. Format 1 and 2 share this
// code; a v1 manifest simply lacks the v2 fields, which then take their v1 meaning.
// Linear in the manifest's size: names are checked through hash maps, never by scans.
#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "fastpersist/checksum.h"
#include "fastpersist/manifest.h"
#include "fastpersist/safetensors.h"
#include "fastpersist/tensor_codec.h"
#include "format/format_internal.h"
#include "format/manifest_fields.h"
#include "format/manifest_names.h"

namespace fastpersist {
namespace {

using format_internal::Fields;
using Json = format_internal::ManifestJson;

std::string dump(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Status decode_version(const Fields& top, Manifest* m) {
  FP_ASSIGN_OR_RETURN(const Json* version, top.get("format_version"));
  if (!version->is_number_integer()) return top.error("format_version", "is not an integer");
  const std::string readable = "this one reads versions " +
                               std::to_string(kManifestOldestFormatVersion) + " to " +
                               std::to_string(kManifestFormatVersion);
  if (version->is_number_unsigned() &&
      version->get<uint64_t>() > static_cast<uint64_t>(kManifestFormatVersion)) {
    return top.error("format_version", "is " + dump(*version) +
                                           ": written by a newer fastpersist (format version " +
                                           dump(*version) + "); " + readable);
  }
  const int64_t v = version->get<int64_t>();
  if (v < kManifestOldestFormatVersion) {
    return top.error("format_version",
                     "is " + dump(*version) + ", which no fastpersist wrote; " + readable);
  }
  m->format_version = static_cast<int>(v);
  return Status::ok();
}

Status decode_header(const Fields& top, Manifest* m) {
  FP_ASSIGN_OR_RETURN(std::string format, top.string("format"));
  if (format != kManifestFormatName) {
    return top.error("format",
                     "is \"" + format + "\", not \"" + std::string(kManifestFormatName) + "\"");
  }
  FP_RETURN_IF_ERROR(decode_version(top, m));
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
  if (m->sequence == 0 || m->sequence > kMaxManifestSequence) {
    // The manager gives the next save the highest sequence + 1: a huge one would wrap it.
    return top.error("sequence", "is " + std::to_string(m->sequence) + ", not 1 to " +
                                     std::to_string(kMaxManifestSequence));
  }
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
  if (m->format_version >= 2) {
    FP_ASSIGN_OR_RETURN(uint64_t world, top.u64("world_size"));
    if (world == 0 || world > std::numeric_limits<uint32_t>::max()) {
      return top.error("world_size", "is " + std::to_string(world) + ", not 1 to 2^32-1");
    }
    m->world_size = static_cast<uint32_t>(world);
    if (top.has("blocking_seconds")) {
      FP_ASSIGN_OR_RETURN(const Json* blocking, top.get("blocking_seconds"));
      if (!blocking->is_number() || !std::isfinite(blocking->get<double>()) ||
          blocking->get<double>() < 0) {
        return top.error("blocking_seconds", "is not a finite number of seconds >= 0");
      }
      m->blocking_seconds = blocking->get<double>();
    }
  }
  return Status::ok();
}

// name -> index into m->files, for the tensors' `file` lookups.
using FileIndex = std::unordered_map<std::string_view, size_t>;

Status decode_files(const Fields& top, const std::string& path, Manifest* m, FileIndex* index) {
  FP_ASSIGN_OR_RETURN(const Json* files, top.array("files"));
  m->files.reserve(files->size());
  for (size_t i = 0; i < files->size(); ++i) {
    const Json& entry = (*files)[i];
    const std::string where = "files[" + std::to_string(i) + "]";
    if (!entry.is_object()) return top.error(where, "is not an object");
    Fields f(entry, where, path);
    ManifestFile file;
    FP_ASSIGN_OR_RETURN(file.name, f.string("name", /*non_empty=*/true));
    // v1 knew only plain names; v2 adds references into other checkpoints of the root.
    std::string problem = m->format_version >= 2
                              ? format_internal::file_name_problem(file.name, m->tag)
                              : format_internal::plain_file_name_problem(file.name);
    if (!problem.empty()) {
      return f.error("name", "\"" + printable(file.name) + "\" " + problem);
    }
    FP_ASSIGN_OR_RETURN(file.role, f.string("role"));
    if (file.role != "tensors" && file.role != "objects") {
      return f.error("role", "is \"" + file.role + "\", not \"tensors\" or \"objects\"");
    }
    FP_ASSIGN_OR_RETURN(file.size, f.u64("size"));
    FP_ASSIGN_OR_RETURN(file.checksum, f.checksum("checksum"));
    FP_ASSIGN_OR_RETURN(file.checksum_bytes, f.u64("checksum_bytes"));
    if (file.checksum_bytes > file.size) return f.error("checksum_bytes", "exceeds the size");
    if (m->format_version >= 2 && entry.contains("rank")) {
      FP_ASSIGN_OR_RETURN(uint64_t rank, f.u64("rank"));
      if (rank >= m->world_size) {
        return f.error("rank", "is " + std::to_string(rank) + ", not below world_size " +
                                   std::to_string(m->world_size));
      }
      file.rank = static_cast<uint32_t>(rank);
    }
    m->files.push_back(std::move(file));
  }
  // Indexed once all are in place: the views point into m->files, which no longer moves.
  index->reserve(m->files.size());
  for (size_t i = 0; i < m->files.size(); ++i) {
    if (!index->emplace(m->files[i].name, i).second) {
      const std::string where = "files[" + std::to_string(i) + "]";
      return Fields((*files)[i], where, path)
          .error("name", "\"" + printable(m->files[i].name) + "\" twice");
    }
  }
  return Status::ok();
}

Result<std::vector<uint64_t>> dims(const Fields& f, std::string_view key) {
  FP_ASSIGN_OR_RETURN(const Json* list, f.array(key));
  std::vector<uint64_t> out;
  out.reserve(list->size());
  for (const Json& dim : *list) {
    if (!dim.is_number_unsigned()) return f.error(key, "holds a non-integer or negative");
    out.push_back(dim.get<uint64_t>());
  }
  return out;
}

// v2 fields of a tensor: how its bytes are stored, and where it sits in a global tensor.
Status decode_tensor_v2(const Fields& f, const Json& entry, ManifestTensor* t) {
  FP_ASSIGN_OR_RETURN(t->encoding, f.string("encoding"));
  if (!format_internal::is_encoding_name(t->encoding)) {
    return f.error("encoding", "\"" + printable(t->encoding) + "\" is not an encoding name");
  }
  FP_ASSIGN_OR_RETURN(t->stored_length, f.u64("stored_length"));
  if (t->encoding == kEncodingRaw && t->stored_length != t->length) {
    return f.error("stored_length", "is " + std::to_string(t->stored_length) +
                                        " but a raw tensor stores its length, " +
                                        std::to_string(t->length));
  }
  // The codecs this build decodes (a newer one is refused for reading, not here: it may expand
  // more).
  const bool known_codec = compression_of_encoding(t->encoding) || t->encoding == kEncodingXorZstd;
  if (known_codec && !codec_expansion_possible(t->length, t->stored_length)) {
    return f.error("stored_length", std::to_string(t->stored_length) +
                                        " encoded bytes cannot hold the " +
                                        std::to_string(t->length) +
                                        " bytes of the tensor (no codec expands more than " +
                                        std::to_string(kCodecMaxExpansion) + " times)");
  }
  if (entry.contains("xxh3_128")) {
    FP_ASSIGN_OR_RETURN(std::string hex, f.string("xxh3_128"));
    t->digest = digest_from_hex(hex);
    if (!t->digest) return f.error("xxh3_128", "is not 32 lowercase hex digits");
  }
  if (entry.contains("global_shape")) {
    FP_ASSIGN_OR_RETURN(t->global_shape, dims(f, "global_shape"));
  }
  if (entry.contains("shard_offsets")) {
    FP_ASSIGN_OR_RETURN(t->shard_offsets, dims(f, "shard_offsets"));
  }
  if (t->global_shape.size() != t->shard_offsets.size()) {
    return f.error("shard_offsets", "has " + std::to_string(t->shard_offsets.size()) +
                                        " entries but global_shape has " +
                                        std::to_string(t->global_shape.size()));
  }
  if (t->global_shape.empty()) return Status::ok();
  if (t->global_shape.size() != t->shape.size()) {
    return f.error("global_shape", "has " + std::to_string(t->global_shape.size()) +
                                       " dimensions but shape has " +
                                       std::to_string(t->shape.size()));
  }
  for (size_t d = 0; d < t->shape.size(); ++d) {
    // offset + extent <= global, written so that it cannot overflow.
    if (t->shard_offsets[d] > t->global_shape[d] ||
        t->shape[d] > t->global_shape[d] - t->shard_offsets[d]) {
      return f.error("shard_offsets",
                     "place dimension " + std::to_string(d) + " at " +
                         std::to_string(t->shard_offsets[d]) + " + " + std::to_string(t->shape[d]) +
                         ", past the global extent " + std::to_string(t->global_shape[d]));
    }
  }
  return Status::ok();
}

// The "xor-zstd" tensor's base (manifest.h, DeltaBase): present exactly for that encoding, in a
// listed tensors file, one step deep (raw or compressed), of the tensor's raw length.
Status decode_delta_base(const Fields& f, const Json& entry, const FileIndex& files,
                         const Manifest& m, ManifestTensor* t) {
  const bool is_delta = t->encoding == kEncodingXorZstd;
  if (!entry.contains("delta_base")) {
    if (is_delta) return f.error("delta_base", "is missing (encoding \"xor-zstd\" needs it)");
    return Status::ok();
  }
  if (!is_delta) return f.error("delta_base", "is only for encoding \"xor-zstd\"");
  FP_ASSIGN_OR_RETURN(const Json* object, f.get("delta_base"));
  if (!object->is_object()) return f.error("delta_base", "is not an object");
  Fields b(*object, f.name("delta_base"), f.path());
  DeltaBase base;
  FP_ASSIGN_OR_RETURN(base.file, b.string("file"));
  auto listed = files.find(base.file);
  if (listed == files.end() || m.files[listed->second].role != "tensors") {
    return b.error("file",
                   "\"" + printable(base.file) + "\" is not listed in 'files' as a tensors file");
  }
  FP_ASSIGN_OR_RETURN(base.offset, b.u64("offset"));
  FP_ASSIGN_OR_RETURN(base.stored_length, b.u64("stored_length"));
  FP_ASSIGN_OR_RETURN(base.encoding, b.string("encoding"));
  if (!compression_of_encoding(base.encoding)) {
    return b.error("encoding", "\"" + printable(base.encoding) +
                                   "\" is not one a base can have (raw, zstd, lz4)");
  }
  if (base.encoding == kEncodingRaw && base.stored_length != t->length) {
    return b.error("stored_length", "is " + std::to_string(base.stored_length) +
                                        " but the raw base of a tensor of " +
                                        std::to_string(t->length) + " bytes stores that many");
  }
  if (!codec_expansion_possible(t->length, base.stored_length)) {
    return b.error("stored_length", std::to_string(base.stored_length) +
                                        " encoded bytes cannot hold the " +
                                        std::to_string(t->length) +
                                        " bytes of the base (no codec expands more than " +
                                        std::to_string(kCodecMaxExpansion) + " times)");
  }
  const uint64_t size = m.files[listed->second].size;
  if (base.offset > size || base.stored_length > size - base.offset) {
    return b.error("stored_length", std::to_string(base.stored_length) + " with offset " +
                                        std::to_string(base.offset) + " runs past the end of \"" +
                                        printable(base.file) + "\" (" + std::to_string(size) +
                                        " bytes)");
  }
  FP_ASSIGN_OR_RETURN(base.checksum, b.checksum("checksum"));
  t->delta_base = std::move(base);
  return Status::ok();
}

Status decode_tensors(const Fields& top, const std::string& path, const FileIndex& files,
                      Manifest* m) {
  FP_ASSIGN_OR_RETURN(const Json* tensors, top.array("tensors"));
  m->tensors.reserve(tensors->size());
  std::unordered_set<std::string> seen;
  seen.reserve(tensors->size());
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
    FP_ASSIGN_OR_RETURN(t.shape, dims(f, "shape"));
    FP_ASSIGN_OR_RETURN(t.file, f.string("file"));
    auto listed = files.find(t.file);
    if (listed == files.end() || m->files[listed->second].role != "tensors") {
      return f.error("file", "\"" + t.file + "\" is not listed in 'files' as a tensors file");
    }
    const ManifestFile& file = m->files[listed->second];
    FP_ASSIGN_OR_RETURN(t.offset, f.u64("offset"));
    FP_ASSIGN_OR_RETURN(t.length, f.u64("length"));
    std::optional<uint64_t> nbytes = format_internal::tensor_nbytes(t.shape, *element);
    if (!nbytes || *nbytes != t.length) {
      return f.error("length", "is " + std::to_string(t.length) + " but dtype and shape need " +
                                   (nbytes ? std::to_string(*nbytes) : "more than 2^64"));
    }
    t.stored_length = t.length;  // v1: every tensor is raw
    if (m->format_version >= 2) {
      FP_RETURN_IF_ERROR(decode_tensor_v2(f, entry, &t));
      FP_RETURN_IF_ERROR(decode_delta_base(f, entry, files, *m, &t));
    }
    const char* stored_field = m->format_version >= 2 ? "stored_length" : "length";
    if (t.offset > file.size || t.stored_length > file.size - t.offset) {
      return f.error(stored_field, std::to_string(t.stored_length) + " with offset " +
                                       std::to_string(t.offset) + " runs past the end of \"" +
                                       t.file + "\" (" + std::to_string(file.size) + " bytes)");
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

// A manifest written without checksums holds 0 in every checksum field. One that says "none"
// but holds checksums was altered (to make `verify` skip them): readers would otherwise
// disagree on whether it is intact.
Status check_no_checksums(const Fields& top, const Manifest& m) {
  if (m.checksum_algorithm != kNoChecksum) return Status::ok();
  for (size_t i = 0; i < m.files.size(); ++i) {
    if (m.files[i].checksum != 0) {
      return top.error("checksum_algorithm", "is \"none\" but files[" + std::to_string(i) +
                                                 "].checksum is set: the manifest was altered");
    }
  }
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    if (m.tensors[i].checksum != 0) {
      return top.error("checksum_algorithm", "is \"none\" but tensors[" + std::to_string(i) +
                                                 "].checksum is set: the manifest was altered");
    }
  }
  return Status::ok();
}

}  // namespace

Result<Manifest> decode_manifest(std::string_view json, const std::string& path) {
  std::string why;
  std::optional<Json> doc = format_internal::parse_json_strict<Json>(json, &why);
  if (!doc) return Status(StatusCode::kDataLoss, "bad manifest: " + why).with_path(path);
  if (!doc->is_object()) {
    return Status(StatusCode::kDataLoss, "manifest is not a JSON object").with_path(path);
  }
  Fields top(*doc, "", path);
  Manifest m;
  FileIndex files;
  FP_RETURN_IF_ERROR(decode_header(top, &m));
  FP_RETURN_IF_ERROR(decode_files(top, path, &m, &files));
  FP_RETURN_IF_ERROR(decode_tensors(top, path, files, &m));
  FP_RETURN_IF_ERROR(check_no_checksums(top, m));
  return m;
}

}  // namespace fastpersist
