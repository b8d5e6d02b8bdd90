// SPDX-License-Identifier: Apache-2.0
// Typed results at the Python seam (load_outcome_bindings.cc binds them): what
// `CheckpointReader.load` produced and what `verify_checkpoint` found, as objects with named
// fields instead of positional tuples. Names are Python strings (utf8_str: a name that is not
// valid UTF-8 keeps its bytes as surrogate escapes).
#pragma once

#include <nanobind/nanobind.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fastpersist/checkpoint_load.h"

namespace fastpersist::python {

namespace nb = nanobind;

// One stored tensor a load produced (LoadedTensor, with its name and its buffer's index).
struct PyLoadedTensor {
  nb::str name;
  std::string dtype;
  std::vector<uint64_t> shape;
  long buffer = -1;   // index into PyLoadOutcome::buffers; -1: in a destination
  size_t offset = 0;  // of the elements in that buffer
  uint64_t nbytes = 0;
  long destination = -1;  // index of a destination that holds it; -1: in new memory
};

struct PyLoadOutcome {
  nb::list buffers;  // PinnedBuffer objects the new-memory tensors live in
  nb::list tensors;  // PyLoadedTensor, in manifest order
  std::vector<DestinationState> destinations;  // per destination given
  nb::list missing, unexpected, mismatched;
};

struct PyVerifyReport {
  nb::list problems;
  uint64_t bytes_checked = 0;
  bool has_checksums = true;
};

}  // namespace fastpersist::python
