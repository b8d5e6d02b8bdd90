// SPDX-License-Identifier: Apache-2.0
// DeferredFileWriter: a file object that records a serialization now and writes it later.
//
// A trainer's state is serialized (torch.save pickles it) on the training thread, but the bytes
// can go to the storage afterwards, on another thread, while training goes on: the DeepSpeed
// checkpoint engine (python/fastpersist/deepspeed/) saves this way. write() only records:
//   - a piece that lies inside memory the caller lent with borrow() (a tensor's storage, which
//     the caller keeps alive and unchanged until persist() returns) is remembered by address;
//   - any other piece (pickle opcodes, zip headers: small, and gone when write() returns) is
//     copied into the writer's own memory.
// persist() then streams the pieces, in order, through a FastFileWriter (pinned double buffers,
// async O_DIRECT, fdatasync) into a new file <directory>/<name>, with the XXH3-64 of the whole
// file computed on the way, and returns the file's manifest record (role "objects"), the same
// record write_sidecar_file() returns for a file it writes from one buffer. The file is byte
// for byte what the serializer produced.
//
// An asynchronous save that must not hold the lent memory until the file is written calls
// snapshot() first: it copies the borrowed pieces into one pinned buffer from a pool (reused by
// later saves), after which the lent memory may change; persist() then writes the copies. A
// trainer's next optimizer step waits only for the snapshot, not for the storage.
//
// Thread-safety: borrow() and write() on one thread; snapshot() and persist() (or abort())
// afterwards, on any one thread, in that order: the caller orders them (e.g. by starting the
// persisting thread after the last write()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fastpersist/fast_file_writer.h"
#include "fastpersist/io_engine.h"
#include "fastpersist/manifest.h"
#include "fastpersist/pinned_buffer.h"
#include "fastpersist/status.h"

namespace fastpersist {

struct DeferredFileWriterOptions {
  FastFileWriterOptions writer;  // how persist() writes (durable, staging size, ...)
  bool checksums = true;         // false: the record's checksum is 0
  std::optional<uint32_t> rank;  // the record's rank (a distributed checkpoint)
  // Pieces shorter than this are copied even inside borrowed memory (a borrowed piece costs a
  // record; copying a small one is cheaper than remembering it).
  size_t borrow_min_bytes = size_t{64} << 10;
  // persist() may replace a file that exists at the path, atomically (the new file is renamed
  // over it): a file saved again under its name, like a trainer's last.ckpt. false: create()
  // and persist() refuse an existing file (kAlreadyExists).
  bool replace_existing = false;
};

struct DeferredFileWriterStats {
  uint64_t bytes = 0;           // the stream's length so far
  uint64_t borrowed_bytes = 0;  // recorded by address
  uint64_t copied_bytes = 0;    // copied by write()
  uint64_t pieces = 0;          // what persist() will write, in order
  uint64_t snapshot_bytes = 0;  // borrowed bytes snapshot() copied
};

// The stream taken apart (take_pieces): the pieces recorded by address, where each lies in the
// stream, and every other byte in stream order.
struct DeferredStream {
  struct Borrowed {
    uint64_t offset = 0;  // in the stream
    const std::byte* data = nullptr;
    uint64_t bytes = 0;
  };
  std::string name;
  uint64_t size = 0;
  std::vector<Borrowed> borrowed;
  std::string rest;
};

class DeferredFileWriter {
 public:
  // `name` must be a plain file name (kInvalidArgument otherwise) that does not exist in
  // `directory` yet (kAlreadyExists); null `engine`: a private one with default options.
  static Result<std::unique_ptr<DeferredFileWriter>> create(
      const std::string& directory, const std::string& name,
      const DeferredFileWriterOptions& options = {}, std::shared_ptr<IoEngine> engine = nullptr);
  ~DeferredFileWriter();
  DeferredFileWriter(const DeferredFileWriter&) = delete;
  DeferredFileWriter& operator=(const DeferredFileWriter&) = delete;

  // Lends [data, data + bytes): pieces inside it are written from it by persist().
  void borrow(const void* data, size_t bytes);
  // Records the next `bytes` bytes of the stream. kInvalidArgument after persist() or abort().
  Status write(const void* data, size_t bytes);
  // Copies every borrowed piece into one buffer from `pool` (each at a 4096-aligned offset, so
  // that persist() still writes it without another copy); the lent memory is not used after
  // this returns. Once, between the last write() and persist(); kInvalidArgument when called
  // again or after persist(), take_pieces() or abort() (a failure leaves the stream as it was).
  Status snapshot(PinnedBufferPool& pool);
  // Writes the stream into the new file, durable as the options say, and returns its record.
  // On failure no file is left. Once: kInvalidArgument when called again or after abort().
  Result<ManifestFile> persist();
  // Instead of persist(): the stream taken apart, for a writer of its own (split_file.h). The
  // writer is finished; the borrowed memory must stay alive while the result is used. Once:
  // kInvalidArgument when called again, after persist() or abort(), or after snapshot().
  Result<DeferredStream> take_pieces();
  // Forgets the stream (and its copies); no file is written. Idempotent.
  void abort();

  DeferredFileWriterStats stats() const;
  const std::string& path() const;

 private:
  class Impl;
  explicit DeferredFileWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Checks the file `path` against its manifest `record` (role "objects": its size and, with
// `checksums` (the manifest's own flag), the XXH3-64 of its first checksum_bytes bytes): kDataLoss
// naming the file when either differs. Reads through the page cache in large sequential chunks
// into a small buffer of its own, so a reader that opens the file at the same time (torch.load)
// finds the pages cached, and the check holds no copy of the file.
Status check_object_file(const std::string& path, const ManifestFile& record, bool checksums);

}  // namespace fastpersist
