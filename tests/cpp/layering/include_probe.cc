// SPDX-License-Identifier: Apache-2.0
// Compiled by the layer include checks (cmake/layer_include_checks.cmake) with exactly the
// include directories one layer's library has: FASTPERSIST_PROBE_HEADER names a private header
// of that layer, of a layer below it (must compile) or of a layer above or beside it (must not).
#include FASTPERSIST_PROBE_HEADER
