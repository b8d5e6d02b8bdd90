// SPDX-License-Identifier: Apache-2.0
// A tensor to save as the façade sends it: (name, safetensors dtype, shape, the tensor object).
// Shared by the manager's saves and the ShardWriter binding (checkpoint_bindings.cc).
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "fastpersist/tensor_source.h"

namespace fastpersist::python {

using TensorTuple = std::tuple<std::string, std::string, std::vector<uint64_t>, nb::handle>;

// The snapshot source of one tensor, its memory read from the object itself (checked_buffer.h).
// ValueError when the memory does not hold exactly shape x dtype size bytes of elements of the
// dtype's size. The object must stay alive (and unchanged) while the source is used.
TensorSource tensor_source(const TensorTuple& tuple);

}  // namespace fastpersist::python
