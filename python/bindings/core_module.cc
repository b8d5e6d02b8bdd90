// SPDX-License-Identifier: Apache-2.0
// `fastpersist._core`: the private extension module. Users import `fastpersist`, whose typed
// facade (python/fastpersist/) turns Python buffers into (address, nbytes) and calls in here.
#include "bindings.h"

NB_MODULE(_core, m) {
  namespace fp = fastpersist::python;
  m.doc() = "fastpersist C++ core (private; use the `fastpersist` package)";
  m.attr("__version__") = FASTPERSIST_VERSION;
  // Loaded tensors may keep read buffers (PinnedBuffer objects) alive until interpreter exit,
  // after this module's types are gone; that is expected, not a leak worth a warning.
  nanobind::set_leak_warnings(false);
  fp::bind_errors(m);
  fp::bind_options(m);
  fp::bind_buffers(m);
  fp::bind_aio_handle(m);
  fp::bind_gds_handle(m);
  fp::bind_writer(m);
  fp::bind_manifest(m);
  fp::bind_load_outcome(m);
  fp::bind_commit(m);
  fp::bind_deferred(m);
  fp::bind_records(m);
  fp::bind_checkpoint(m);
  fp::bind_object_stores(m);
#ifdef FASTPERSIST_HAVE_CLI
  fp::bind_cli(m);
#endif
  fp::bind_progress(m);
  fp::bind_paths(m);
  fp::bind_layout(m);
}
