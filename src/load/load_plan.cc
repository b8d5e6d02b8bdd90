// SPDX-License-Identifier: Apache-2.0
// See load_plan.h. Every name is looked up in hash tables built once per load, so planning a
// load of 10^5 tensors takes a few milliseconds; names are compared whole, never parsed.
#include "load/load_plan.h"

#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "fastpersist/dtype.h"

namespace fastpersist::checkpoint {
namespace {

constexpr size_t kListedNames = 20;

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::string listed(const std::vector<std::string>& names, const char* separator) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < kListedNames; ++i)
    s += (i ? separator : "") + names[i];
  return names.size() > kListedNames ? s + " ..." : s;
}

// Names (stored and aliases) -> index of the stored tensor.
class NameIndex {
 public:
  explicit NameIndex(const Manifest& m) {
    index_.reserve(m.tensors.size() + m.aliases.size());
    for (size_t i = 0; i < m.tensors.size(); ++i) index_.emplace(m.tensors[i].name, i);
    for (const auto& [alias, target] : m.aliases) {
      auto it = index_.find(target);
      if (it != index_.end()) index_.emplace(alias, it->second);  // decode checked the target
    }
  }
  std::optional<size_t> resolve(std::string_view name) const {
    auto it = index_.find(name);
    if (it == index_.end()) return std::nullopt;
    return it->second;
  }

 private:
  std::unordered_map<std::string_view, size_t> index_;
};

// Strides with the contiguous case spelled one way (empty).
std::vector<int64_t> plain_strides(const std::vector<uint64_t>& shape,
                                   const std::vector<int64_t>& strides) {
  return is_contiguous(shape, strides) ? std::vector<int64_t>() : strides;
}

Status invalid(std::string message) {
  return Status(StatusCode::kInvalidArgument, std::move(message));
}

Status strict_failure(const std::string& dir, const LoadPlan& plan) {
  std::string parts;
  auto add = [&](const std::string& part) { parts += (parts.empty() ? "" : " | ") + part; };
  if (!plan.missing.empty()) add("missing from the checkpoint: " + listed(plan.missing, ", "));
  if (!plan.unexpected.empty())
    add("in the checkpoint but not in into=: " + listed(plan.unexpected, ", "));
  if (!plan.mismatched.empty()) add("shape mismatch: " + listed(plan.mismatched, "; "));
  return invalid("checkpoint " + dir + " does not match what was asked (strict=True): " + parts +
                 ". Pass strict=False to load what matches.");
}

}  // namespace

bool is_contiguous(const std::vector<uint64_t>& shape, const std::vector<int64_t>& strides) {
  if (strides.empty()) return true;
  if (strides.size() != shape.size()) return false;
  int64_t expected = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    if (shape[k] != 1 && strides[k] != expected) return false;
    expected *= static_cast<int64_t>(shape[k]);
  }
  return true;
}

namespace {

// One load's planning, step by step: selection, destinations, requested dtypes, then one
// PlannedTensor per selected stored tensor. Each step reads what the earlier ones decided.
class LoadPlanner {
 public:
  LoadPlanner(const Manifest& m, const std::string& dir, const LoadRequest& r)
      : m_(m), dir_(dir), r_(r), index_(m), n_(m.tensors.size()), all_(!r.names.has_value()) {}

  Result<LoadPlan> run() {
    select();
    plan_.destination_state.assign(r_.destinations.size(), DestinationState::kUnused);
    destination_names_.reserve(r_.destinations.size());
    destinations_of_.resize(n_);
    caller_copies_.assign(n_, -1);
    for (size_t d = 0; d < r_.destinations.size(); ++d) FP_RETURN_IF_ERROR(add_destination(d));
    if (r_.into) list_unexpected();
    FP_RETURN_IF_ERROR(read_requested_dtypes());
    if (r_.strict &&
        (!plan_.missing.empty() || !plan_.unexpected.empty() || !plan_.mismatched.empty())) {
      return strict_failure(dir_, plan_);
    }
    FP_RETURN_IF_ERROR(check_writable(std::move(ranges_)));
    for (size_t i = 0; i < n_; ++i) {
      if (selected_[i]) FP_RETURN_IF_ERROR(plan_tensor(i));
    }
    return std::move(plan_);
  }

 private:
  // Selection: by name (an alias is selected by its own name, its stored tensor is read).
  void select() {
    selected_.assign(n_, all_ ? 1 : 0);
    if (all_) return;
    selected_names_.reserve(r_.names->size());
    for (const std::string& name : *r_.names) {
      std::optional<size_t> i = index_.resolve(name);
      if (!i) {
        plan_.missing.push_back(name);
        continue;
      }
      selected_[*i] = 1;
      selected_names_.insert(name);
    }
  }

  bool name_selected(std::string_view name) const { return all_ || selected_names_.contains(name); }

  // One destination: shape, dtype, capacity, strides (writability is checked for all at once).
  Status add_destination(size_t d) {
    const LoadDestination& dest = r_.destinations[d];
    if (!destination_names_.insert(dest.name).second) {
      return invalid("two destinations are named '" + dest.name + "'");
    }
    std::optional<size_t> i = index_.resolve(dest.name);
    if (!i) {
      if (all_ && r_.into) plan_.missing.push_back(dest.name);
      return Status::ok();
    }
    if (!name_selected(dest.name)) return Status::ok();
    const ManifestTensor& t = m_.tensors[*i];
    if (dest.shape != t.shape) {
      plan_.mismatched.push_back(dest.name + ": checkpoint " + shape_text(t.shape) +
                                 ", destination " + shape_text(dest.shape));
      return Status::ok();
    }
    const DtypeInfo* info = find_dtype(dest.dtype);
    if (info == nullptr) {
      return invalid("the destination of '" + dest.name + "' has dtype '" + dest.dtype +
                     "', which no checkpoint tensor loads into");
    }
    if (!conversion_supported(t.dtype, dest.dtype) && r_.unconvertible_to_caller) {
      // Loaded in its stored dtype (no caller_copies_ entry: that one would set the dtype).
      plan_.destination_state[d] = DestinationState::kCallerCopies;
      return Status::ok();
    }
    if (!conversion_supported(t.dtype, dest.dtype)) {
      return invalid("cannot load tensor '" + dest.name + "' (" + t.dtype +
                     ") into a destination of " + dest.dtype + ": " +
                     convert_elements(t.dtype, nullptr, dest.dtype, nullptr, 0).message());
    }
    if (dest.data == nullptr) {
      leave_to_caller(*i, d);
      return Status::ok();
    }
    Result<uint64_t> extent = destination_extent(dest.shape, dest.strides, info->size);
    if (!extent.is_ok())
      return invalid("the destination of '" + dest.name + "': " + extent.status().message());
    if (extent.value() > dest.capacity_bytes) {
      return invalid("the destination of '" + dest.name + "' holds " +
                     std::to_string(dest.capacity_bytes) + " bytes, but its shape " +
                     shape_text(dest.shape) + " of " + dest.dtype + " spans " +
                     std::to_string(extent.value()));
    }
    if (dest.memory != MemoryKind::kHost) {
      if (dest.device < 0)
        return invalid("the destination of '" + dest.name + "' is device memory without a device");
      // Not host memory, so not in /proc/self/maps; whether its tensor can go there is decided
      // per tensor (plan_tensor).
    } else if (extent.value() > 0) {
      ranges_.push_back({dest.data, extent.value(), &dest.name});
    }
    plan_.destination_state[d] = DestinationState::kFilled;
    destinations_of_[*i].push_back(d);
    return Status::ok();
  }

  void leave_to_caller(size_t tensor, size_t d) {
    plan_.destination_state[d] = DestinationState::kCallerCopies;
    if (caller_copies_[tensor] < 0) caller_copies_[tensor] = static_cast<long>(d);
  }

  // into=: every selected name without a destination is unexpected.
  void list_unexpected() {
    auto check = [&](const std::string& name) {
      if (!destination_names_.contains(name)) plan_.unexpected.push_back(name);
    };
    if (all_) {
      for (const ManifestTensor& t : m_.tensors) check(t.name);
      for (const auto& [alias, target] : m_.aliases) check(alias);
      return;
    }
    std::unordered_set<std::string_view> seen;
    for (const std::string& name : *r_.names) {
      if (index_.resolve(name) && seen.insert(name).second) check(name);
    }
  }

  // Requested dtypes, by stored tensor (tied names share one tensor and one dtype).
  Status read_requested_dtypes() {
    if (!r_.dtype.empty() && find_dtype(r_.dtype) == nullptr)
      return invalid("dtype= names an unknown dtype '" + r_.dtype + "'");
    wanted_.assign(n_, nullptr);
    std::vector<std::string> unknown;
    for (const auto& [name, dtype] : r_.dtype_by_name) {
      std::optional<size_t> i = index_.resolve(name);
      if (!i) {
        unknown.push_back(name);
        continue;
      }
      if (find_dtype(dtype) == nullptr)
        return invalid("dtype= asks for an unknown dtype '" + dtype + "' for '" + name + "'");
      if (wanted_[*i] != nullptr && *wanted_[*i] != dtype) {
        return invalid("dtype= asks for both " + *wanted_[*i] + " and " + dtype + " for '" +
                       m_.tensors[*i].name + "' (tied names share one tensor)");
      }
      wanted_[*i] = &dtype;
    }
    if (r_.strict && !unknown.empty()) {
      return invalid("dtype= names tensors that checkpoint " + dir_ + " does not have: " +
                     listed(unknown, ", ") + ". Pass strict=False to ignore them.");
    }
    return Status::ok();
  }

  // The destinations of stored tensor i, each piece of memory once (tied weights in into=
  // name the same memory twice), less the device ones that another route leaves to the caller.
  void gather_destinations(size_t i, PlannedTensor& p) {
    const ManifestTensor& t = m_.tensors[i];
    for (size_t d : destinations_of_[i]) {
      const LoadDestination& dest = r_.destinations[d];
      bool same = false;
      for (size_t e : p.destinations) {
        const LoadDestination& kept = r_.destinations[e];
        same = same ||
               (kept.data == dest.data && kept.dtype == dest.dtype &&
                plain_strides(kept.shape, kept.strides) == plain_strides(dest.shape, dest.strides));
      }
      if (!same) p.destinations.push_back(d);
    }
    // Device memory is written only by the staged read's host-to-device copies (the direct
    // route): a tensor that needs another route, or has other destinations too, leaves its
    // device destinations to the caller, from new host memory.
    const bool device_ok = t.encoding == kEncodingRaw && one_plain_destination(t, p);
    for (auto it = p.destinations.begin(); it != p.destinations.end();) {
      if (r_.destinations[*it].memory == MemoryKind::kHost || device_ok) {
        ++it;
        continue;
      }
      leave_to_caller(i, *it);
      it = p.destinations.erase(it);
    }
  }

  bool one_plain_destination(const ManifestTensor& t, const PlannedTensor& p) const {
    return p.destinations.size() == 1 && r_.destinations[p.destinations[0]].dtype == t.dtype &&
           is_contiguous(t.shape, r_.destinations[p.destinations[0]].strides);
  }

  // The dtype stored tensor i loads as: its destination's, the caller's copy's, dtype='s.
  std::string load_dtype(size_t i, const PlannedTensor& p, const DtypeInfo& stored) const {
    const ManifestTensor& t = m_.tensors[i];
    if (!p.destinations.empty()) return r_.destinations[p.destinations[0]].dtype;
    if (caller_copies_[i] >= 0)
      return r_.destinations[static_cast<size_t>(caller_copies_[i])].dtype;
    if (wanted_[i] != nullptr) return *wanted_[i];
    // A blanket dtype converts floating-point tensors only.
    if (!r_.dtype.empty() && stored.kind == DtypeKind::kFloat) return r_.dtype;
    return t.dtype;
  }

  LoadRoute route(const ManifestTensor& t, const PlannedTensor& p) const {
    if (t.encoding != kEncodingRaw) {
      // Stored and raw bytes of one tensor in memory at once, two tensors at a time.
      bool fits = r_.max_memory == 0 || t.length + t.stored_length <= r_.max_memory / 2;
      return fits ? LoadRoute::kDecode : LoadRoute::kStream;
    }
    if (t.length == 0 || (p.destinations.empty() && p.dtype == t.dtype)) return LoadRoute::kSpan;
    if (one_plain_destination(t, p)) return LoadRoute::kDirect;
    if (r_.max_memory != 0 && t.length > r_.max_memory) return LoadRoute::kStream;
    return LoadRoute::kConvert;
  }

  Status plan_tensor(size_t i) {
    const ManifestTensor& t = m_.tensors[i];
    if (Status st = check_encoding_supported(t); !st.is_ok()) return st;
    const DtypeInfo* stored = find_dtype(t.dtype);
    if (stored == nullptr)
      return Status(StatusCode::kDataLoss, "tensor '" + t.name + "' has an unknown dtype");
    PlannedTensor p;
    p.tensor = i;
    gather_destinations(i, p);
    p.dtype = load_dtype(i, p, *stored);
    if (!conversion_supported(t.dtype, p.dtype)) {
      return invalid("cannot load tensor '" + t.name + "' as " + p.dtype + ": " +
                     convert_elements(t.dtype, nullptr, p.dtype, nullptr, 0).message());
    }
    p.route = route(t, p);
    plan_.total_bytes += t.length;
    plan_.tensors.push_back(std::move(p));
    return Status::ok();
  }

  const Manifest& m_;
  const std::string& dir_;
  const LoadRequest& r_;
  const NameIndex index_;
  const size_t n_;
  const bool all_;
  LoadPlan plan_;
  std::vector<char> selected_;
  std::unordered_set<std::string_view> selected_names_;
  std::unordered_set<std::string_view> destination_names_;
  std::vector<std::vector<size_t>> destinations_of_;
  std::vector<long> caller_copies_;  // per stored tensor: its first caller-copied destination
  std::vector<MemoryRange> ranges_;
  std::vector<const std::string*> wanted_;  // per stored tensor: its dtype_by_name entry
};

}  // namespace

Result<LoadPlan> plan_load(const Manifest& m, const std::string& dir, const LoadRequest& r) {
  return LoadPlanner(m, dir, r).run();
}

}  // namespace fastpersist::checkpoint
