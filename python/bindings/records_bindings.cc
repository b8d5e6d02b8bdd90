// SPDX-License-Identifier: Apache-2.0
// The records the core lists, bound as they are in C++ (read-only, comparable, hashable and
// picklable: a multi-rank manager broadcasts rank 0's answers), under their Python names:
//
//   C++ (include/fastpersist)    Python (fastpersist.X is _core.X)
//   CheckpointInfo               CheckpointInfo            CheckpointManager.checkpoints()
//   CheckpointPlace              CheckpointLocation        CheckpointManager.locations()
//   TierState                    TierStatus                CheckpointManager.tier_status()
//   (list_checkpoints' answer)   CheckpointListing         _core.list_checkpoints(root)
//
// Strings that name paths or come from disk reach Python through utf8_str (a damaged name never
// raises UnicodeDecodeError).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.h"
#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/tier.h"

namespace fastpersist::python {
namespace {

using InfoState = std::tuple<std::string, std::optional<int64_t>, uint64_t, double, uint64_t,
                             uint64_t, uint64_t, size_t, std::vector<std::string>>;

InfoState info_state(const CheckpointInfo& c) {
  return {c.tag,         c.step,      c.sequence,    c.created_unix, c.tensor_bytes,
          c.total_bytes, c.own_bytes, c.num_tensors, c.references};
}

CheckpointInfo info_of(const InfoState& st) {
  CheckpointInfo c;
  std::tie(c.tag, c.step, c.sequence, c.created_unix, c.tensor_bytes, c.total_bytes, c.own_bytes,
           c.num_tensors, c.references) = st;
  return c;
}

nb::tuple str_tuple(const std::vector<std::string>& items) { return nb::tuple(utf8_list(items)); }

// TierState with its last error as text ("" when the latest attempt succeeded): what Python
// shows, compares and pickles.
struct TierStatusRecord {
  std::string path;
  std::string draining;
  std::vector<std::string> waiting;
  std::string last_drained;
  uint64_t checkpoints_drained = 0;
  uint64_t bytes_drained = 0;
  double seconds_draining = 0;
  std::string last_error;
};

using TierStatusState = std::tuple<std::string, std::string, std::vector<std::string>, std::string,
                                   uint64_t, uint64_t, double, std::string>;

TierStatusState tier_state(const TierStatusRecord& t) {
  return {t.path,          t.draining,         t.waiting,   t.last_drained, t.checkpoints_drained,
          t.bytes_drained, t.seconds_draining, t.last_error};
}

TierStatusRecord tier_record(const TierState& t) {
  return {t.path,
          t.draining,
          t.waiting,
          t.last_drained,
          t.checkpoints_drained,
          t.bytes_drained,
          t.seconds_draining,
          t.last_error.is_ok() ? std::string() : t.last_error.to_string()};
}

using PlaceState = std::tuple<InfoState, std::vector<std::string>, bool>;

PlaceState place_state(const CheckpointPlace& p) { return {info_state(p.info), p.roots, p.local}; }

CheckpointPlace place_of(const PlaceState& st) {
  return CheckpointPlace{info_of(std::get<0>(st)), std::get<1>(st), std::get<2>(st)};
}

struct CheckpointListing {
  std::vector<CheckpointInfo> committed;
  std::vector<std::string> damaged;
};

using namespace nb::literals;

void bind_checkpoint_info(nb::module_& m) {
  auto info = nb::class_<CheckpointInfo>(
      m, "CheckpointInfo", "A committed checkpoint as CheckpointManager.checkpoints() lists it.");
  info.def_ro("tag", &CheckpointInfo::tag)
      .def_ro("step", &CheckpointInfo::step)
      .def_ro("sequence", &CheckpointInfo::sequence)
      .def_ro("created_unix", &CheckpointInfo::created_unix)
      .def_ro("tensor_bytes", &CheckpointInfo::tensor_bytes, "Bytes of its tensors.")
      .def_ro("total_bytes", &CheckpointInfo::total_bytes,
              "Bytes of all its files, those it references in other checkpoints included.")
      .def_ro("own_bytes", &CheckpointInfo::own_bytes,
              "Bytes of the files in its own directory (total_bytes less what it references).")
      .def_ro("num_tensors", &CheckpointInfo::num_tensors)
      .def_prop_ro(
          "references", [](const CheckpointInfo& c) { return str_tuple(c.references); },
          "The checkpoints whose files this one references: an incremental checkpoint's base "
          "(empty "
          "for a full checkpoint). Retention and remove never delete a referenced base.")
      .def_prop_ro(
          "incremental", [](const CheckpointInfo& c) { return !c.references.empty(); },
          "Whether it references a base.")
      .def("__getstate__", [](const CheckpointInfo& c) { return info_state(c); })
      .def("__setstate__",
           [](CheckpointInfo& c, const InfoState& st) { new (&c) CheckpointInfo(info_of(st)); })
      .def("__repr__", [](const CheckpointInfo& c) {
        return nb::str(
                   "CheckpointInfo(tag={!r}, step={!r}, sequence={}, tensor_bytes={}, "
                   "references={!r})")
            .format(c.tag, c.step, c.sequence, c.tensor_bytes, str_tuple(c.references));
      });
  comparable(info, info_state,
             [](const CheckpointInfo& c) { return std::make_pair(c.tag, c.sequence); });
}

void bind_checkpoint_location(nb::module_& m) {
  auto place = nb::class_<CheckpointPlace>(
      m, "CheckpointLocation",
      "A committed checkpoint and every root that holds it, the local root first.");
  place.def_prop_ro("tag", [](const CheckpointPlace& p) { return p.info.tag; })
      .def_prop_ro("step", [](const CheckpointPlace& p) { return p.info.step; })
      .def_prop_ro("created_unix", [](const CheckpointPlace& p) { return p.info.created_unix; })
      .def_prop_ro(
          "info", [](const CheckpointPlace& p) { return p.info; },
          "The checkpoint, as the first root lists it.")
      .def_prop_ro("roots", [](const CheckpointPlace& p) { return str_tuple(p.roots); })
      .def_ro("local", &CheckpointPlace::local, "Whether roots[0] is the local root.")
      .def("__getstate__", [](const CheckpointPlace& p) { return place_state(p); })
      .def("__setstate__",
           [](CheckpointPlace& p, const PlaceState& st) { new (&p) CheckpointPlace(place_of(st)); })
      .def("__repr__", [](const CheckpointPlace& p) {
        return nb::str("CheckpointLocation(tag={!r}, step={!r}, roots={!r}, local={})")
            .format(p.info.tag, p.info.step, str_tuple(p.roots), p.local);
      });
  comparable(place, place_state,
             [](const CheckpointPlace& p) { return std::make_pair(p.info.tag, p.info.sequence); });
}

void bind_tier_status(nb::module_& m) {
  auto tier = nb::class_<TierStatusRecord>(
      m, "TierStatus", "Where one tier stands (CheckpointManager.tier_status()).");
  tier.def_prop_ro("path", [](const TierStatusRecord& t) { return utf8_str(t.path); })
      .def_ro("draining", &TierStatusRecord::draining, "The tag being copied now (\"\" when idle).")
      .def_prop_ro(
          "waiting", [](const TierStatusRecord& t) { return str_tuple(t.waiting); },
          "Selected for the tier, not yet there, oldest first.")
      .def_ro("last_drained", &TierStatusRecord::last_drained)
      .def_ro("checkpoints_drained", &TierStatusRecord::checkpoints_drained,
              "Since the manager opened.")
      .def_ro("bytes_drained", &TierStatusRecord::bytes_drained)
      .def_ro("seconds_draining", &TierStatusRecord::seconds_draining)
      .def_prop_ro(
          "last_error", [](const TierStatusRecord& t) { return utf8_str(t.last_error); },
          "Of the latest attempt (\"\" when it succeeded).")
      .def("__getstate__", [](const TierStatusRecord& t) { return tier_state(t); })
      .def("__setstate__",
           [](TierStatusRecord& t, const TierStatusState& st) {
             new (&t) TierStatusRecord();
             std::tie(t.path, t.draining, t.waiting, t.last_drained, t.checkpoints_drained,
                      t.bytes_drained, t.seconds_draining, t.last_error) = st;
           })
      .def("__repr__", [](const TierStatusRecord& t) {
        return nb::str("TierStatus(path={!r}, draining={!r}, waiting={!r}, last_error={!r})")
            .format(utf8_str(t.path), t.draining, str_tuple(t.waiting), utf8_str(t.last_error));
      });
  comparable(tier, tier_state, [](const TierStatusRecord& t) { return t.path; });
}

// The answers that carry lists of the records above: listings, locations, a prune's outcome.
void bind_listings(nb::module_& m) {
  using ListingState = std::pair<std::vector<InfoState>, std::vector<std::string>>;
  nb::class_<CheckpointListing>(m, "CheckpointListing",
                                "A root's committed checkpoints and damaged directories.")
      .def_ro("committed", &CheckpointListing::committed, "Oldest to newest.")
      .def_prop_ro(
          "damaged", [](const CheckpointListing& l) { return utf8_list(l.damaged); },
          "What was skipped, each as 'tag: why'.")
      .def("__getstate__",
           [](const CheckpointListing& l) {
             ListingState st;
             for (const CheckpointInfo& c : l.committed) st.first.push_back(info_state(c));
             st.second = l.damaged;
             return st;
           })
      .def("__setstate__", [](CheckpointListing& l, const ListingState& st) {
        new (&l) CheckpointListing();
        for (const InfoState& c : st.first) l.committed.push_back(info_of(c));
        l.damaged = st.second;
      });

  using LocationsState = std::pair<std::vector<PlaceState>, std::vector<std::string>>;
  nb::class_<CheckpointLocations>(m, "CheckpointLocations", "CheckpointManager.locations' answer.")
      .def_ro("places", &CheckpointLocations::places, "Oldest first.")
      .def_prop_ro(
          "unreachable", [](const CheckpointLocations& l) { return utf8_list(l.unreachable); },
          "The tiers that could not be listed, each as 'path: why'.")
      .def("__getstate__",
           [](const CheckpointLocations& l) {
             LocationsState st;
             for (const CheckpointPlace& p : l.places) st.first.push_back(place_state(p));
             st.second = l.unreachable;
             return st;
           })
      .def("__setstate__", [](CheckpointLocations& l, const LocationsState& st) {
        new (&l) CheckpointLocations();
        for (const PlaceState& p : st.first) l.places.push_back(place_of(p));
        l.unreachable = st.second;
      });

  nb::class_<PruneOutcome>(m, "PruneOutcome",
                           "What CheckpointManager.prune removed, and what failed verification.")
      .def_prop_ro("removed", [](const PruneOutcome& o) { return utf8_list(o.removed); })
      .def_prop_ro("damaged", [](const PruneOutcome& o) { return utf8_list(o.damaged); })
      .def("__getstate__",
           [](const PruneOutcome& o) { return std::make_pair(o.removed, o.damaged); })
      .def("__setstate__",
           [](PruneOutcome& o,
              const std::pair<std::vector<std::string>, std::vector<std::string>>& st) {
             new (&o) PruneOutcome{st.first, st.second};
           });
}

}  // namespace

void bind_records(nb::module_& m) {
  bind_checkpoint_info(m);
  bind_checkpoint_location(m);
  bind_tier_status(m);
  bind_listings(m);
  m.def(
      "list_checkpoints",
      [](const std::string& root) {
        CheckpointListing out;
        out.committed =
            unwrap(without_gil([&] { return fastpersist::list_checkpoints(root, &out.damaged); }));
        return out;
      },
      "root"_a);
}

// TierState -> TierStatus for the manager's binding (checkpoint_bindings.cc).
nb::object tier_status(const TierState& t) { return nb::cast(tier_record(t)); }

}  // namespace fastpersist::python
