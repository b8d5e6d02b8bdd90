// SPDX-License-Identifier: Apache-2.0
// A program that uses only the installed package (find_package(fastpersist)): it saves a
// checkpoint of a few float tensors with CheckpointManager, reads it back with CheckpointReader
// and compares every byte, verifies its checksums and lists the root. It exits 1 on any error
// or mismatch, so CI runs it (examples/cpp/build_and_run.sh).
//
// Usage: fastpersist_example <checkpoint root: a new or empty folder>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fastpersist/checkpoint.h"
#include "fastpersist/checkpoint_reader.h"
#include "fastpersist/io_engine.h"
#include "fastpersist/status.h"

namespace fp = fastpersist;

namespace {

struct Tensor {
  std::string name;
  std::vector<uint64_t> shape;
  std::vector<float> values;
};

Tensor make_tensor(std::string name, std::vector<uint64_t> shape, float seed) {
  uint64_t count = 1;
  for (uint64_t dim : shape) count *= dim;
  Tensor t{std::move(name), std::move(shape), std::vector<float>(count)};
  for (uint64_t i = 0; i < count; ++i) t.values[i] = seed + static_cast<float>(i % 1000) * 0.25f;
  return t;
}

int fail(const std::string& what, const fp::Status& status) {
  std::fprintf(stderr, "fastpersist_example: %s: %s\n", what.c_str(), status.to_string().c_str());
  return 1;
}

int fail(const std::string& what) {
  std::fprintf(stderr, "fastpersist_example: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return fail("usage: fastpersist_example <checkpoint root>");
  const std::string root = argv[1];
  const std::vector<Tensor> model = {make_tensor("embed.weight", {1024, 256}, 1.0f),
                                     make_tensor("layer0.weight", {256, 256}, 2.0f),
                                     make_tensor("layer0.bias", {256}, 3.0f)};

  // Save: the manager snapshots the tensors, writes safetensors files and commits a manifest.
  {
    auto manager = fp::CheckpointManager::open(root);
    if (!manager.is_ok()) return fail("open " + root, manager.status());
    fp::CheckpointContent content;
    content.step = 100;
    for (const Tensor& t : model) {
      content.tensors.push_back({.name = t.name,
                                 .dtype = "F32",
                                 .shape = t.shape,
                                 .data = reinterpret_cast<const std::byte*>(t.values.data()),
                                 .nbytes = t.values.size() * sizeof(float)});
    }
    if (fp::Status st = (*manager)->save("step-100", std::move(content)); !st.is_ok()) {
      return fail("save", st);
    }
    if (fp::Status st = (*manager)->close(); !st.is_ok()) return fail("close", st);
  }

  auto created = fp::IoEngine::create(fp::EngineOptions{});
  if (!created.is_ok()) return fail("engine", created.status());
  std::shared_ptr<fp::IoEngine> engine = std::move(created).value();

  // Load: find the newest checkpoint, read every tensor into our own memory, checksums checked.
  auto latest = fp::latest_checkpoint(root);
  if (!latest.is_ok()) return fail("latest", latest.status());
  if (*latest != "step-100") return fail("latest is not step-100");
  const std::string dir = root + "/" + **latest;
  auto reader = fp::CheckpointReader::open(dir, engine);
  if (!reader.is_ok()) return fail("open " + dir, reader.status());
  const fp::Manifest& manifest = (*reader)->manifest();

  std::vector<std::vector<float>> loaded;
  std::vector<fp::TensorReadRequest> requests;
  for (const Tensor& t : model) {
    size_t index = 0;
    while (index < manifest.tensors.size() && manifest.tensors[index].name != t.name) ++index;
    if (index == manifest.tensors.size()) return fail("no tensor " + t.name + " in the manifest");
    const fp::ManifestTensor& record = manifest.tensors[index];
    if (record.dtype != "F32" || record.shape != t.shape) {
      return fail("tensor " + t.name + ": dtype or shape differs");
    }
    loaded.emplace_back(t.values.size());
    requests.push_back({.tensor = index,
                        .destination = reinterpret_cast<std::byte*>(loaded.back().data()),
                        .capacity = loaded.back().size() * sizeof(float)});
  }
  auto read = (*reader)->read(requests, /*verify=*/true);
  if (!read.is_ok()) return fail("read", read.status());
  for (size_t i = 0; i < model.size(); ++i) {
    if (std::memcmp(loaded[i].data(), model[i].values.data(),
                    model[i].values.size() * sizeof(float)) != 0) {
      return fail("tensor " + model[i].name + ": loaded bytes differ from the saved ones");
    }
  }

  // Verify: every byte against the manifest's checksums.
  auto report = fp::verify_checkpoint(dir, *engine);
  if (!report.is_ok()) return fail("verify", report.status());
  for (const std::string& problem : report->problems) std::fprintf(stderr, "%s\n", problem.c_str());
  if (!report->ok() || !report->has_checksums) return fail("verify found problems");

  // List: the root holds exactly this checkpoint.
  auto listed = fp::list_checkpoints(root);
  if (!listed.is_ok()) return fail("list", listed.status());
  for (const fp::CheckpointInfo& info : *listed) {
    std::printf("%s  step %lld  %zu tensors  %llu bytes\n", info.tag.c_str(),
                static_cast<long long>(info.step.value_or(-1)), info.num_tensors,
                static_cast<unsigned long long>(info.total_bytes));
  }
  if (listed->size() != 1 || listed->front().num_tensors != model.size()) {
    return fail("list: expected one checkpoint of " + std::to_string(model.size()) + " tensors");
  }
  std::printf("saved, loaded (%zu tensors, bytes equal), verified (%llu bytes checked)\n",
              model.size(), static_cast<unsigned long long>(report->bytes_checked));
  return 0;
}
