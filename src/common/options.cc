// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/options.h"

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <string>

#include "fastpersist/config_file.h"

namespace fastpersist {

std::string_view backend_name(Backend b) {
  switch (b) {
    case Backend::kAuto:
      return "auto";
    case Backend::kIoUring:
      return "io_uring";
    case Backend::kLibaio:
      return "libaio";
    case Backend::kThreads:
      return "threads";
  }
  return "unknown";
}

Result<Backend> parse_backend(std::string_view name) {
  for (Backend b : {Backend::kAuto, Backend::kIoUring, Backend::kLibaio, Backend::kThreads}) {
    if (name == backend_name(b)) return b;
  }
  if (name == "uring") return Backend::kIoUring;
  if (name == "aio") return Backend::kLibaio;
  return Status(StatusCode::kInvalidArgument, "unknown backend '" + std::string(name) +
                                                  "' (expected auto, io_uring, libaio or threads)");
}

Status EngineOptions::validate() const {
  auto bad = [](std::string what) { return Status(StatusCode::kInvalidArgument, std::move(what)); };
  if (block_size == 0) return bad("block_size must be positive");
  if (block_size > (size_t{1} << 30)) return bad("block_size must be at most 1 GiB");
  if (queue_depth < 1 || queue_depth > 65536) return bad("queue_depth must be in [1, 65536]");
  if (intra_op_parallelism < 1 || intra_op_parallelism > 1024) {
    return bad("intra_op_parallelism must be in [1, 1024]");
  }
  return Status::ok();
}

Result<uint64_t> parse_size(std::string_view text) {
  const std::string_view original = text;  // the message quotes what the user wrote
  auto bad = [original] {
    return Status(StatusCode::kInvalidArgument, "cannot parse size '" + std::string(original) +
                                                    "' (examples: 4096, 64KiB, 8M, 4GiB)");
  };
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  uint64_t number = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (ec != std::errc() || end == text.data()) return bad();
  std::string unit(end, text.data() + text.size());
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  unsigned shift = 0;
  if (unit.empty() || unit == "b")
    shift = 0;
  else if (unit == "k" || unit == "kb" || unit == "kib")
    shift = 10;
  else if (unit == "m" || unit == "mb" || unit == "mib")
    shift = 20;
  else if (unit == "g" || unit == "gb" || unit == "gib")
    shift = 30;
  else if (unit == "t" || unit == "tb" || unit == "tib")
    shift = 40;
  else
    return bad();
  if (shift && number > (UINT64_MAX >> shift)) return bad();
  return number << shift;
}

Result<uint64_t> parse_hf_size(std::string_view text) {
  auto bad = [text] {
    return Status(StatusCode::kInvalidArgument,
                  "cannot parse size '" + std::string(text) +
                      "' as Hugging Face does (examples: 5GB = 5*10^9 bytes, 500MB, "
                      "2GiB = 2*2^30 bytes)");
  };
  std::string upper(text);
  for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  struct Unit {
    const char* suffix;
    uint64_t factor;
    bool decimal;
  };
  static constexpr Unit kUnits[] = {{"GIB", uint64_t{1} << 30, false},
                                    {"MIB", uint64_t{1} << 20, false},
                                    {"KIB", uint64_t{1} << 10, false},
                                    {"GB", 1000000000, true},
                                    {"MB", 1000000, true},
                                    {"KB", 1000, true},
                                    {"", 1, false}};
  for (const Unit& u : kUnits) {
    const std::string_view suffix(u.suffix);
    if (upper.size() < suffix.size() ||
        upper.compare(upper.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string_view digits = text.substr(0, text.size() - suffix.size());
    uint64_t number = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), number);
    if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty()) return bad();
    if (number > UINT64_MAX / u.factor) return bad();
    const bool bits = u.decimal && text.back() == 'b';
    return bits ? number * u.factor / 8 : number * u.factor;
  }
  return bad();
}

namespace {

Result<uint64_t> env_number(const char* name, const char* value, bool allow_units) {
  std::string_view text(value);
  bool digits_only =
      !text.empty() && text.find_first_not_of("0123456789") == std::string_view::npos;
  Result<uint64_t> parsed = parse_size(text);
  // Counts are stored as unsigned; a larger value must not wrap into a small valid one.
  bool fits = parsed.is_ok() && (allow_units || *parsed <= std::numeric_limits<unsigned>::max());
  if (!fits || (!allow_units && !digits_only)) {
    return Status(StatusCode::kInvalidArgument, std::string("environment variable ") + name + "='" +
                                                    value + "' is not a " +
                                                    (allow_units ? "size" : "number"));
  }
  return parsed;
}

Result<bool> env_bool(const char* name, const char* value) {
  std::string v(value);
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  return Status(StatusCode::kInvalidArgument, std::string("environment variable ") + name + "='" +
                                                  value + "' is not a boolean (0/1)");
}

}  // namespace

Result<EngineOptions> engine_options_from_env(EngineOptions base) {
  // The configuration file first (config_file.h), then the individual variables over it.
  FP_ASSIGN_OR_RETURN(ConfigFile config, active_config(base));
  EngineOptions o = config.engine;
  if (const char* v = std::getenv("FASTPERSIST_BACKEND")) {
    FP_ASSIGN_OR_RETURN(o.backend, parse_backend(v));
  }
  if (const char* v = std::getenv("FASTPERSIST_BLOCK_SIZE")) {
    FP_ASSIGN_OR_RETURN(o.block_size, env_number("FASTPERSIST_BLOCK_SIZE", v, true));
  }
  if (const char* v = std::getenv("FASTPERSIST_QUEUE_DEPTH")) {
    FP_ASSIGN_OR_RETURN(auto n, env_number("FASTPERSIST_QUEUE_DEPTH", v, false));
    o.queue_depth = static_cast<unsigned>(n);
  }
  if (const char* v = std::getenv("FASTPERSIST_INTRA_OP_PARALLELISM")) {
    FP_ASSIGN_OR_RETURN(auto n, env_number("FASTPERSIST_INTRA_OP_PARALLELISM", v, false));
    o.intra_op_parallelism = static_cast<unsigned>(n);
  }
  if (const char* v = std::getenv("FASTPERSIST_SINGLE_SUBMIT")) {
    FP_ASSIGN_OR_RETURN(o.single_submit, env_bool("FASTPERSIST_SINGLE_SUBMIT", v));
  }
  if (const char* v = std::getenv("FASTPERSIST_OVERLAP_EVENTS")) {
    FP_ASSIGN_OR_RETURN(o.overlap_events, env_bool("FASTPERSIST_OVERLAP_EVENTS", v));
  }
  if (const char* v = std::getenv("FASTPERSIST_DIRECT_IO")) {
    FP_ASSIGN_OR_RETURN(o.direct_io, env_bool("FASTPERSIST_DIRECT_IO", v));
  }
  if (const char* v = std::getenv("FASTPERSIST_DIRECT_IO_MIN_BYTES")) {
    FP_ASSIGN_OR_RETURN(o.direct_io_min_bytes,
                        env_number("FASTPERSIST_DIRECT_IO_MIN_BYTES", v, true));
  }
  FP_RETURN_IF_ERROR(o.validate());
  return o;
}

}  // namespace fastpersist
