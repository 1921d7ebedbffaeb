#include "checkpoint/format.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "checkpoint/checksum.h"
#include "runtime/base/json.h"
#include "checkpoint/safetensors.h"
#include "runtime/base/status_macros.h"

namespace ember::ckpt {
namespace {

using json::Value;

Value StrMap(const std::map<std::string, std::string>& m) {
  Value v = Value::MakeObject();
  for (const auto& [k, s] : m) v.Set(k, Value::Str(s));
  return v;
}

Value ChunkJson(const ChunkRef& c, bool rows) {
  Value v = Value::MakeObject();
  v.Set("file", Value::Str(c.file));
  v.Set("offset", Value::Int(static_cast<int64_t>(c.offset)));
  v.Set("length", Value::Int(static_cast<int64_t>(c.length)));
  if (rows) {
    v.Set("row_begin", Value::Int(c.row_begin));
    v.Set("rows", Value::Int(c.rows));
  }
  v.Set("xxh3", Value::Str(HashHex(c.xxh3)));
  return v;
}

absl::Status Invalid(absl::string_view what, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint metadata: ", what, ": ", msg));
}

absl::StatusOr<uint64_t> GetU64(const Value& v, absl::string_view key, absl::string_view what) {
  ASSIGN_OR_RETURN(int64_t i, json::GetInt(v, key, what));
  if (i < 0) return Invalid(what, absl::StrCat("negative ", key));
  return static_cast<uint64_t>(i);
}

absl::StatusOr<ChunkRef> ParseChunk(const Value& v, bool rows, const std::string& what) {
  if (!v.is_object()) return Invalid(what, "not an object");
  ChunkRef c;
  ASSIGN_OR_RETURN(c.file, json::GetString(v, "file", what));
  ASSIGN_OR_RETURN(c.offset, GetU64(v, "offset", what));
  ASSIGN_OR_RETURN(c.length, GetU64(v, "length", what));
  if (rows) {
    ASSIGN_OR_RETURN(c.row_begin, json::GetInt(v, "row_begin", what));
    ASSIGN_OR_RETURN(c.rows, json::GetInt(v, "rows", what));
  }
  ASSIGN_OR_RETURN(std::string h, json::GetString(v, "xxh3", what));
  if (!ParseHashHex(h, &c.xxh3)) return Invalid(what, "xxh3 is not 16 lowercase hex digits");
  return c;
}

absl::StatusOr<std::map<std::string, std::string>> ParseStrMap(const Value& root,
                                                                absl::string_view key) {
  std::map<std::string, std::string> out;
  const Value* v = root.Find(key);
  if (v == nullptr) return out;
  if (!v->is_object()) return Invalid(key, "not an object");
  for (const auto& [k, s] : v->object()) {
    if (!s.is_string()) return Invalid(key, absl::StrCat("value of \"", k, "\" is not a string"));
    out[k] = s.as_string();
  }
  return out;
}

bool SafeFileName(absl::string_view f) {
  return !f.empty() && f[0] != '.' && f.find('/') == absl::string_view::npos &&
         f.find('\0') == absl::string_view::npos;
}

}  // namespace

const TensorMeta* Metadata::Find(absl::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorMeta& t, absl::string_view n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

int64_t Dim0(const std::vector<int64_t>& shape) { return shape.empty() ? 1 : shape[0]; }

absl::StatusOr<uint64_t> RowBytes(DType dtype, const std::vector<int64_t>& shape) {
  if (shape.empty()) return DTypeSize(dtype);
  std::vector<int64_t> rest(shape.begin() + 1, shape.end());
  return ShapeBytes(rest, DTypeSize(dtype));
}

std::pair<int64_t, int64_t> ShardRows(int64_t dim0, int rank, int world) {
  int64_t per = (dim0 + world - 1) / world;
  int64_t b = std::min(dim0, per * rank);
  int64_t e = std::min(dim0, per * (rank + 1));
  return {b, e};
}

std::string SerializeMetadata(const Metadata& m) {
  Value root = Value::MakeObject();
  root.Set("format", Value::Str("ember-checkpoint"));
  root.Set("format_version", Value::Str(absl::StrCat(m.format_major, ".", m.format_minor)));
  root.Set("writer_version", Value::Str(m.writer_version));
  root.Set("step", Value::Int(m.step));
  root.Set("world_size", Value::Int(m.world_size));
  root.Set("parallelism", StrMap(m.parallelism));
  root.Set("extra", StrMap(m.extra));
  Value files = Value::MakeArray();
  for (const FileMeta& f : m.files) {
    Value fv = Value::MakeObject();
    fv.Set("name", Value::Str(f.name));
    fv.Set("size", Value::Int(static_cast<int64_t>(f.size)));
    files.Push(std::move(fv));
  }
  root.Set("files", std::move(files));
  Value tensors = Value::MakeObject();
  for (const TensorMeta& t : m.tensors) {
    Value tv = Value::MakeObject();
    tv.Set("dtype", Value::Str(SafetensorsDTypeName(t.dtype)));
    Value shape = Value::MakeArray();
    for (int64_t d : t.shape) shape.Push(Value::Int(d));
    tv.Set("shape", std::move(shape));
    Value chunks = Value::MakeArray();
    for (const ChunkRef& c : t.chunks) chunks.Push(ChunkJson(c, true));
    tv.Set("chunks", std::move(chunks));
    tensors.Set(t.name, std::move(tv));
  }
  root.Set("tensors", std::move(tensors));
  Value ranks = Value::MakeArray();
  for (const RankMeta& r : m.ranks) {
    Value rv = Value::MakeObject();
    rv.Set("rank", Value::Int(r.rank));
    Value blobs = Value::MakeObject();
    for (const auto& [k, c] : r.blobs) blobs.Set(k, ChunkJson(c, false));
    rv.Set("blobs", std::move(blobs));
    ranks.Push(std::move(rv));
  }
  root.Set("ranks", std::move(ranks));
  return json::Write(root, 1) + "\n";
}

absl::StatusOr<Metadata> ParseMetadata(absl::string_view text, bool complete) {
  absl::StatusOr<Value> parsed = json::Parse(text);
  if (!parsed.ok()) return Invalid("bad JSON", parsed.status().message());
  const Value& root = *parsed;
  if (!root.is_object()) return Invalid("root", "not an object");
  Metadata m;
  ASSIGN_OR_RETURN(std::string format, json::GetString(root, "format", "checkpoint metadata"));
  if (format != "ember-checkpoint") return Invalid("format", absl::StrCat("is \"", format, "\""));
  ASSIGN_OR_RETURN(std::string version, json::GetString(root, "format_version", "checkpoint metadata"));
  std::vector<std::string> parts = absl::StrSplit(version, '.');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &m.format_major) ||
      !absl::SimpleAtoi(parts[1], &m.format_minor) || m.format_major < 1 || m.format_minor < 0) {
    return Invalid("format_version", absl::StrCat("\"", version, "\" is not MAJOR.MINOR"));
  }
  ASSIGN_OR_RETURN(m.writer_version, json::GetString(root, "writer_version", "checkpoint metadata"));
  if (m.format_major > kFormatMajor) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint format ", version, " (written by ", m.writer_version,
        ") is newer than this reader, which reads formats up to ", kFormatMajor, ".x (",
        kWriterVersion, "); load it with a newer Ember, or export it there to safetensors "
        "(emberctl ckpt export) and initialise from that"));
  }
  ASSIGN_OR_RETURN(m.step, json::GetInt(root, "step", "checkpoint metadata"));
  ASSIGN_OR_RETURN(int64_t world, json::GetInt(root, "world_size", "checkpoint metadata"));
  if (world < 1 || world > (1 << 20)) return Invalid("world_size", "out of range");
  m.world_size = static_cast<int>(world);
  ASSIGN_OR_RETURN(m.parallelism, ParseStrMap(root, "parallelism"));
  ASSIGN_OR_RETURN(m.extra, ParseStrMap(root, "extra"));
  ASSIGN_OR_RETURN(const Value* files, json::GetField(root, "files", Value::Type::kArray, "checkpoint metadata"));
  for (const Value& f : files->array()) {
    if (!f.is_object()) return Invalid("files", "entry is not an object");
    FileMeta fm;
    ASSIGN_OR_RETURN(fm.name, json::GetString(f, "name", "files entry"));
    ASSIGN_OR_RETURN(fm.size, GetU64(f, "size", "files entry"));
    m.files.push_back(std::move(fm));
  }
  ASSIGN_OR_RETURN(const Value* tensors, json::GetField(root, "tensors", Value::Type::kObject, "checkpoint metadata"));
  for (const auto& [name, tv] : tensors->object()) {
    std::string what = absl::StrCat("tensor \"", name, "\"");
    if (!tv.is_object()) return Invalid(what, "not an object");
    TensorMeta t;
    t.name = name;
    ASSIGN_OR_RETURN(std::string dtype, json::GetString(tv, "dtype", what));
    absl::StatusOr<DType> d = ParseSafetensorsDType(dtype);
    if (!d.ok()) return Invalid(what, d.status().message());
    t.dtype = *d;
    ASSIGN_OR_RETURN(const Value* shape, json::GetField(tv, "shape", Value::Type::kArray, what));
    if (shape->array().size() > 64) return Invalid(what, "too many dimensions");
    for (const Value& dim : shape->array()) {
      if (!dim.is_int() || dim.as_int() < 0) return Invalid(what, "bad shape");
      t.shape.push_back(dim.as_int());
    }
    ASSIGN_OR_RETURN(const Value* chunks, json::GetField(tv, "chunks", Value::Type::kArray, what));
    for (size_t i = 0; i < chunks->array().size(); ++i) {
      ASSIGN_OR_RETURN(ChunkRef c, ParseChunk(chunks->array()[i], true, absl::StrCat(what, " chunk ", i)));
      t.chunks.push_back(std::move(c));
    }
    m.tensors.push_back(std::move(t));
  }
  ASSIGN_OR_RETURN(const Value* ranks, json::GetField(root, "ranks", Value::Type::kArray, "checkpoint metadata"));
  for (const Value& rv : ranks->array()) {
    if (!rv.is_object()) return Invalid("ranks", "entry is not an object");
    RankMeta r;
    ASSIGN_OR_RETURN(int64_t rank, json::GetInt(rv, "rank", "ranks entry"));
    if (rank < 0 || rank >= m.world_size) return Invalid("ranks", absl::StrCat("rank ", rank, " out of range"));
    r.rank = static_cast<int>(rank);
    ASSIGN_OR_RETURN(const Value* blobs, json::GetField(rv, "blobs", Value::Type::kObject, "ranks entry"));
    for (const auto& [k, bv] : blobs->object()) {
      ASSIGN_OR_RETURN(r.blobs[k], ParseChunk(bv, false, absl::StrCat("rank ", rank, " blob \"", k, "\"")));
    }
    m.ranks.push_back(std::move(r));
  }
  std::sort(m.tensors.begin(), m.tensors.end(),
            [](const TensorMeta& a, const TensorMeta& b) { return a.name < b.name; });
  std::sort(m.ranks.begin(), m.ranks.end(), [](const RankMeta& a, const RankMeta& b) { return a.rank < b.rank; });
  RETURN_IF_ERROR(ValidateMetadata(m, complete));
  return m;
}

absl::Status ValidateMetadata(const Metadata& m, bool complete) {
  std::map<std::string, uint64_t> sizes;
  for (const FileMeta& f : m.files) {
    if (!SafeFileName(f.name)) return Invalid("files", absl::StrCat("bad file name \"", f.name, "\""));
    if (!sizes.emplace(f.name, f.size).second) return Invalid("files", absl::StrCat("duplicate ", f.name));
  }
  auto check_chunk = [&](const ChunkRef& c, const std::string& what) -> absl::Status {
    auto it = sizes.find(c.file);
    if (it == sizes.end()) return Invalid(what, absl::StrCat("file \"", c.file, "\" is not listed"));
    if (c.offset > it->second || c.length > it->second - c.offset) {
      return Invalid(what, absl::StrCat("bytes [", c.offset, ", +", c.length, ") lie outside ",
                                        c.file, " (", it->second, " bytes)"));
    }
    return absl::OkStatus();
  };
  for (size_t ti = 0; ti < m.tensors.size(); ++ti) {
    const TensorMeta& t = m.tensors[ti];
    std::string what = absl::StrCat("tensor \"", t.name, "\"");
    if (ti > 0 && m.tensors[ti - 1].name == t.name) return Invalid(what, "duplicate");
    ASSIGN_OR_RETURN(uint64_t total, ShapeBytes(t.shape, DTypeSize(t.dtype)));
    (void)total;
    ASSIGN_OR_RETURN(uint64_t row_bytes, RowBytes(t.dtype, t.shape));
    int64_t next = 0;
    for (size_t i = 0; i < t.chunks.size(); ++i) {
      const ChunkRef& c = t.chunks[i];
      std::string cw = absl::StrCat(what, " chunk ", i, " (rows [", c.row_begin, ", ",
                                    c.row_begin + c.rows, ") in ", c.file, ")");
      if (c.rows < 0 || c.row_begin < 0 || c.row_begin > Dim0(t.shape) ||
          c.rows > Dim0(t.shape) - c.row_begin) {
        return Invalid(cw, "rows outside the tensor");
      }
      if (static_cast<unsigned __int128>(c.rows) * row_bytes != c.length) {
        return Invalid(cw, absl::StrCat("length ", c.length, " != rows * ", row_bytes));
      }
      if (complete) {
        if (c.row_begin != next) return Invalid(cw, absl::StrCat("expected row ", next, " (overlap or gap)"));
        RETURN_IF_ERROR(check_chunk(c, cw));
      }
      next = c.row_begin + c.rows;
    }
    if (complete && next != Dim0(t.shape) && Dim0(t.shape) > 0) {
      return Invalid(what, absl::StrCat("chunks cover rows [0, ", next, ") of ", Dim0(t.shape)));
    }
  }
  if (complete) {
    for (const RankMeta& r : m.ranks) {
      for (const auto& [k, c] : r.blobs) {
        RETURN_IF_ERROR(check_chunk(c, absl::StrCat("rank ", r.rank, " blob \"", k, "\"")));
      }
    }
    // No two chunks share bytes (the writer never does that): so the bytes a reader may be asked
    // to allocate never exceed the files' sizes, however many chunks the metadata lists.
    std::vector<std::pair<std::pair<std::string, uint64_t>, uint64_t>> ranges;  // ((file, offset), end)
    for (const TensorMeta& t : m.tensors) {
      for (const ChunkRef& c : t.chunks) {
        if (c.length > 0) ranges.push_back({{c.file, c.offset}, c.offset + c.length});
      }
    }
    for (const RankMeta& r : m.ranks) {
      for (const auto& [k, c] : r.blobs) {
        if (c.length > 0) ranges.push_back({{c.file, c.offset}, c.offset + c.length});
      }
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
      if (ranges[i].first.first == ranges[i - 1].first.first &&
          ranges[i].first.second < ranges[i - 1].second) {
        return Invalid("chunks", absl::StrCat("two chunks overlap in ", ranges[i].first.first,
                                              " at offset ", ranges[i].first.second));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ember::ckpt
