// SPDX-License-Identifier: Apache-2.0
// Every fixed name fastpersist gives to things on disk, in one place: the layout of a
// checkpoint root and of one checkpoint directory (docs/format.md), and the records parallel
// writers of one file share. The C++ library, the CLI and Python (`_core.layout`) all use these;
// nothing else spells them out.
//
//   <root>/.lock                               the manager's flock (checkpoint writers only)
//   <root>/latest                              the newest committed tag, replaced atomically
//   <root>/.latest.tmp-<unique>                `latest` being replaced (debris after a crash)
//   <root>/.tmp-<tag>-<unique>/                a save in progress (debris after a crash)
//   <root>/.trash-<tag>-<unique>/              a checkpoint being removed (debris after a crash)
//   <root>/<tag>/manifest.json                 written last: the commit record
//   <root>/<tag>/objects.pkl                   the pickled non-tensor state
//   <root>/<tag>/tensors-00000-of-00002.safetensors          data files of a single process
//   <root>/<tag>/tensors-r00003-00000-of-00002.safetensors   data files of rank 3
//   <root>/<tag>/dcp-objects-r00003.bin        rank 3's non-tensor items
//   (torch.distributed.checkpoint) <root>/<tag>/dcp-metadata.pt               the planner's
//   metadata of a distributed checkpoint
//
// Names are never renamed: checkpoints written by every earlier version keep these names.
//
// Thread-safety: constants and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fastpersist {

// A checkpoint directory.
inline constexpr std::string_view kManifestFileName = "manifest.json";
inline constexpr std::string_view kObjectsFileName = "objects.pkl";
inline constexpr std::string_view kDataFilePrefix = "tensors-";
inline constexpr std::string_view kDataFileSuffix = ".safetensors";
// The prefix of a rank's number in a data file name (tensors-r00003-...).
inline constexpr std::string_view kDataFileRankMarker = "r";

// A distributed checkpoint written through torch.distributed.checkpoint (fastpersist.dcp): DCP's
// Metadata (torch.save, read back with weights_only), and each rank's serialized non-tensor items.
inline constexpr std::string_view kDcpMetadataFileName = "dcp-metadata.pt";
inline constexpr std::string_view kDcpObjectsFilePrefix = "dcp-objects-";
inline constexpr std::string_view kDcpObjectsFileSuffix = ".bin";

// A checkpoint root.
inline constexpr std::string_view kLatestFileName = "latest";
inline constexpr std::string_view kLockFileName = ".lock";
inline constexpr std::string_view kTempDirPrefix = ".tmp-";
inline constexpr std::string_view kTrashDirPrefix = ".trash-";
// A file replaced atomically (`latest`) is first written as ".<name><infix><unique>".
inline constexpr std::string_view kReplaceTempInfix = ".tmp-";

// A FastFileWriter writes "<dir>/<name>" as the temporary ".<name><infix>XXXXXX" (mkostemp),
// renamed into place on close.
inline constexpr std::string_view kWriterTempInfix = ".fp-tmp-";
// Parallel writers of one file (FastFileWriter): the shared temporary ".<target><suffix>" and
// the records next to it, "<temporary><record suffix>".
inline constexpr std::string_view kParallelPartialSuffix = ".fp-partial";
inline constexpr std::string_view kParallelLockSuffix = ".lock";
inline constexpr std::string_view kParallelDoneSuffix = ".done";
// A record being replaced: "<record><suffix>", renamed over the record.
inline constexpr std::string_view kRecordReplaceSuffix = ".new";

// The data file `index` of `count` (0 <= index < count): "tensors-00000-of-00002.safetensors",
// or with a rank, "tensors-r00003-00000-of-00002.safetensors", so that the ranks writing into
// one directory never choose the same name. Numbers are zero-padded to 5 digits (wider ones
// are written in full).
std::string data_file_name(size_t index, size_t count, std::optional<uint32_t> rank = std::nullopt);

// The file of rank `rank`'s non-tensor items: "dcp-objects-r00003.bin".
std::string dcp_objects_file_name(uint32_t rank);
// Whether `name` is a data file name (of any rank): "tensors-" ... ".safetensors".
bool is_data_file_name(std::string_view name);

// The temporary name prefix of a file `name` replaced atomically: ".<name>.tmp-".
std::string replace_temp_prefix(std::string_view name);

}  // namespace fastpersist
