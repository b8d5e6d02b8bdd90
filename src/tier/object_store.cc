// SPDX-License-Identifier: Apache-2.0
#include "fastpersist/object_store.h"

#include <mutex>
#include <utility>

namespace fastpersist {
namespace {

std::mutex& opener_mutex() {
  static std::mutex mu;
  return mu;
}

ObjectStoreOpener& opener() {
  static ObjectStoreOpener* installed = new ObjectStoreOpener();  // never destroyed: see below
  return *installed;
}

}  // namespace

Status ObjectStore::check_key(std::string_view key) {
  auto bad = [&](const std::string& why) {
    return Status(StatusCode::kInvalidArgument, "object key '" + std::string(key) + "': " + why);
  };
  if (key.empty()) return bad("empty");
  if (key.front() == '/') return bad("must be relative (it starts with '/')");
  size_t begin = 0;
  while (begin <= key.size()) {
    size_t end = key.find('/', begin);
    if (end == std::string_view::npos) end = key.size();
    std::string_view segment = key.substr(begin, end - begin);
    if (segment.empty()) return bad("has an empty segment");
    if (segment == "." || segment == "..")
      return bad("has a '" + std::string(segment) + "' segment");
    begin = end + 1;
  }
  for (char c : key) {
    if (static_cast<unsigned char>(c) < 0x20) return bad("has a control character");
  }
  return Status::ok();
}

bool is_object_store_url(std::string_view path) {
  size_t colon = path.find("://");
  if (colon == std::string_view::npos || colon == 0) return false;
  for (size_t i = 0; i < colon; ++i) {
    char c = path[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (i > 0 && ((c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.'));
    if (!ok) return false;
  }
  return true;
}

// The opener may hold a Python callable: it is never destroyed, since a static destructor runs
// after the interpreter is gone and releasing the callable then would crash the exit.
void set_object_store_opener(ObjectStoreOpener o) {
  std::lock_guard lock(opener_mutex());
  opener() = std::move(o);
}

bool object_store_opener_installed() {
  std::lock_guard lock(opener_mutex());
  return static_cast<bool>(opener());
}

Result<std::shared_ptr<ObjectStore>> open_object_store(const std::string& url) {
  ObjectStoreOpener o;
  {
    std::lock_guard lock(opener_mutex());
    o = opener();
  }
  if (!o) {
    return Status(StatusCode::kUnavailable,
                  "no object-store client in this process to open " + url +
                      " (the Python package provides one, built on boto3: pip install boto3)");
  }
  auto opened = o(url);
  if (opened.is_ok() && *opened == nullptr) {
    return Status(StatusCode::kInternal, "the object-store opener returned no store for " + url);
  }
  return opened;
}

}  // namespace fastpersist
