// The Ember checkpoint format (docs/checkpoint-format.md is the byte-level spec): one directory per
// step holding `metadata.json` (this struct) and per-rank safetensors data files. Tensors are sharded
// on dim 0; each chunk is a contiguous row range [row_begin, row_begin + rows) of the global tensor,
// stored at an absolute byte offset of a data file, with an XXH3-64 checksum.
// Plain data and pure functions: thread-compatible.
#ifndef EMBER_CHECKPOINT_FORMAT_H_
#define EMBER_CHECKPOINT_FORMAT_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/dtype.h"

namespace ember::ckpt {

// Readers accept every format with major <= kFormatMajor (any minor); a newer major is refused.
inline constexpr int kFormatMajor = 1;
inline constexpr int kFormatMinor = 0;
inline constexpr char kWriterVersion[] = "ember-checkpoint/0.1";
inline constexpr char kMetadataFile[] = "metadata.json";
inline constexpr uint64_t kMaxMetadataSize = 1ull << 30;

struct ChunkRef {
  std::string file;        // data file name inside the step directory
  uint64_t offset = 0;     // absolute byte offset in the file
  uint64_t length = 0;     // bytes
  int64_t row_begin = 0;   // global dim-0 offset (0 for blobs)
  int64_t rows = 0;        // dim-0 rows (0 for blobs)
  uint64_t xxh3 = 0;       // XXH3-64 of the chunk's bytes
};

struct TensorMeta {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;   // global shape
  std::vector<ChunkRef> chunks; // sorted by row_begin; tile [0, dim0) in a complete checkpoint
};

struct RankMeta {
  int rank = 0;
  std::map<std::string, ChunkRef> blobs;  // "rng", "data_loader": opaque bytes per saving rank
};

struct FileMeta {
  std::string name;
  uint64_t size = 0;
};

struct Metadata {
  int format_major = kFormatMajor;
  int format_minor = kFormatMinor;
  std::string writer_version = kWriterVersion;
  int64_t step = 0;
  int world_size = 1;
  std::map<std::string, std::string> parallelism;  // e.g. {"dp": "4", "fsdp": "4"}
  std::map<std::string, std::string> extra;        // small user key/values
  std::vector<FileMeta> files;
  std::vector<TensorMeta> tensors;                 // sorted by name
  std::vector<RankMeta> ranks;                     // sorted by rank
  const TensorMeta* Find(absl::string_view name) const;
};

// dim 0 of a shape, with a scalar ([]) counting as one row.
int64_t Dim0(const std::vector<int64_t>& shape);
// Bytes per dim-0 row.
absl::StatusOr<uint64_t> RowBytes(DType dtype, const std::vector<int64_t>& shape);
// torch.chunk semantics: ceil(dim0 / world) rows per rank; later ranks may get fewer or none.
std::pair<int64_t, int64_t> ShardRows(int64_t dim0, int rank, int world);

std::string SerializeMetadata(const Metadata& m);
// Parses and validates. A newer major version is FAILED_PRECONDITION naming both versions and what
// to do; anything malformed is INVALID_ARGUMENT naming the tensor/field. With `complete`, every
// tensor's chunks must tile its rows exactly and every chunk's file must be listed with a size
// covering it (rank manifests are parsed with complete = false).
absl::StatusOr<Metadata> ParseMetadata(absl::string_view text, bool complete = true);
absl::Status ValidateMetadata(const Metadata& m, bool complete);

}  // namespace ember::ckpt

#endif  // EMBER_CHECKPOINT_FORMAT_H_
