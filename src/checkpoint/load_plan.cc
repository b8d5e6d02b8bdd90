// SPDX-License-Identifier: Apache-2.0
// See load_plan.h. Every name is looked up in hash tables built once per load, so planning a
// load of 10^5 tensors takes a few milliseconds; names are compared whole, never parsed.
#include "checkpoint/load_plan.h"

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

Result<LoadPlan> plan_load(const Manifest& m, const std::string& dir, const LoadRequest& r) {
  const NameIndex index(m);
  const size_t n = m.tensors.size();
  const bool all = !r.names.has_value();
  LoadPlan plan;

  // Selection: by name (an alias is selected by its own name, its stored tensor is read).
  std::vector<char> selected(n, all ? 1 : 0);
  std::unordered_set<std::string_view> selected_names;
  if (!all) {
    selected_names.reserve(r.names->size());
    for (const std::string& name : *r.names) {
      std::optional<size_t> i = index.resolve(name);
      if (!i) {
        plan.missing.push_back(name);
        continue;
      }
      selected[*i] = 1;
      selected_names.insert(name);
    }
  }
  auto name_selected = [&](std::string_view name) { return all || selected_names.contains(name); };

  // Destinations: shape, dtype, capacity, strides, then (all at once) writability.
  plan.destination_state.assign(r.destinations.size(), DestinationState::kUnused);
  std::unordered_set<std::string_view> destination_names;
  destination_names.reserve(r.destinations.size());
  std::vector<std::vector<size_t>> destinations_of(n);
  std::vector<long> caller_copies(n, -1);
  std::vector<MemoryRange> ranges;
  for (size_t d = 0; d < r.destinations.size(); ++d) {
    const LoadDestination& dest = r.destinations[d];
    if (!destination_names.insert(dest.name).second) {
      return invalid("two destinations are named '" + dest.name + "'");
    }
    std::optional<size_t> i = index.resolve(dest.name);
    if (!i) {
      if (all && r.into) plan.missing.push_back(dest.name);
      continue;
    }
    if (!name_selected(dest.name)) continue;
    const ManifestTensor& t = m.tensors[*i];
    if (dest.shape != t.shape) {
      plan.mismatched.push_back(dest.name + ": checkpoint " + shape_text(t.shape) +
                                ", destination " + shape_text(dest.shape));
      continue;
    }
    const DtypeInfo* info = find_dtype(dest.dtype);
    if (info == nullptr) {
      return invalid("the destination of '" + dest.name + "' has dtype '" + dest.dtype +
                     "', which no checkpoint tensor loads into");
    }
    if (!conversion_supported(t.dtype, dest.dtype)) {
      return invalid("cannot load tensor '" + dest.name + "' (" + t.dtype +
                     ") into a destination of " + dest.dtype + ": " +
                     convert_elements(t.dtype, nullptr, dest.dtype, nullptr, 0).message());
    }
    if (dest.data == nullptr) {
      plan.destination_state[d] = DestinationState::kCallerCopies;
      if (caller_copies[*i] < 0) caller_copies[*i] = static_cast<long>(d);
      continue;
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
      // per tensor below.
      plan.destination_state[d] = DestinationState::kFilled;
      destinations_of[*i].push_back(d);
      continue;
    }
    if (extent.value() > 0) ranges.push_back({dest.data, extent.value(), &dest.name});
    plan.destination_state[d] = DestinationState::kFilled;
    destinations_of[*i].push_back(d);
  }
  if (r.into) {
    auto check = [&](const std::string& name) {
      if (!destination_names.contains(name)) plan.unexpected.push_back(name);
    };
    if (all) {
      for (const ManifestTensor& t : m.tensors) check(t.name);
      for (const auto& [alias, target] : m.aliases) check(alias);
    } else {
      std::unordered_set<std::string_view> seen;
      for (const std::string& name : *r.names) {
        if (index.resolve(name) && seen.insert(name).second) check(name);
      }
    }
  }

  // Requested dtypes, by stored tensor (tied names share one tensor and one dtype).
  if (!r.dtype.empty() && find_dtype(r.dtype) == nullptr)
    return invalid("dtype= names an unknown dtype '" + r.dtype + "'");
  std::vector<const std::string*> wanted(n, nullptr);
  std::vector<std::string> unknown;
  for (const auto& [name, dtype] : r.dtype_by_name) {
    std::optional<size_t> i = index.resolve(name);
    if (!i) {
      unknown.push_back(name);
      continue;
    }
    if (find_dtype(dtype) == nullptr)
      return invalid("dtype= asks for an unknown dtype '" + dtype + "' for '" + name + "'");
    if (wanted[*i] != nullptr && *wanted[*i] != dtype) {
      return invalid("dtype= asks for both " + *wanted[*i] + " and " + dtype + " for '" +
                     m.tensors[*i].name + "' (tied names share one tensor)");
    }
    wanted[*i] = &dtype;
  }
  if (r.strict && !unknown.empty()) {
    return invalid("dtype= names tensors that checkpoint " + dir + " does not have: " +
                   listed(unknown, ", ") + ". Pass strict=False to ignore them.");
  }
  if (r.strict && (!plan.missing.empty() || !plan.unexpected.empty() || !plan.mismatched.empty())) {
    return strict_failure(dir, plan);
  }
  FP_RETURN_IF_ERROR(check_writable(std::move(ranges)));

  for (size_t i = 0; i < n; ++i) {
    if (!selected[i]) continue;
    const ManifestTensor& t = m.tensors[i];
    if (Status st = check_encoding_supported(t); !st.is_ok()) return st;
    const bool encoded = t.encoding != kEncodingRaw;
    const DtypeInfo* stored = find_dtype(t.dtype);
    if (stored == nullptr)
      return Status(StatusCode::kDataLoss, "tensor '" + t.name + "' has an unknown dtype");
    PlannedTensor p;
    p.tensor = i;
    // The same memory named twice (tied weights in into=) is written once.
    for (size_t d : destinations_of[i]) {
      const LoadDestination& dest = r.destinations[d];
      bool same = false;
      for (size_t e : p.destinations) {
        const LoadDestination& kept = r.destinations[e];
        same = same ||
               (kept.data == dest.data && kept.dtype == dest.dtype &&
                plain_strides(kept.shape, kept.strides) == plain_strides(dest.shape, dest.strides));
      }
      if (!same) p.destinations.push_back(d);
    }
    // Device memory is written only by the staged read's host-to-device copies (the direct
    // route): a tensor that needs another route, or has other destinations too, leaves its
    // device destinations to the caller, from new host memory.
    const bool device_ok = !encoded && p.destinations.size() == 1 &&
                           r.destinations[p.destinations[0]].dtype == t.dtype &&
                           is_contiguous(t.shape, r.destinations[p.destinations[0]].strides);
    for (auto it = p.destinations.begin(); it != p.destinations.end();) {
      if (r.destinations[*it].memory == MemoryKind::kHost || device_ok) {
        ++it;
        continue;
      }
      plan.destination_state[*it] = DestinationState::kCallerCopies;
      if (caller_copies[i] < 0) caller_copies[i] = static_cast<long>(*it);
      it = p.destinations.erase(it);
    }
    if (!p.destinations.empty()) {
      p.dtype = r.destinations[p.destinations[0]].dtype;
    } else if (caller_copies[i] >= 0) {
      p.dtype = r.destinations[static_cast<size_t>(caller_copies[i])].dtype;
    } else if (wanted[i] != nullptr) {
      p.dtype = *wanted[i];
    } else if (!r.dtype.empty() && stored->kind == DtypeKind::kFloat) {
      p.dtype = r.dtype;  // a blanket dtype converts floating-point tensors only
    } else {
      p.dtype = t.dtype;
    }
    if (!conversion_supported(t.dtype, p.dtype)) {
      return invalid("cannot load tensor '" + t.name + "' as " + p.dtype + ": " +
                     convert_elements(t.dtype, nullptr, p.dtype, nullptr, 0).message());
    }
    bool one_plain_destination = p.destinations.size() == 1 &&
                                 r.destinations[p.destinations[0]].dtype == t.dtype &&
                                 is_contiguous(t.shape, r.destinations[p.destinations[0]].strides);
    if (encoded) {
      // Stored and raw bytes of one tensor in memory at once, two tensors at a time.
      bool fits = r.max_memory == 0 || t.length + t.stored_length <= r.max_memory / 2;
      p.route = fits ? LoadRoute::kDecode : LoadRoute::kStream;
    } else if (t.length == 0 || (p.destinations.empty() && p.dtype == t.dtype)) {
      p.route = LoadRoute::kSpan;
    } else if (one_plain_destination) {
      p.route = LoadRoute::kDirect;
    } else if (r.max_memory != 0 && t.length > r.max_memory) {
      p.route = LoadRoute::kStream;
    } else {
      p.route = LoadRoute::kConvert;
    }
    plan.total_bytes += t.length;
    plan.tensors.push_back(std::move(p));
  }
  return plan;
}

}  // namespace fastpersist::checkpoint
