// SPDX-License-Identifier: Apache-2.0
// `_core.LoadOutcome`, `_core.LoadedTensor`, `_core.DestinationState` and `_core.VerifyReport`
// (load_outcome.h): the typed results of CheckpointReader.load and verify_checkpoint.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "load_outcome.h"

namespace fastpersist::python {

void bind_load_outcome(nb::module_& m) {
  nb::enum_<DestinationState>(m, "DestinationState", "What became of one destination of a load.")
      .value("UNUSED", DestinationState::kUnused,
             "not selected, not in the checkpoint, or of another shape")
      .value("FILLED", DestinationState::kFilled, "holds its tensor, converted to its dtype")
      .value("CALLER_COPIES", DestinationState::kCallerCopies,
             "declared without memory: the tensor is in new memory, for the caller to copy");

  nb::class_<PyLoadedTensor>(m, "LoadedTensor", "One stored tensor a load produced.")
      .def_ro("name", &PyLoadedTensor::name)
      .def_ro("dtype", &PyLoadedTensor::dtype, "safetensors name of the loaded elements")
      .def_ro("shape", &PyLoadedTensor::shape)
      .def_ro("buffer", &PyLoadedTensor::buffer,
              "index into LoadOutcome.buffers; -1 when in a destination")
      .def_ro("offset", &PyLoadedTensor::offset, "byte offset of the elements in that buffer")
      .def_ro("nbytes", &PyLoadedTensor::nbytes)
      .def_ro("destination", &PyLoadedTensor::destination,
              "index of the destination that holds it; -1 when in new memory");

  nb::class_<PyLoadOutcome>(m, "LoadOutcome", "What CheckpointReader.load produced.")
      .def_ro("buffers", &PyLoadOutcome::buffers)
      .def_ro("tensors", &PyLoadOutcome::tensors)
      .def_ro("destinations", &PyLoadOutcome::destinations,
              "a DestinationState per destination given")
      .def_ro("missing", &PyLoadOutcome::missing)
      .def_ro("unexpected", &PyLoadOutcome::unexpected)
      .def_ro("mismatched", &PyLoadOutcome::mismatched);

  nb::class_<PyVerifyReport>(m, "VerifyReport", "What verify_checkpoint found.")
      .def_ro("problems", &PyVerifyReport::problems, "one line per problem; empty when intact")
      .def_ro("bytes_checked", &PyVerifyReport::bytes_checked)
      .def_ro(
          "has_checksums", &PyVerifyReport::has_checksums,
          "False: saved without checksums; only sizes, headers and compressed frames were checked")
      .def_prop_ro("ok", [](const PyVerifyReport& r) { return nb::len(r.problems) == 0; });
}

}  // namespace fastpersist::python
