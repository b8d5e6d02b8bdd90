// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/config_file.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "common/regular_file.h"

namespace fastpersist {
namespace {

using Json = nlohmann::json;

// A configuration is three levels deep; anything nested further is not one (and is never built
// into a tree, whatever the text holds).
constexpr int kMaxConfigDepth = 8;

Status bad(const std::string& what, const std::string& why) {
  return Status(StatusCode::kInvalidArgument, what + ": " + why);
}

// A byte count: a non-negative integer or a size string ("8MiB").
Result<uint64_t> size_field(const Json& v, const std::string& what, const std::string& field) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_string()) {
    Result<uint64_t> n = parse_size(v.get<std::string>());
    if (n.is_ok()) return n;
    return bad(what, "\"" + field + "\": " + n.status().message());
  }
  return bad(what, "\"" + field +
                       "\" must be a byte count (a non-negative integer or a string "
                       "such as \"8MiB\"), not " +
                       v.dump());
}

Result<unsigned> count_field(const Json& v, const std::string& what, const std::string& field) {
  if (v.is_number_unsigned() && v.get<uint64_t>() <= std::numeric_limits<unsigned>::max()) {
    return static_cast<unsigned>(v.get<uint64_t>());
  }
  return bad(what, "\"" + field + "\" must be a non-negative integer, not " + v.dump());
}

Result<bool> flag_field(const Json& v, const std::string& what, const std::string& field) {
  if (v.is_boolean()) return v.get<bool>();
  return bad(what, "\"" + field + "\" must be true or false, not " + v.dump());
}

Status apply_engine(const Json& engine, const std::string& what, EngineOptions& o) {
  if (!engine.is_object()) return bad(what, "\"engine\" must be an object");
  for (const auto& [key, v] : engine.items()) {
    const std::string field = "engine." + key;
    if (key == "backend") {
      if (!v.is_string()) return bad(what, "\"" + field + "\" must be a string");
      Result<Backend> b = parse_backend(v.get<std::string>());
      if (!b.is_ok()) return bad(what, "\"" + field + "\": " + b.status().message());
      o.backend = *b;
    } else if (key == "block_size") {
      FP_ASSIGN_OR_RETURN(uint64_t n, size_field(v, what, field));
      o.block_size = static_cast<size_t>(n);
    } else if (key == "queue_depth") {
      FP_ASSIGN_OR_RETURN(o.queue_depth, count_field(v, what, field));
    } else if (key == "intra_op_parallelism") {
      FP_ASSIGN_OR_RETURN(o.intra_op_parallelism, count_field(v, what, field));
    } else if (key == "single_submit") {
      FP_ASSIGN_OR_RETURN(o.single_submit, flag_field(v, what, field));
    } else if (key == "overlap_events") {
      FP_ASSIGN_OR_RETURN(o.overlap_events, flag_field(v, what, field));
    } else if (key == "direct_io") {
      FP_ASSIGN_OR_RETURN(o.direct_io, flag_field(v, what, field));
    } else if (key == "direct_io_min_bytes") {
      FP_ASSIGN_OR_RETURN(uint64_t n, size_field(v, what, field));
      o.direct_io_min_bytes = static_cast<size_t>(n);
    } else {
      std::string known;
      for (const EngineSetting& setting : kEngineSettings)
        known += (known.empty() ? "" : ", ") + std::string(setting.name);
      return bad(what, "unknown setting \"" + field + "\" (known: " + known + ")");
    }
  }
  Status st = o.validate();
  if (!st.is_ok()) return bad(what, st.message());
  return Status::ok();
}

Status apply_writer(const Json& writer, const std::string& what, ConfigFile& c) {
  if (!writer.is_object()) return bad(what, "\"writer\" must be an object");
  for (const auto& [key, v] : writer.items()) {
    if (key != "io_buffer_bytes") {
      return bad(what, "unknown setting \"writer." + key + "\" (known: io_buffer_bytes)");
    }
    FP_ASSIGN_OR_RETURN(uint64_t n, size_field(v, what, "writer." + key));
    // FastFileWriter's halves are 4096-aligned O_DIRECT buffers.
    if (n < (uint64_t{8} << 10) || n > (uint64_t{64} << 30) || n % 8192 != 0) {
      return bad(what,
                 "\"writer.io_buffer_bytes\" must be a multiple of 8 KiB in [8 KiB, 64 GiB], "
                 "got " +
                     std::to_string(n));
    }
    c.writer_io_buffer_bytes = static_cast<size_t>(n);
  }
  return Status::ok();
}

// The file use_config_file() chose: its path and text (parsed again over each caller's base,
// so that only the fields it sets change).
struct Chosen {
  std::string path;
  std::string text;
};

struct Active {
  std::mutex mu;
  std::optional<Chosen> chosen;
};

Active& active() {
  static Active a;
  return a;
}

Result<std::string> read_config_text(const std::string& path, const std::string& what) {
  Result<std::string> text =
      read_small_regular_file(path, kMaxConfigFileBytes, Symlinks::kFollow, "configuration file");
  if (!text.is_ok()) return bad(what, text.status().to_string());
  return text;
}

Result<ConfigFile> parse_at(const std::string& path, const std::string& text,
                            const EngineOptions& base) {
  FP_ASSIGN_OR_RETURN(ConfigFile c, parse_config(text, "configuration " + path, base));
  c.path = path;
  return c;
}

}  // namespace

Result<ConfigFile> parse_config(std::string_view text, const std::string& what,
                                const EngineOptions& base) {
  bool too_deep = false;
  // A key given twice in one object is refused: nlohmann keeps the last one silently, and a
  // setting that says two things is a mistake to report, not to resolve.
  std::vector<std::set<std::string>> keys;  // per open object
  std::string repeated;
  Json j = Json::parse(
      text.begin(), text.end(),
      [&](int depth, Json::parse_event_t event, Json& parsed) {
        if (depth > kMaxConfigDepth) too_deep = true;
        if (event == Json::parse_event_t::object_start) keys.emplace_back();
        if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
        if (event == Json::parse_event_t::key && !keys.empty() && parsed.is_string() &&
            !keys.back().insert(parsed.get<std::string>()).second && repeated.empty()) {
          repeated = parsed.get<std::string>();
        }
        return depth <= kMaxConfigDepth;
      },
      /*allow_exceptions=*/false);
  if (too_deep) return bad(what, "nested deeper than a configuration is");
  if (!repeated.empty())
    return bad(what, "the key \"" + repeated + "\" appears twice in one object");
  if (j.is_discarded()) return bad(what, "not valid JSON");
  if (!j.is_object()) return bad(what, "a configuration is a JSON object");
  auto format = j.find("format");
  if (format == j.end() || !format->is_string() ||
      format->get<std::string>() != kConfigFormatName) {
    return bad(what, "not a fastpersist configuration (\"format\" must be \"" +
                         std::string(kConfigFormatName) + "\")");
  }
  auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer())
    return bad(what, "\"version\" must be an integer");
  if (version->get<int64_t>() != kConfigFormatVersion) {
    return bad(what, "version " + version->dump() +
                         " is not one this fastpersist reads (it reads " +
                         std::to_string(kConfigFormatVersion) + ")");
  }
  ConfigFile c;
  c.engine = base;
  for (const auto& [key, v] : j.items()) {
    if (key == "format" || key == "version" || key == "tuned") continue;
    if (key == "engine") {
      FP_RETURN_IF_ERROR(apply_engine(v, what, c.engine));
    } else if (key == "writer") {
      FP_RETURN_IF_ERROR(apply_writer(v, what, c));
    } else {
      return bad(what, "unknown section \"" + key + "\" (known: engine, writer, tuned)");
    }
  }
  return c;
}

Result<ConfigFile> read_config_file(const std::string& path, const EngineOptions& base) {
  FP_ASSIGN_OR_RETURN(std::string text, read_config_text(path, "configuration " + path));
  return parse_at(path, text, base);
}

std::string encode_config(const EngineOptions& e, std::optional<size_t> writer_io_buffer_bytes,
                          const std::string& tuned_json) {
  nlohmann::ordered_json j;
  j["format"] = std::string(kConfigFormatName);
  j["version"] = kConfigFormatVersion;
  j["engine"] = {{"backend", std::string(backend_name(e.backend))},
                 {"block_size", e.block_size},
                 {"queue_depth", e.queue_depth},
                 {"intra_op_parallelism", e.intra_op_parallelism},
                 {"single_submit", e.single_submit},
                 {"overlap_events", e.overlap_events},
                 {"direct_io", e.direct_io},
                 {"direct_io_min_bytes", e.direct_io_min_bytes}};
  if (writer_io_buffer_bytes) j["writer"] = {{"io_buffer_bytes", *writer_io_buffer_bytes}};
  if (!tuned_json.empty()) {
    nlohmann::ordered_json tuned = nlohmann::ordered_json::parse(tuned_json, nullptr, false);
    if (!tuned.is_discarded() && tuned.is_object()) j["tuned"] = std::move(tuned);
  }
  return j.dump(2) + "\n";
}

Result<ConfigFile> use_config_file(const std::string& path) {
  Active& a = active();
  if (path.empty()) {
    {
      std::lock_guard<std::mutex> lock(a.mu);
      a.chosen.reset();
    }
    return active_config();
  }
  FP_ASSIGN_OR_RETURN(std::string text, read_config_text(path, "configuration " + path));
  FP_ASSIGN_OR_RETURN(ConfigFile c, parse_at(path, text, EngineOptions{}));
  std::lock_guard<std::mutex> lock(a.mu);
  a.chosen = Chosen{path, std::move(text)};
  return c;
}

Result<ConfigFile> active_config(const EngineOptions& base) {
  std::optional<Chosen> chosen;
  {
    Active& a = active();
    std::lock_guard<std::mutex> lock(a.mu);
    chosen = a.chosen;
  }
  if (chosen) return parse_at(chosen->path, chosen->text, base);
  const char* env = std::getenv(kConfigEnvVariable);
  if (env == nullptr || *env == '\0') {
    ConfigFile none;
    none.engine = base;
    return none;
  }
  Result<ConfigFile> c = read_config_file(env, base);
  if (!c.is_ok()) {
    return bad(std::string("environment variable ") + kConfigEnvVariable + "=" + env,
               c.status().message());
  }
  return c;
}

}  // namespace fastpersist
