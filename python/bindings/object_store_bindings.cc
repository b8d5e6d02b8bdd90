// SPDX-License-Identifier: Apache-2.0
// Object stores written in Python (python/fastpersist/object_store.py: boto3) as the C++
// ObjectStore the tiers use (include/fastpersist/object_store.h).
//
// The C++ side calls a store from its own threads (the drain thread, the part uploads): each
// call takes the GIL only while it is in Python, and the client library releases it during its
// network I/O, so parts still go up in parallel. Bytes cross as memoryviews over the C++ buffer,
// never copied here; they are released when the call returns. A Python exception becomes a
// Status (FileNotFoundError: kNotFound, EOFError: kDataLoss, ValueError: kInvalidArgument, other
// OSErrors with their errno, anything else kIoError) whose message keeps the exception's text.
//
// Python objects are only touched with the GIL held, and never once the interpreter is
// finalizing (a store still referenced by C++ then is left to the exiting process).
#include <nanobind/stl/string.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "fastpersist/object_store.h"
#include "fastpersist/tier.h"

namespace fastpersist::python {
namespace {

bool python_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

Status python_unavailable(const std::string& what) {
  return Status(StatusCode::kUnavailable, what + ": the Python interpreter is shutting down");
}

// The exception being handled, as a Status.
Status status_of(nb::python_error& e, const std::string& what) {
  nb::handle type = e.type();
  std::string text = what + ": " + std::string(nb::str(type.attr("__name__")).c_str()) + ": " +
                     std::string(nb::str(e.value()).c_str());
  auto is = [&](PyObject* base) { return PyErr_GivenExceptionMatches(type.ptr(), base) != 0; };
  if (is(PyExc_FileNotFoundError)) return Status(StatusCode::kNotFound, text);
  if (is(PyExc_EOFError)) return Status(StatusCode::kDataLoss, text);
  if (is(PyExc_ValueError)) return Status(StatusCode::kInvalidArgument, text);
  if (is(PyExc_OSError)) {
    int err = 0;
    nb::object errno_value = nb::getattr(e.value(), "errno", nb::none());
    if (!errno_value.is_none() && nb::isinstance<nb::int_>(errno_value))
      err = nb::cast<int>(errno_value);
    return Status(StatusCode::kIoError, text, err);
  }
  return Status(StatusCode::kIoError, text);
}

// A memoryview over C++ memory for the length of one call.
class View {
 public:
  View(const std::byte* data, size_t n, bool writable)
      : view_(nb::steal(PyMemoryView_FromMemory(
            reinterpret_cast<char*>(const_cast<std::byte*>(data)), static_cast<Py_ssize_t>(n),
            writable ? PyBUF_WRITE : PyBUF_READ))) {
    if (!view_.is_valid()) throw nb::python_error();
  }
  ~View() {
    // The memory is only lent: a view the callee kept must not reach it afterwards.
    nb::object released = nb::steal(PyObject_CallMethod(view_.ptr(), "release", nullptr));
    if (!released.is_valid()) PyErr_Clear();
  }
  nb::handle get() const { return view_; }

 private:
  nb::object view_;
};

// Holds a Python object for C++ code that may drop it on any thread.
struct PyRef {
  explicit PyRef(nb::object o) : object(std::move(o)) {}
  ~PyRef() {
    if (!python_alive()) {
      (void)object.release();  // leaked: the interpreter is going away
      return;
    }
    nb::gil_scoped_acquire gil;
    object.reset();
  }
  nb::object object;
};

class PyObjectStore final : public ObjectStore {
 public:
  PyObjectStore(nb::object store, std::string url)
      : store_(std::make_shared<PyRef>(std::move(store))), url_(std::move(url)) {}

  nb::object python_object() const { return store_->object; }
  std::string url() const override { return url_; }

  Result<std::vector<ObjectEntry>> list(const std::string& prefix) override {
    return call<std::vector<ObjectEntry>>("listing " + url_ + "/" + prefix, [&] {
      std::vector<ObjectEntry> out;
      for (nb::handle item : store_->object.attr("list")(prefix)) {
        out.push_back({nb::cast<std::string>(item[0]), nb::cast<uint64_t>(item[1])});
      }
      return out;
    });
  }

  Status get(const std::string& key, uint64_t offset, std::span<std::byte> into) override {
    return call_status("reading " + url_ + "/" + key, [&] {
      View view(into.data(), into.size(), true);
      store_->object.attr("get_into")(key, offset, view.get());
    });
  }

  Status put(const std::string& key, std::span<const std::byte> data) override {
    return call_status("writing " + url_ + "/" + key, [&] {
      View view(data.data(), data.size(), false);
      store_->object.attr("put")(key, view.get());
    });
  }

  Result<std::string> begin_upload(const std::string& key) override {
    return call<std::string>("starting an upload of " + url_ + "/" + key, [&] {
      return nb::cast<std::string>(store_->object.attr("begin_upload")(key));
    });
  }

  Result<std::string> upload_part(const std::string& key, const std::string& upload_id,
                                  int part_number, std::span<const std::byte> data) override {
    return call<std::string>(
        "uploading part " + std::to_string(part_number) + " of " + url_ + "/" + key, [&] {
          View view(data.data(), data.size(), false);
          return nb::cast<std::string>(
              store_->object.attr("upload_part")(key, upload_id, part_number, view.get()));
        });
  }

  Status complete_upload(const std::string& key, const std::string& upload_id,
                         const std::vector<std::string>& etags) override {
    return call_status("completing the upload of " + url_ + "/" + key, [&] {
      nb::list tags;
      for (const std::string& t : etags) tags.append(nb::str(t.c_str(), t.size()));
      store_->object.attr("complete_upload")(key, upload_id, tags);
    });
  }

  Status abort_upload(const std::string& key, const std::string& upload_id) override {
    return call_status("aborting the upload of " + url_ + "/" + key,
                       [&] { store_->object.attr("abort_upload")(key, upload_id); });
  }

  Result<uint64_t> abort_uploads(const std::string& prefix) override {
    return call<uint64_t>("aborting the unfinished uploads under " + url_ + "/" + prefix, [&] {
      return nb::cast<uint64_t>(store_->object.attr("abort_uploads")(prefix));
    });
  }

  Status remove(const std::vector<std::string>& keys) override {
    return call_status("removing objects of " + url_, [&] {
      nb::list names;
      for (const std::string& k : keys) names.append(nb::str(k.c_str(), k.size()));
      store_->object.attr("remove")(names);
    });
  }

 private:
  template <typename T, typename F>
  Result<T> call(const std::string& what, F&& fn) {
    if (!python_alive()) return python_unavailable(what);
    nb::gil_scoped_acquire gil;
    try {
      return Result<T>(fn());
    } catch (nb::python_error& e) {
      return status_of(e, what);
    } catch (const nb::cast_error&) {
      return Status(StatusCode::kIoError, what + ": the store returned a value of the wrong type");
    } catch (const std::exception& e) {
      return Status(StatusCode::kIoError, what + ": " + e.what());
    }
  }
  template <typename F>
  Status call_status(const std::string& what, F&& fn) {
    auto r = call<bool>(what, [&] {
      fn();
      return true;
    });
    return r.status();
  }

  std::shared_ptr<PyRef> store_;
  std::string url_;
};

std::shared_ptr<ObjectStore> wrap_store(nb::handle store) {
  nb::object url = nb::getattr(store, "url", nb::none());
  if (!nb::isinstance<nb::str>(url)) {
    throw nb::type_error(
        "fastpersist: an object store needs a str attribute 'url' (e.g. fastpersist.S3Store)");
  }
  for (const char* method : {"list", "get_into", "put", "begin_upload", "upload_part",
                             "complete_upload", "abort_upload", "abort_uploads", "remove"}) {
    if (!nb::hasattr(store, method)) {
      throw nb::type_error(
          (std::string("fastpersist: an object store needs a method '") + method + "'").c_str());
    }
  }
  return std::make_shared<PyObjectStore>(nb::borrow(store), nb::cast<std::string>(url));
}

}  // namespace

void bind_object_stores(nb::module_& m) {
  using namespace nb::literals;
  m.def(
      "set_object_store_opener",
      [](nb::object opener) {
        if (opener.is_none()) {
          set_object_store_opener({});
          return;
        }
        auto held = std::make_shared<PyRef>(std::move(opener));
        set_object_store_opener(
            [held](const std::string& url) -> Result<std::shared_ptr<ObjectStore>> {
              const std::string what = "opening " + url;
              if (!python_alive()) return python_unavailable(what);
              nb::gil_scoped_acquire gil;
              try {
                return wrap_store(held->object(url));
              } catch (nb::python_error& e) {
                return status_of(e, what);
              } catch (const std::exception& e) {
                return Status(StatusCode::kInvalidArgument, what + ": " + e.what());
              }
            });
      },
      "opener"_a.none(),
      "Installs the function that turns a tier URL into an object store (None: none).");
  m.def("is_object_store_url", [](const std::string& path) { return is_object_store_url(path); });
  m.def(
      "check_object_key", [](const std::string& key) { check(ObjectStore::check_key(key)); },
      "key"_a,
      "Raises ValueError unless `key` is a well-formed relative object key "
      "(ObjectStore::check_key: "
      "not empty, no leading '/', no empty, '.' or '..' segment, no control character).");

  nb::class_<TierOptions> tier = nb::borrow<nb::class_<TierOptions>>(m.attr("TierOptions"));
  tier.def_prop_rw(
      "store",
      [](const TierOptions& t) -> nb::object {
        auto* py = dynamic_cast<PyObjectStore*>(t.store.get());
        return py != nullptr ? py->python_object() : nb::none();
      },
      [](TierOptions& t, nb::object store) {
        t.store = store.is_none() ? nullptr : wrap_store(store);
      },
      nb::arg("store").none());
  tier.def_rw("part_bytes", &TierOptions::part_bytes);
  tier.def_rw("transfers", &TierOptions::transfers);
}

}  // namespace fastpersist::python
