// SPDX-License-Identifier: Apache-2.0
// CheckpointCommit (checkpoint_commit.h): a checkpoint written by others, committed here.
#include "fastpersist/checkpoint_commit.h"

#include <set>
#include <utility>

#include "checkpoint/commit_state.h"
#include "checkpoint/commit_steps.h"
#include "checkpoint_dir/checkpoint_fs.h"
#include "fastpersist/checksum.h"
#include "fastpersist/layout.h"

namespace fastpersist {

using checkpoint::join_path;

namespace {

Status closed_manager(const std::string& tag) {
  return Status(StatusCode::kInvalidArgument,
                "the CheckpointManager that began checkpoint '" + tag + "' is closed");
}

Manifest build_manifest(const CheckpointCommit::State& s, CommitContent c, uint64_t sequence) {
  Manifest m;
  m.tag = s.tag;
  m.step = c.step;
  m.sequence = sequence;
  m.versions = std::move(c.versions);
  m.versions["fastpersist"] = FASTPERSIST_VERSION;
  m.metadata_json = std::move(c.metadata_json);
  m.aliases = std::move(c.aliases);
  m.world_size = c.world_size;
  m.files = std::move(c.files);
  m.tensors = std::move(c.tensors);
  m.fingerprint = manifest_fingerprint(m.tensors);
  m.created_unix = c.created_unix.value_or(checkpoint::unix_now());
  m.blocking_seconds = c.blocking_seconds;
  if (!c.checksums) m.checksum_algorithm = std::string(kNoChecksum);
  return m;
}

// Everything decode_manifest checks (names, ranks, offsets, lengths, duplicates), so that what
// is committed always reads back; then the directory must hold exactly the listed files.
Status check_commit(const CheckpointCommit::State& s, const Manifest& m) {
  FP_RETURN_IF_ERROR(check_metadata_json(m.metadata_json));
  auto decoded = decode_manifest(encode_manifest(m), join_path(s.directory, kManifestFileName));
  if (!decoded.is_ok()) {
    return Status(StatusCode::kInvalidArgument,
                  "the records of checkpoint '" + s.tag +
                      "' do not form a valid manifest: " + decoded.status().message());
  }
  FP_ASSIGN_OR_RETURN(std::vector<std::string> present, checkpoint::list_dir(s.directory));
  std::set<std::string, std::less<>> listed;
  for (const ManifestFile& f : m.files) {
    if (referenced_checkpoint(f).empty()) listed.insert(f.name);
  }
  for (const std::string& name : present) {
    if (listed.count(name) == 0) {
      return Status(StatusCode::kInvalidArgument,
                    "checkpoint '" + s.tag + "': the file '" + name +
                        "' is in the directory but no writer reported it (its records were lost)")
          .with_path(join_path(s.directory, name));
    }
  }
  return checkpoint::check_manifest_files(s.directory, m);
}

}  // namespace

CheckpointCommit::CheckpointCommit(std::unique_ptr<State> state) : state_(std::move(state)) {}

CheckpointCommit::~CheckpointCommit() { (void)abort(); }

const std::string& CheckpointCommit::tag() const { return state_->tag; }
const std::string& CheckpointCommit::directory() const { return state_->directory; }
const std::string& CheckpointCommit::base_tag() const { return state_->base_tag; }
bool CheckpointCommit::finished() const { return state_->finished; }
const Status& CheckpointCommit::retention_error() const { return state_->retention; }

Status CheckpointCommit::commit(CommitContent content) {
  State& s = *state_;
  if (s.finished) {
    return Status(StatusCode::kInvalidArgument,
                  "checkpoint '" + s.tag + "' was already committed or aborted");
  }
  std::shared_ptr<const Manifest> committed;
  Status outcome = [&]() -> Status {
    std::lock_guard link(s.manager->mu);
    if (s.manager->host == nullptr) return closed_manager(s.tag);
    CommitHost& host = *s.manager->host;
    FP_ASSIGN_OR_RETURN(uint64_t sequence, host.take_sequence());
    Manifest manifest = build_manifest(s, std::move(content), sequence);
    FP_RETURN_IF_ERROR(check_commit(s, manifest));
    uint64_t manifest_bytes = 0;
    FP_RETURN_IF_ERROR(checkpoint::commit_temp_directory(
        {s.root, s.tag, s.directory, s.durable, &host.pointer_mutex()}, manifest, &manifest_bytes));
    committed = std::make_shared<const Manifest>(std::move(manifest));
    return Status::ok();
  }();
  if (!outcome.is_ok()) {
    (void)abort();
    return outcome;
  }
  s.finished = true;
  std::lock_guard link(s.manager->mu);
  if (s.manager->host != nullptr) {
    s.retention = s.manager->host->after_commit(s.tag, committed);
    s.manager->host->release_tag(s.tag, s.base_tag);
  }
  return Status::ok();
}

Status CheckpointCommit::abort() {
  State& s = *state_;
  if (s.finished) return Status::ok();
  s.finished = true;
  Status removed = checkpoint::remove_tree(s.directory);
  std::lock_guard link(s.manager->mu);
  if (s.manager->host != nullptr) s.manager->host->release_tag(s.tag, s.base_tag);
  return removed;
}

Result<ManifestFile> write_sidecar_file(const std::string& directory, const std::string& name,
                                        std::string_view bytes, bool durable, bool checksums,
                                        std::optional<uint32_t> rank) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return Status(StatusCode::kInvalidArgument,
                  "a sidecar file needs a plain file name, not '" + name + "'");
  }
  FP_RETURN_IF_ERROR(checkpoint::write_new_file(join_path(directory, name), bytes, durable));
  ManifestFile f;
  f.name = name;
  f.role = "objects";
  f.size = bytes.size();
  f.checksum = checksums ? xxh3_64(bytes.data(), bytes.size()) : 0;
  f.checksum_bytes = bytes.size();
  f.rank = rank;
  return f;
}

}  // namespace fastpersist
