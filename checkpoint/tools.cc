#include "checkpoint/tools.h"

#include <unistd.h>

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint.h"
#include "runtime/base/json.h"
#include "checkpoint/safetensors.h"
#include "runtime/base/status_macros.h"

namespace ember::ckpt {
namespace {

std::string ShapeStr(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }

json::Value ShapeJson(const std::vector<int64_t>& s) {
  json::Value v = json::Value::MakeArray();
  for (int64_t d : s) v.Push(json::Value::Int(d));
  return v;
}

absl::StatusOr<InspectReport> InspectSafetensors(const std::string& path, const InspectOptions& opts) {
  ASSIGN_OR_RETURN(auto set, SafetensorsSet::Open(path));
  json::Value root = json::Value::MakeObject();
  root.Set("kind", json::Value::Str("safetensors"));
  json::Value tensors = json::Value::MakeObject();
  std::string text = absl::StrCat("safetensors ", path, "\n");
  uint64_t total = 0;
  for (const std::string& n : set->names()) {
    auto [f, t] = *set->Find(n);
    total += t->nbytes();
    json::Value tv = json::Value::MakeObject();
    tv.Set("dtype", json::Value::Str(SafetensorsDTypeName(t->dtype)));
    tv.Set("shape", ShapeJson(t->shape));
    tv.Set("bytes", json::Value::Int(static_cast<int64_t>(t->nbytes())));
    tensors.Set(n, std::move(tv));
    absl::StrAppendFormat(&text, "  %-40s %-5s %s\n", n, SafetensorsDTypeName(t->dtype), ShapeStr(t->shape));
  }
  root.Set("tensors", std::move(tensors));
  root.Set("total_bytes", json::Value::Int(static_cast<int64_t>(total)));
  absl::StrAppend(&text, set->names().size(), " tensors, ", total, " bytes\n");
  return InspectReport{opts.json ? json::Write(root, 2) + "\n" : text, absl::OkStatus()};
}

}  // namespace

absl::StatusOr<InspectReport> InspectCheckpoint(const std::string& path, InspectOptions opts) {
  if (absl::EndsWith(path, ".safetensors") || absl::EndsWith(path, ".json")) {
    return InspectSafetensors(path, opts);
  }
  ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(path));
  const Metadata& m = reader->metadata();
  absl::Status verify = opts.verify ? reader->VerifyAll() : absl::OkStatus();
  json::Value root = json::Value::MakeObject();
  root.Set("kind", json::Value::Str("ember-checkpoint"));
  root.Set("dir", json::Value::Str(reader->dir()));
  root.Set("format_version", json::Value::Str(absl::StrCat(m.format_major, ".", m.format_minor)));
  root.Set("writer_version", json::Value::Str(m.writer_version));
  root.Set("step", json::Value::Int(m.step));
  root.Set("world_size", json::Value::Int(m.world_size));
  json::Value steps = json::Value::MakeArray();
  std::string parent = std::filesystem::path(reader->dir()).parent_path().string();
  for (int64_t s : ListSteps(parent)) steps.Push(json::Value::Int(s));
  root.Set("committed_steps", std::move(steps));
  std::string text = absl::StrFormat("checkpoint %s\n  format %d.%d (writer %s), step %d, world size %d\n",
                                     reader->dir(), m.format_major, m.format_minor, m.writer_version,
                                     m.step, m.world_size);
  for (const auto& [k, v] : m.parallelism) absl::StrAppend(&text, "  parallelism ", k, "=", v, "\n");
  for (const auto& [k, v] : m.extra) absl::StrAppend(&text, "  extra ", k, "=", v, "\n");
  json::Value tensors = json::Value::MakeObject();
  uint64_t total = 0;
  for (const TensorMeta& t : m.tensors) {
    uint64_t bytes = 0;
    for (const ChunkRef& c : t.chunks) bytes += c.length;
    total += bytes;
    json::Value tv = json::Value::MakeObject();
    tv.Set("dtype", json::Value::Str(SafetensorsDTypeName(t.dtype)));
    tv.Set("shape", ShapeJson(t.shape));
    tv.Set("chunks", json::Value::Int(static_cast<int64_t>(t.chunks.size())));
    tv.Set("bytes", json::Value::Int(static_cast<int64_t>(bytes)));
    tensors.Set(t.name, std::move(tv));
    absl::StrAppendFormat(&text, "  %-40s %-5s %-16s %d chunk(s)\n", t.name, SafetensorsDTypeName(t.dtype),
                          ShapeStr(t.shape), t.chunks.size());
  }
  root.Set("tensors", std::move(tensors));
  root.Set("total_bytes", json::Value::Int(static_cast<int64_t>(total)));
  absl::StrAppend(&text, "  ", m.tensors.size(), " tensors, ", total, " bytes in ", m.files.size(),
                  " files\n");
  if (opts.verify) {
    root.Set("verified", json::Value::Bool(verify.ok()));
    if (!verify.ok()) root.Set("verify_error", json::Value::Str(std::string(verify.message())));
    absl::StrAppend(&text, "  verify: ", verify.ok() ? "all checksums OK" : verify.ToString(), "\n");
  }
  return InspectReport{opts.json ? json::Write(root, 2) + "\n" : text, verify};
}

absl::StatusOr<uint64_t> ExportSafetensors(const std::string& ckpt, const std::string& out_path,
                                           ExportOptions opts) {
  ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(ckpt));
  std::vector<TensorSpec> specs;
  for (const TensorMeta& t : reader->metadata().tensors) {
    if (!opts.include_optimizer && absl::StartsWith(t.name, "optim.")) continue;
    specs.push_back({t.name, t.dtype, t.shape});
  }
  uint64_t written = 0;
  auto produce = [&](size_t i, const AppendFn& append) -> absl::Status {
    // Chunk by chunk (rows in order), each streamed in bounded pieces and checksummed.
    const TensorMeta* t = reader->metadata().Find(specs[i].name);
    for (size_t k = 0; k < t->chunks.size(); ++k) {
      const ChunkRef& c = t->chunks[k];
      RETURN_IF_ERROR(reader->StreamChunk(
          c, absl::StrCat("tensor \"", t->name, "\" chunk ", k), [&](absl::string_view piece) {
            written += piece.size();
            return append(piece);
          }));
    }
    return absl::OkStatus();
  };
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"ember.step", absl::StrCat(reader->metadata().step)}};
  if (opts.max_shard_bytes > 0) {
    RETURN_IF_ERROR(WriteShardedSafetensors(out_path, specs, opts.max_shard_bytes, meta, produce));
    return written;
  }
  RETURN_IF_ERROR(WriteSafetensorsAtomic(out_path, specs, meta, produce));
  return written;
}

}  // namespace ember::ckpt
