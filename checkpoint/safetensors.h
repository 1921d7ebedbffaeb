// Native safetensors reader and writer (https://github.com/huggingface/safetensors, format v0):
//
//   [8 bytes: N, little-endian u64][N bytes: UTF-8 JSON header, space-padded to 8-byte alignment]
//   [data: the tensors' bytes, contiguous, no holes, in data_offsets order]
//
// The header maps each tensor name to {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}
// (offsets relative to the data section) plus an optional "__metadata__" string->string map.
//
// Reading validates everything against the file before any tensor byte is touched: the header
// length against the file size and kMaxHeaderSize, strict JSON, known dtypes, non-negative shapes
// whose element count times the dtype size (overflow-checked) equals e - b, offsets inside the
// data section, and offsets that tile the data section exactly (no overlap, no hole, no trailing
// bytes). A malicious or truncated file is an INVALID_ARGUMENT naming the file and the problem,
// never an over-read. (A file truncated by someone else *while* it is mapped can still SIGBUS; the
// checkpoint files are immutable once committed.)
//
// Sharded sets: model.safetensors.index.json = {"metadata": {"total_size": T},
//   "weight_map": {"<tensor>": "<file>.safetensors", ...}}.
//
// Thread-safety: SafetensorsFile and SafetensorsSet are immutable after Open (concurrent reads OK).
#ifndef EMBER_CHECKPOINT_SAFETENSORS_H_
#define EMBER_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/dtype.h"
#include "checkpoint/file_util.h"

namespace ember::ckpt {

inline constexpr uint64_t kMaxHeaderSize = 100 << 20;  // same limit as the reference reader

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // data_offsets, relative to the data section
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  uint64_t data_start = 0;                       // absolute offset of the data section (8 + N)
  std::vector<TensorInfo> tensors;               // in data order
  std::map<std::string, std::string> metadata;   // __metadata__
};

// Parses and validates the header of `file` (the whole file's bytes). Pure; the fuzz target.
absl::StatusOr<SafetensorsHeader> ParseSafetensors(absl::string_view file);

// Element count of `shape` times `elem_size`; INVALID_ARGUMENT on a negative dim or overflow.
absl::StatusOr<uint64_t> ShapeBytes(const std::vector<int64_t>& shape, size_t elem_size);

class SafetensorsFile {
 public:
  // Memory-maps and validates `path`.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Validates bytes owned by the caller (must outlive the object); `name` is used in errors.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(absl::string_view bytes,
                                                                    std::string name);

  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const TensorInfo* Find(absl::string_view name) const;  // nullptr if absent
  // The tensor's bytes inside the mapping (validated at Open).
  absl::string_view Data(const TensorInfo& t) const;
  const std::string& name() const { return name_; }

 private:
  SafetensorsFile() = default;
  std::unique_ptr<MappedFile> map_;
  absl::string_view bytes_;
  std::string name_;
  SafetensorsHeader header_;
  absl::flat_hash_map<std::string, size_t> index_;
};

// What to write: a tensor's name, dtype and shape; its bytes come from `data` or, when streaming,
// from the producer.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// Builds the 8-byte length + padded JSON header for `specs` (tensor data in the given order).
// Fails on duplicate names, "__metadata__" as a name, or a bad shape. `absolute_offsets` (optional)
// receives each tensor's absolute file offset.
absl::StatusOr<std::string> BuildSafetensorsHeader(const std::vector<TensorSpec>& specs,
                                                   const std::map<std::string, std::string>& meta,
                                                   std::vector<uint64_t>* absolute_offsets);

// Streams a file: `produce(i, append)` must append exactly tensor i's byte size through `append`
// (checked). The file is written to `path` (created/truncated) and fsynced when `sync`.
using AppendFn = std::function<absl::Status(absl::string_view)>;
absl::Status WriteSafetensorsStreaming(
    const std::string& path, const std::vector<TensorSpec>& specs,
    const std::map<std::string, std::string>& meta,
    const std::function<absl::Status(size_t, const AppendFn&)>& produce, bool sync);

// WriteSafetensorsStreaming to `path`.tmp (fsynced), renamed to `path` on success; on failure the
// .tmp file is removed and `path` is untouched.
absl::Status WriteSafetensorsAtomic(
    const std::string& path, const std::vector<TensorSpec>& specs,
    const std::map<std::string, std::string>& meta,
    const std::function<absl::Status(size_t, const AppendFn&)>& produce);

// In-memory convenience: data[i] holds tensor i's bytes.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                              const std::vector<absl::string_view>& data,
                              const std::map<std::string, std::string>& meta = {});
absl::StatusOr<std::string> SerializeSafetensors(const std::vector<TensorSpec>& specs,
                                                 const std::vector<absl::string_view>& data,
                                                 const std::map<std::string, std::string>& meta = {});

// A sharded set: either a single .safetensors file or a model.safetensors.index.json (the index
// is validated: every weight_map file exists, holds the tensors the map says, and no tensor is in
// two files).
class SafetensorsSet {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsSet>> Open(const std::string& path);
  std::vector<std::string> names() const;  // sorted
  // nullptr / NOT_FOUND when absent.
  absl::StatusOr<std::pair<const SafetensorsFile*, const TensorInfo*>> Find(
      absl::string_view name) const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsFile*, const TensorInfo*>> by_name_;
};

// Writes tensors as a sharded set into `dir`: model-0000k-of-0000n.safetensors files of at most
// `max_shard_bytes` of tensor data each (a tensor is never split, so one larger than the limit
// gets a file of its own) plus model.safetensors.index.json ({"metadata": {"total_size": T},
// "weight_map": {...}}). `meta` goes into every file's __metadata__. Each file is written under a
// .tmp name and renamed once all are complete; the index comes last. `produce` as in
// WriteSafetensorsStreaming, indexed over `specs`.
absl::Status WriteShardedSafetensors(
    const std::string& dir, const std::vector<TensorSpec>& specs, uint64_t max_shard_bytes,
    const std::map<std::string, std::string>& meta,
    const std::function<absl::Status(size_t, const AppendFn&)>& produce);

}  // namespace ember::ckpt

#endif  // EMBER_CHECKPOINT_SAFETENSORS_H_
