// SPDX-License-Identifier: Apache-2.0
// `fastpersist inspect PATH`: what a checkpoint directory's manifest says (tag, step, versions,
// metadata, fingerprint, files, tensors), what a safetensors file's header says, or, for a
// root, the list of its checkpoints. Reads manifests and headers only; no tensor data.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint_paths.h"
#include "command.h"
#include "fastpersist/checksum.h"
#include "fastpersist/foreign_checkpoint.h"
#include "fastpersist/manifest.h"
#include "fastpersist/safetensors.h"
#include "format.h"

namespace fastpersist::cli {
namespace {

constexpr const char* kCommand = "inspect";

void row(const std::string& label, const std::string& value) {
  std::string left = "  " + label + " ";
  if (left.size() < 18) left += std::string(18 - left.size(), '.');
  std::cout << left << " " << value << "\n";
}

void print_table(const std::vector<std::vector<std::string>>& rows, const std::string& indent) {
  std::vector<size_t> widths;
  for (const auto& r : rows) {
    if (widths.size() < r.size()) widths.resize(r.size(), 0);
    for (size_t i = 0; i < r.size(); ++i) widths[i] = std::max(widths[i], r[i].size());
  }
  for (const auto& r : rows) {
    std::string line = indent;
    for (size_t i = 0; i < r.size(); ++i)
      line += i + 1 < r.size() ? pad(r[i], widths[i] + 2) : r[i];
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::cout << line << "\n";
  }
}

std::string count(size_t n, const std::string& singular, const std::string& plural) {
  return std::to_string(n) + " " + (n == 1 ? singular : plural);
}

// Per dtype: how many tensors and bytes ("F32: 10 tensors, 1.50 MiB").
struct DtypeTotal {
  size_t tensors = 0;
  uint64_t bytes = 0;
  uint64_t stored = 0;  // encodings: bytes as stored
};

// raw / stored (1 for nothing stored).
double ratio(uint64_t raw, uint64_t stored) {
  return stored == 0 ? 1.0 : static_cast<double>(raw) / static_cast<double>(stored);
}

std::string ratio_text(uint64_t raw, uint64_t stored) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2fx", ratio(raw, stored));
  return text;
}

std::string dtype_summary(const std::map<std::string, DtypeTotal>& totals) {
  std::string text;
  for (const auto& [dtype, t] : totals) {
    if (!text.empty()) text += ", ";
    text += dtype + " " + std::to_string(t.tensors) + " (" + format_bytes(t.bytes) + ")";
  }
  return text.empty() ? "-" : text;
}

nlohmann::ordered_json dtype_json(const std::map<std::string, DtypeTotal>& totals) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [dtype, t] : totals) j[dtype] = {{"tensors", t.tensors}, {"bytes", t.bytes}};
  return j;
}

// ------------------------------------------------------------------ checkpoint directory
// What `inspect` reports of a checkpoint directory beyond its manifest's fields: the state of its
// files and the tensor totals, gathered before anything is printed.
struct CheckpointFacts {
  std::vector<std::string> problems;
  std::vector<int64_t> actual_sizes;  // per manifest file; -1 when it is missing
  uint64_t total_bytes = 0;           // all files, as the manifest records them
  std::map<std::string, DtypeTotal> dtypes;
  // How the tensors are stored: raw, or compressed (tensor_codec.h), with the ratio.
  std::map<std::string, DtypeTotal> encodings;
  uint64_t stored_bytes = 0;
  // An incremental checkpoint: the tensors it takes from other checkpoints (its base), per tag.
  std::map<std::string, DtypeTotal> references;
  nlohmann::ordered_json metadata;  // the user metadata, as text when it is not JSON
};

// The cheap checks list() applies: every file present with its recorded size.
void check_files(const std::string& dir, const Manifest& m, CheckpointFacts* facts) {
  for (const ManifestFile& f : m.files) {
    facts->total_bytes += f.size;
    struct stat st {};
    std::string path = manifest_file_path(dir, f);  // a v2 name may refer into another checkpoint
    if (::stat(path.c_str(), &st) != 0) {
      facts->problems.push_back(f.name + " is missing");
      facts->actual_sizes.push_back(-1);
      continue;
    }
    facts->actual_sizes.push_back(static_cast<int64_t>(st.st_size));
    if (static_cast<uint64_t>(st.st_size) != f.size) {
      facts->problems.push_back(f.name + " is " + std::to_string(st.st_size) +
                                " bytes, the manifest says " + std::to_string(f.size));
    }
  }
}

// Tensors and bytes per dtype and per encoding (with the bytes as stored).
void total_tensors(const Manifest& m, CheckpointFacts* facts) {
  for (const ManifestTensor& t : m.tensors) {
    facts->dtypes[t.dtype].tensors++;
    facts->dtypes[t.dtype].bytes += t.length;
  }
  for (const ManifestTensor& t : m.tensors) {
    DtypeTotal& e = facts->encodings[t.encoding];
    e.tensors++;
    e.bytes += t.length;
    e.stored += t.stored_length;
    facts->stored_bytes += t.stored_length;
  }
}

// Per checkpoint that `m`'s files refer into: the tensors (and their bytes) read from there.
std::map<std::string, DtypeTotal> referenced_checkpoints(const Manifest& m) {
  std::map<std::string, DtypeTotal> references;
  std::map<std::string_view, std::string_view> base_of;  // file name -> tag it refers into
  for (const ManifestFile& f : m.files) {
    if (!referenced_checkpoint(f).empty()) base_of[f.name] = referenced_checkpoint(f);
  }
  for (const ManifestTensor& t : m.tensors) {
    auto it = base_of.find(t.file);
    if (it == base_of.end()) continue;
    DtypeTotal& r = references[std::string(it->second)];
    r.tensors++;
    r.bytes += t.length;
  }
  return references;
}

CheckpointFacts gather_checkpoint_facts(const std::string& dir, const Manifest& m) {
  CheckpointFacts facts;
  check_files(dir, m, &facts);
  total_tensors(m, &facts);
  facts.references = referenced_checkpoints(m);
  facts.metadata = nlohmann::ordered_json::parse(m.metadata_json, nullptr, false);
  if (facts.metadata.is_discarded()) facts.metadata = m.metadata_json;
  return facts;
}

nlohmann::ordered_json files_json(const Manifest& m, const CheckpointFacts& facts) {
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (size_t i = 0; i < m.files.size(); ++i) {
    const ManifestFile& f = m.files[i];
    const int64_t actual = facts.actual_sizes[i];
    nlohmann::ordered_json file = {{"name", f.name},
                                   {"role", f.role},
                                   {"size", f.size},
                                   {"present", actual >= 0},
                                   {"size_ok", actual == static_cast<int64_t>(f.size)}};
    if (f.rank) file["rank"] = *f.rank;
    files.push_back(std::move(file));
  }
  return files;
}

nlohmann::ordered_json tensor_json(const ManifestTensor& t) {
  nlohmann::ordered_json tensor = {{"name", t.name},
                                   {"dtype", t.dtype},
                                   {"shape", t.shape},
                                   {"bytes", t.length},
                                   {"file", t.file},
                                   {"offset", t.offset},
                                   {"checksum", checksum_to_hex(t.checksum)},
                                   {"encoding", t.encoding},
                                   {"stored_bytes", t.stored_length},
                                   {"ratio", ratio(t.length, t.stored_length)}};
  if (!t.global_shape.empty()) {
    tensor["global_shape"] = t.global_shape;
    tensor["shard_offsets"] = t.shard_offsets;
  }
  return tensor;
}

nlohmann::ordered_json checkpoint_json(const std::string& dir, const Manifest& m,
                                       const CheckpointFacts& facts, bool tensors) {
  nlohmann::ordered_json j;
  j["kind"] = "checkpoint";
  j["path"] = dir;
  j["tag"] = m.tag;
  j["step"] = m.step ? nlohmann::ordered_json(*m.step) : nlohmann::ordered_json(nullptr);
  j["sequence"] = m.sequence;
  j["created_unix"] = m.created_unix;
  j["created"] = iso_time_utc(m.created_unix);
  j["format_version"] = m.format_version;
  j["checksum_algorithm"] = m.checksum_algorithm;
  j["versions"] = m.versions;
  j["fingerprint"] = m.fingerprint;
  j["metadata"] = facts.metadata;
  j["aliases"] = m.aliases;
  j["world_size"] = m.world_size;
  j["num_tensors"] = m.tensors.size();
  j["tensor_bytes"] = m.tensor_bytes();
  j["total_bytes"] = facts.total_bytes;
  j["dtypes"] = dtype_json(facts.dtypes);
  j["stored_bytes"] = facts.stored_bytes;
  j["compression_ratio"] = ratio(m.tensor_bytes(), facts.stored_bytes);
  j["references"] = nlohmann::ordered_json::object();
  for (const auto& [tag, r] : facts.references)
    j["references"][tag] = {{"tensors", r.tensors}, {"bytes", r.bytes}};
  j["encodings"] = nlohmann::ordered_json::object();
  for (const auto& [name, e] : facts.encodings) {
    j["encodings"][name] = {{"tensors", e.tensors}, {"bytes", e.bytes}, {"stored_bytes", e.stored}};
  }
  j["files"] = files_json(m, facts);
  j["problems"] = facts.problems;
  if (tensors) {
    j["tensors"] = nlohmann::ordered_json::array();
    for (const ManifestTensor& t : m.tensors) j["tensors"].push_back(tensor_json(t));
  }
  return j;
}

// "raw 3 tensors 1 KiB -> 1 KiB, zstd 2 tensors ...": each encoding's bytes before and after.
std::string stored_summary(const std::map<std::string, DtypeTotal>& encodings) {
  std::string stored;
  for (const auto& [name, e] : encodings) {
    stored += (stored.empty() ? "" : ", ") + name + " " + count(e.tensors, "tensor", "tensors") +
              " " + format_bytes(e.bytes) + " -> " + format_bytes(e.stored);
  }
  return stored;
}

// The "checkpoint DIR" heading and its labelled rows (tag ... size).
void print_checkpoint_summary(const std::string& dir, const Manifest& m,
                              const CheckpointFacts& facts) {
  std::cout << "checkpoint " << dir << "\n";
  row("tag", m.tag);
  row("step", m.step ? std::to_string(*m.step) : "-");
  row("sequence", std::to_string(m.sequence));
  row("created", iso_time_utc(m.created_unix));
  row("format", std::string(kManifestFormatName) + " v" + std::to_string(m.format_version) +
                    ", checksums " + m.checksum_algorithm);
  std::string versions;
  for (const auto& [k, v] : m.versions) versions += (versions.empty() ? "" : ", ") + k + " " + v;
  row("versions", versions.empty() ? "-" : versions);
  row("fingerprint", m.fingerprint);
  if (m.world_size > 1) row("world", count(m.world_size, "rank", "ranks"));
  row("metadata", facts.metadata.dump());
  row("tensors", count(m.tensors.size(), "tensor", "tensors") + ", " +
                     format_bytes(m.tensor_bytes()) +
                     (m.aliases.empty() ? "" : ", " + count(m.aliases.size(), "alias", "aliases")));
  row("dtypes", dtype_summary(facts.dtypes));
  if (facts.encodings.size() > 1 || !facts.encodings.contains(std::string(kEncodingRaw))) {
    row("stored", stored_summary(facts.encodings) + " (" +
                      ratio_text(m.tensor_bytes(), facts.stored_bytes) + " smaller)");
  }
  for (const auto& [tag, r] : facts.references) {
    row("base", tag + ": " + count(r.tensors, "tensor", "tensors") + ", " + format_bytes(r.bytes) +
                    " referenced, not stored here (an incremental checkpoint)");
  }
  row("size", format_bytes(facts.total_bytes) + " in " + count(m.files.size(), "file", "files"));
}

void print_checkpoint_files(const Manifest& m, const CheckpointFacts& facts) {
  std::cout << "files:\n";
  std::vector<std::vector<std::string>> file_rows;
  for (size_t i = 0; i < m.files.size(); ++i) {
    const ManifestFile& f = m.files[i];
    const int64_t actual = facts.actual_sizes[i];
    std::string state = actual < 0                               ? "MISSING"
                        : actual != static_cast<int64_t>(f.size) ? "WRONG SIZE"
                                                                 : "";
    file_rows.push_back({f.name, f.role, format_bytes(f.size), state});
  }
  print_table(file_rows, "  ");
}

// `--tensors`: every tensor, then the aliases (tied weights).
void print_checkpoint_tensors(const Manifest& m) {
  std::cout << "tensors:\n";
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "DTYPE", "SHAPE", "SIZE", "ENCODING", "RATIO", "FILE"}};
  for (const ManifestTensor& t : m.tensors) {
    rows.push_back({t.name, t.dtype, shape_string(t.shape), format_bytes(t.length), t.encoding,
                    ratio_text(t.length, t.stored_length), t.file});
  }
  print_table(rows, "  ");
  if (!m.aliases.empty()) {
    std::cout << "aliases (stored once, shared with):\n";
    for (const auto& [alias, target] : m.aliases)
      std::cout << "  " << alias << " -> " << target << "\n";
  }
}

int inspect_checkpoint(const std::string& dir, bool json, bool tensors) {
  auto manifest = read_manifest(dir);
  if (!manifest.is_ok()) {
    if (manifest.status().code() == StatusCode::kNotFound) {
      return fail(kCommand,
                  dir +
                      " has no manifest.json: not a committed checkpoint (a save that never "
                      "finished, or a damaged one; `fastpersist verify` says more)",
                  kExitFailure);
    }
    return fail(kCommand,
                "cannot read the manifest of " + dir + ": " + manifest.status().to_string(),
                kExitFailure);
  }
  const Manifest& m = *manifest;
  const CheckpointFacts facts = gather_checkpoint_facts(dir, m);
  if (json) {
    std::cout << json_text(checkpoint_json(dir, m, facts, tensors)) << "\n";
    std::cout.flush();
    return kExitOk;
  }
  print_checkpoint_summary(dir, m, facts);
  print_checkpoint_files(m, facts);
  if (tensors) print_checkpoint_tensors(m);
  for (const std::string& p : facts.problems) std::cout << "problem: " << p << "\n";
  // Describing worked; whether the bytes are intact is `verify`'s question (and exit code).
  std::cout.flush();
  return kExitOk;
}

// ------------------------------------------------------------------ safetensors file
int inspect_safetensors(const std::string& path, bool json, bool tensors) {
  auto header = read_safetensors_header(path);
  if (!header.is_ok()) {
    return fail(kCommand, path + " is not a valid safetensors file: " + header.status().to_string(),
                kExitFailure);
  }
  const SafetensorsHeader& h = *header;
  std::map<std::string, DtypeTotal> dtypes;
  for (const SafetensorsTensor& t : h.tensors) {
    dtypes[t.dtype].tensors++;
    dtypes[t.dtype].bytes += t.nbytes();
  }
  if (json) {
    nlohmann::ordered_json j;
    j["kind"] = "safetensors";
    j["path"] = path;
    j["file_bytes"] = h.file_bytes();
    j["data_start"] = h.data_start;
    j["data_bytes"] = h.data_bytes;
    j["num_tensors"] = h.tensors.size();
    j["dtypes"] = dtype_json(dtypes);
    j["metadata"] = h.metadata;
    if (tensors) {
      j["tensors"] = nlohmann::ordered_json::array();
      for (const SafetensorsTensor& t : h.tensors) {
        j["tensors"].push_back({{"name", t.name},
                                {"dtype", t.dtype},
                                {"shape", t.shape},
                                {"bytes", t.nbytes()},
                                {"data_offsets", {t.begin, t.end}}});
      }
    }
    std::cout << json_text(j) << "\n";
    std::cout.flush();
    return kExitOk;
  }
  std::cout << "safetensors " << path << "\n";
  row("file size",
      format_bytes(h.file_bytes()) + " (" + std::to_string(h.file_bytes()) + " bytes)");
  row("header", std::to_string(h.data_start) + " bytes: data starts at offset " +
                    std::to_string(h.data_start) +
                    (h.data_start % kSafetensorsDefaultAlignment == 0 ? " (page-aligned)" : ""));
  row("tensors", count(h.tensors.size(), "tensor", "tensors") + ", " + format_bytes(h.data_bytes));
  row("dtypes", dtype_summary(dtypes));
  std::string metadata;
  for (const auto& [k, v] : h.metadata) metadata += (metadata.empty() ? "" : ", ") + k + "=" + v;
  row("metadata", metadata.empty() ? "-" : metadata);
  if (tensors) {
    std::cout << "tensors:\n";
    std::vector<std::vector<std::string>> rows = {
        {"NAME", "DTYPE", "SHAPE", "SIZE", "DATA OFFSETS"}};
    for (const SafetensorsTensor& t : h.tensors) {
      rows.push_back({t.name, t.dtype, shape_string(t.shape), format_bytes(t.nbytes()),
                      std::to_string(t.begin) + "-" + std::to_string(t.end)});
    }
    print_table(rows, "  ");
  }
  std::cout.flush();
  return kExitOk;
}

// A DeepSpeed tag written by DeepSpeed's own engine: its files, and why nothing checks them.
int inspect_foreign_tag(const std::string& dir, const ForeignTag& f, bool json) {
  const std::string note =
      "no fastpersist manifest: written by DeepSpeed's own checkpoint engine, which records no "
      "checksums, so `fastpersist verify` cannot check it (fastpersist.deepspeed loads it)";
  if (json) {
    nlohmann::ordered_json j = {{"kind", "deepspeed_tag"},
                                {"path", dir},
                                {"tag", f.tag},
                                {"bytes", f.bytes},
                                {"note", note}};
    j["files"] = nlohmann::ordered_json::array();
    for (const auto& [name, size] : f.listing)
      j["files"].push_back({{"name", name}, {"size", size}});
    std::cout << json_text(j) << "\n";
  } else {
    std::cout << "DeepSpeed tag " << dir << "\n  " << note << "\n  size ........... "
              << format_bytes(f.bytes) << " in " << f.files << (f.files == 1 ? " file" : " files")
              << "\nfiles:\n";
    size_t width = 0;
    for (const auto& entry : f.listing) width = std::max(width, entry.first.size());
    for (const auto& [name, size] : f.listing) {
      std::cout << "  " << name << std::string(width + 2 - name.size(), ' ') << format_bytes(size)
                << "\n";
    }
  }
  std::cout.flush();
  return kExitOk;
}

}  // namespace

Command add_inspect_command(CLI::App& parent) {
  struct Args {
    std::string path;
    bool json = false;
    bool tensors = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* app = parent.add_subcommand(
      "inspect",
      "Describe a checkpoint directory (manifest), a .safetensors file (header) or a root (list)");
  app->add_option("PATH", args->path, "Checkpoint directory, .safetensors file, or checkpoint root")
      ->required();
  app->add_flag("--json", args->json, "Print one JSON object instead of text");
  app->add_flag("--tensors", args->tensors, "List every tensor: name, dtype, shape, size, file");
  return {app, [args] {
            PathInfo p = classify_path(args->path);
            switch (p.kind) {
              case PathKind::kMissing:
                return fail(kCommand, p.error, kExitUsage);
              case PathKind::kCheckpoint:
                return inspect_checkpoint(p.path, args->json, args->tensors);
              case PathKind::kSafetensors:
                return inspect_safetensors(p.path, args->json, args->tensors);
              case PathKind::kRoot:
                if (auto foreign = detect_deepspeed_tag(p.path)) {
                  return inspect_foreign_tag(p.path, *foreign, args->json);
                }
                return print_root_listing(kCommand, p.path, args->json);
              case PathKind::kIncompleteCheckpoint:
                return fail(kCommand,
                            p.path + " is " + std::string(describe_path_kind(p.kind)) +
                                ": a save that never finished, a damaged checkpoint, or files "
                                "another tool wrote (`fastpersist verify` says more)",
                            kExitFailure);
              case PathKind::kTorchFile:
                return fail(kCommand,
                            wrong_kind(p,
                                       "a checkpoint directory, a checkpoint root or a "
                                       "safetensors file (`fastpersist convert` turns it "
                                       "into safetensors)"),
                            kExitUsage);
              case PathKind::kOtherFile:
                break;
            }
            return fail(kCommand,
                        wrong_kind(p,
                                   "a checkpoint directory, a checkpoint root or a "
                                   "safetensors file"),
                        kExitUsage);
          }};
}

}  // namespace fastpersist::cli
