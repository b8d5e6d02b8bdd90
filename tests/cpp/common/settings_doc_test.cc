// SPDX-License-Identifier: Apache-2.0
// Keeps docs/settings.md honest: every EngineOptions field is documented, and each documented
// default and environment variable is what the code actually uses. The doc is parsed, not copied,
// so editing either side alone fails here.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fastpersist/options.h"

namespace fastpersist {
namespace {

std::filesystem::path source_dir() {
#ifdef FASTPERSIST_SOURCE_DIR
  return FASTPERSIST_SOURCE_DIR;
#else
  // tests/cpp/common/settings_doc_test.cc -> repository root (CMake compiles absolute paths).
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().parent_path();
#endif
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// One row of the "Engine options" table.
struct DocRow {
  std::string field;
  std::string default_text;
  std::string env_var;
};

// The first `code` span of a markdown table cell, or "" when there is none.
std::string code_span(const std::string& cell) {
  size_t open = cell.find('`');
  if (open == std::string::npos) return "";
  size_t close = cell.find('`', open + 1);
  return close == std::string::npos ? "" : cell.substr(open + 1, close - open - 1);
}

std::vector<DocRow> parse_settings_doc(const std::string& text) {
  std::vector<DocRow> rows;
  std::istringstream lines(text);
  std::string line;
  bool in_table = false;
  while (std::getline(lines, line)) {
    if (line.rfind("| Field |", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (line.empty() || line[0] != '|') break;  // the table ended
    if (line.rfind("|---", 0) == 0) continue;
    std::vector<std::string> cells;
    std::string cell;
    std::istringstream cols(line.substr(1));
    while (std::getline(cols, cell, '|')) cells.push_back(cell);
    if (cells.size() < 3) continue;
    rows.push_back({code_span(cells[0]), code_span(cells[1]), code_span(cells[2])});
  }
  return rows;
}

// Member names declared in `struct EngineOptions { ... };` of the public header.
std::set<std::string> fields_declared_in_header() {
  std::string header = read_file(source_dir() / "include/fastpersist/options.h");
  size_t begin = header.find("struct EngineOptions {");
  size_t end = header.find("\n};", begin);
  std::set<std::string> names;
  if (begin == std::string::npos || end == std::string::npos) return names;
  std::string body = header.substr(begin, end - begin);
  static const std::regex member(R"(\n\s+[A-Za-z_][\w:<>]*\s+([a-z_][a-z0-9_]*)\s*=)");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), member);
       it != std::sregex_iterator(); ++it) {
    names.insert((*it)[1]);
  }
  return names;
}

// How to read a field and compare it with text from the doc or a test value.
enum class Kind { kBackend, kSize, kCount, kBool };

struct FieldSpec {
  Kind kind;
  std::string (*get)(const EngineOptions&);
  const char* env_value;     // a valid, non-default value to set the variable to
  const char* env_expected;  // the field afterwards, in canonical form
};

std::string canonical_bool(bool b) { return b ? "true" : "false"; }

const std::map<std::string, FieldSpec>& field_specs() {
  static const std::map<std::string, FieldSpec> specs = {
      {"backend",
       {Kind::kBackend, [](const EngineOptions& o) { return std::string(backend_name(o.backend)); },
        "threads", "threads"}},
      {"block_size",
       {Kind::kSize, [](const EngineOptions& o) { return std::to_string(o.block_size); }, "4MiB",
        "4194304"}},
      {"queue_depth",
       {Kind::kCount, [](const EngineOptions& o) { return std::to_string(o.queue_depth); }, "7",
        "7"}},
      {"single_submit",
       {Kind::kBool, [](const EngineOptions& o) { return canonical_bool(o.single_submit); }, "1",
        "true"}},
      {"overlap_events",
       {Kind::kBool, [](const EngineOptions& o) { return canonical_bool(o.overlap_events); },
        "true", "true"}},
      {"intra_op_parallelism",
       {Kind::kCount, [](const EngineOptions& o) { return std::to_string(o.intra_op_parallelism); },
        "3", "3"}},
      {"direct_io",
       {Kind::kBool, [](const EngineOptions& o) { return canonical_bool(o.direct_io); }, "0",
        "false"}},
      {"direct_io_min_bytes",
       {Kind::kSize, [](const EngineOptions& o) { return std::to_string(o.direct_io_min_bytes); },
        "1MiB", "1048576"}},
  };
  return specs;
}

// The doc's default text in the same canonical form as FieldSpec::get, or nullopt if malformed.
std::optional<std::string> canonical_default(Kind kind, const std::string& text) {
  switch (kind) {
    case Kind::kBackend: {
      Result<Backend> b = parse_backend(text);
      if (!b.is_ok()) return std::nullopt;
      return std::string(backend_name(*b));
    }
    case Kind::kSize:
    case Kind::kCount: {
      Result<uint64_t> n = parse_size(text);
      if (!n.is_ok()) return std::nullopt;
      return std::to_string(*n);
    }
    case Kind::kBool:
      if (text == "true" || text == "false") return text;
      return std::nullopt;
  }
  return std::nullopt;
}

// Sets or clears one variable for the lifetime of the object, restoring the old value after.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const char* value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    if (value != nullptr) {
      ::setenv(name_.c_str(), value, 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

class SettingsDocTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::path doc = source_dir() / "docs/settings.md";
    ASSERT_TRUE(std::filesystem::exists(doc)) << doc << " is missing";
    rows_ = parse_settings_doc(read_file(doc));
    ASSERT_FALSE(rows_.empty()) << "no '| Field |' table found in " << doc;
  }
  std::vector<DocRow> rows_;
};

TEST_F(SettingsDocTest, DocumentsEveryFieldOfEngineOptionsOnce) {
  std::set<std::string> header = fields_declared_in_header();
  ASSERT_FALSE(header.empty())
      << "could not find struct EngineOptions in include/fastpersist/options.h";
  std::set<std::string> documented;
  for (const DocRow& row : rows_) {
    EXPECT_TRUE(documented.insert(row.field).second) << "field documented twice: " << row.field;
  }
  EXPECT_EQ(documented, header) << "docs/settings.md and EngineOptions list different fields";
  std::set<std::string> known;
  for (const auto& [name, spec] : field_specs()) known.insert(name);
  EXPECT_EQ(known, header) << "a field was added to EngineOptions: add it to field_specs() here";
}

// kEngineSettings (options.h), the list the configuration file and Python go by, names every
// field once, with the kind of value the field takes.
TEST_F(SettingsDocTest, EngineSettingsListEveryFieldWithItsKind) {
  std::set<std::string> listed;
  for (const EngineSetting& setting : kEngineSettings) {
    const std::string name(setting.name);
    EXPECT_TRUE(listed.insert(name).second) << "listed twice: " << name;
    auto spec = field_specs().find(name);
    ASSERT_NE(spec, field_specs().end()) << name << " is not a field of EngineOptions";
    const std::map<SettingKind, Kind> kinds = {{SettingKind::kBackend, Kind::kBackend},
                                               {SettingKind::kBytes, Kind::kSize},
                                               {SettingKind::kCount, Kind::kCount},
                                               {SettingKind::kFlag, Kind::kBool}};
    EXPECT_EQ(kinds.at(setting.kind), spec->second.kind) << name;
  }
  EXPECT_EQ(listed, fields_declared_in_header());
}

TEST_F(SettingsDocTest, DefaultsMatchEngineOptions) {
  const EngineOptions defaults{};
  for (const DocRow& row : rows_) {
    auto spec = field_specs().find(row.field);
    if (spec == field_specs().end()) continue;  // reported by the test above
    std::optional<std::string> doc = canonical_default(spec->second.kind, row.default_text);
    ASSERT_TRUE(doc.has_value()) << row.field << ": cannot parse the documented default '"
                                 << row.default_text << "'";
    EXPECT_EQ(*doc, spec->second.get(defaults))
        << row.field << ": docs/settings.md says `" << row.default_text << "`";
  }
}

TEST_F(SettingsDocTest, EachDocumentedEnvVarSetsItsField) {
  // Start from a clean environment so a developer's exported FASTPERSIST_* cannot interfere.
  std::vector<std::unique_ptr<ScopedEnv>> cleared;
  for (const DocRow& row : rows_) {
    if (!row.env_var.empty()) cleared.push_back(std::make_unique<ScopedEnv>(row.env_var, nullptr));
  }
  const EngineOptions defaults{};
  for (const DocRow& row : rows_) {
    auto spec = field_specs().find(row.field);
    if (spec == field_specs().end()) continue;
    ASSERT_EQ(row.env_var.rfind("FASTPERSIST_", 0), 0u)
        << row.field << ": env var '" << row.env_var << "'";
    ScopedEnv set(row.env_var, spec->second.env_value);
    Result<EngineOptions> o = engine_options_from_env();
    ASSERT_TRUE(o.is_ok()) << row.env_var << "=" << spec->second.env_value << ": "
                           << o.status().to_string();
    EXPECT_EQ(spec->second.get(*o), spec->second.env_expected)
        << row.env_var << " does not set " << row.field;
    for (const auto& [other, other_spec] : field_specs()) {
      if (other == row.field) continue;
      EXPECT_EQ(other_spec.get(*o), other_spec.get(defaults))
          << row.env_var << " also changed " << other;
    }
  }
}

TEST_F(SettingsDocTest, EveryEnvVarTheCodeReadsIsDocumented) {
  std::string code = read_file(source_dir() / "src/common/options.cc");
  ASSERT_FALSE(code.empty());
  std::set<std::string> documented;
  for (const DocRow& row : rows_) documented.insert(row.env_var);
  static const std::regex env_name(R"re("(FASTPERSIST_[A-Z0-9_]+)")re");
  std::set<std::string> read_by_code;
  for (auto it = std::sregex_iterator(code.begin(), code.end(), env_name);
       it != std::sregex_iterator(); ++it) {
    read_by_code.insert((*it)[1]);
  }
  EXPECT_FALSE(read_by_code.empty());
  for (const std::string& name : read_by_code) {
    EXPECT_TRUE(documented.count(name))
        << name << " is read in src/common/options.cc but not in docs/settings.md";
  }
}

// Settings outside EngineOptions (the GPU libraries' lookup, ...) have no table row of their
// own, but a variable the library reads anywhere must at least be named in docs/settings.md.
TEST_F(SettingsDocTest, EveryEnvVarReadUnderSrcIsNamedInTheDoc) {
  const std::string doc = read_file(source_dir() / "docs/settings.md");
  ASSERT_FALSE(doc.empty());
  static const std::regex env_name(R"re("(FASTPERSIST_[A-Z0-9_]+)")re");
  std::set<std::string> read_by_code;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(source_dir() / "src")) {
    if (entry.path().extension() != ".cc") continue;
    std::string code = read_file(entry.path());
    for (auto it = std::sregex_iterator(code.begin(), code.end(), env_name);
         it != std::sregex_iterator(); ++it) {
      read_by_code.insert((*it)[1]);
    }
  }
  EXPECT_TRUE(read_by_code.count("FASTPERSIST_DISABLE_CUDA"));  // the scan itself works
  for (const std::string& name : read_by_code) {
    EXPECT_NE(doc.find("`" + name + "`"), std::string::npos)
        << name << " is read under src/ but not named in docs/settings.md";
  }
}

}  // namespace
}  // namespace fastpersist
