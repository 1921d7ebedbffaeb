#include "checkpoint/safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/json.h"
#include "runtime/base/status_macros.h"

namespace ember::ckpt {
namespace {

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors: ", what));
}

uint64_t LoadLE64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::string LE64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

}  // namespace

absl::StatusOr<uint64_t> ShapeBytes(const std::vector<int64_t>& shape, size_t elem_size) {
  unsigned __int128 n = elem_size;
  for (int64_t d : shape) {
    if (d < 0) return Bad(absl::StrCat("negative dimension ", d));
    n *= static_cast<uint64_t>(d);
    if (n > (static_cast<unsigned __int128>(1) << 62)) return Bad("tensor size overflows");
  }
  return static_cast<uint64_t>(n);
}

absl::StatusOr<SafetensorsHeader> ParseSafetensors(absl::string_view file) {
  if (file.size() < 8) return Bad(absl::StrCat("file of ", file.size(), " bytes has no header"));
  uint64_t n = LoadLE64(file.data());
  if (n > kMaxHeaderSize) {
    return Bad(absl::StrCat("header length ", n, " exceeds the limit ", kMaxHeaderSize));
  }
  if (n > file.size() - 8) {
    return Bad(absl::StrCat("header length ", n, " exceeds the file (", file.size(),
                            " bytes): truncated?"));
  }
  absl::string_view text = file.substr(8, n);
  if (text.empty() || text[0] != '{') return Bad("header does not start with '{'");
  absl::StatusOr<json::Value> parsed = json::Parse(text);
  if (!parsed.ok()) return Bad(absl::StrCat("bad header: ", parsed.status().message()));
  if (!parsed->is_object()) return Bad("header is not an object");

  SafetensorsHeader h;
  h.data_start = 8 + n;
  const uint64_t data_size = file.size() - h.data_start;
  for (const auto& [name, v] : parsed->object()) {
    if (name == "__metadata__") {
      if (!v.is_object()) return Bad("__metadata__ is not an object");
      for (const auto& [k, mv] : v.object()) {
        if (!mv.is_string()) return Bad(absl::StrCat("__metadata__[\"", k, "\"] is not a string"));
        h.metadata[k] = mv.as_string();
      }
      continue;
    }
    std::string what = absl::StrCat("safetensors: tensor \"", name, "\"");
    if (!v.is_object()) return Bad(absl::StrCat("tensor \"", name, "\" is not an object"));
    for (const auto& [k, unused] : v.object()) {
      if (k != "dtype" && k != "shape" && k != "data_offsets") {
        return Bad(absl::StrCat("tensor \"", name, "\" has unknown field \"", k, "\""));
      }
    }
    TensorInfo t;
    t.name = name;
    ASSIGN_OR_RETURN(std::string dtype, json::GetString(v, "dtype", what));
    absl::StatusOr<DType> d = ParseSafetensorsDType(dtype);
    if (!d.ok()) return Bad(absl::StrCat("tensor \"", name, "\": ", d.status().message()));
    t.dtype = *d;
    ASSIGN_OR_RETURN(const json::Value* shape, json::GetField(v, "shape", json::Value::Type::kArray, what));
    if (shape->array().size() > 64) return Bad(absl::StrCat("tensor \"", name, "\" has too many dims"));
    for (const json::Value& dim : shape->array()) {
      if (!dim.is_int() || dim.as_int() < 0) {
        return Bad(absl::StrCat("tensor \"", name, "\" has a bad shape entry"));
      }
      t.shape.push_back(dim.as_int());
    }
    ASSIGN_OR_RETURN(const json::Value* offs,
                     json::GetField(v, "data_offsets", json::Value::Type::kArray, what));
    if (offs->array().size() != 2 || !offs->array()[0].is_int() || !offs->array()[1].is_int() ||
        offs->array()[0].as_int() < 0 || offs->array()[1].as_int() < offs->array()[0].as_int()) {
      return Bad(absl::StrCat("tensor \"", name, "\" has bad data_offsets"));
    }
    t.begin = static_cast<uint64_t>(offs->array()[0].as_int());
    t.end = static_cast<uint64_t>(offs->array()[1].as_int());
    if (t.end > data_size) {
      return Bad(absl::StrCat("tensor \"", name, "\" data_offsets [", t.begin, ", ", t.end,
                              ") run past the data section (", data_size, " bytes): truncated?"));
    }
    absl::StatusOr<uint64_t> bytes = ShapeBytes(t.shape, DTypeSize(t.dtype));
    if (!bytes.ok()) return Bad(absl::StrCat("tensor \"", name, "\": ", bytes.status().message()));
    if (*bytes != t.nbytes()) {
      return Bad(absl::StrCat("tensor \"", name, "\" is ", t.nbytes(), " bytes but ", dtype,
                              " with its shape needs ", *bytes));
    }
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expect = 0;
  for (const TensorInfo& t : h.tensors) {
    if (t.begin != expect) {
      return Bad(absl::StrCat("tensor \"", t.name, "\" starts at ", t.begin, " but the previous ends at ",
                              expect, " (overlap or hole)"));
    }
    expect = t.end;
  }
  if (expect != data_size) {
    return Bad(absl::StrCat("data section is ", data_size, " bytes but the tensors cover ", expect));
  }
  return h;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(absl::string_view bytes,
                                                                          std::string name) {
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensors(bytes);
  if (!h.ok()) return base::Annotate(h.status(), name);
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->bytes_ = bytes;
  f->name_ = std::move(name);
  f->header_ = std::move(*h);
  for (size_t i = 0; i < f->header_.tensors.size(); ++i) f->index_[f->header_.tensors[i].name] = i;
  return f;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> map, MappedFile::Open(path));
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, FromBytes(map->bytes(), path));
  f->map_ = std::move(map);
  return f;
}

const TensorInfo* SafetensorsFile::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

absl::string_view SafetensorsFile::Data(const TensorInfo& t) const {
  return bytes_.substr(header_.data_start + t.begin, t.nbytes());
}

absl::StatusOr<std::string> BuildSafetensorsHeader(const std::vector<TensorSpec>& specs,
                                                   const std::map<std::string, std::string>& meta,
                                                   std::vector<uint64_t>* absolute_offsets) {
  json::Value root = json::Value::MakeObject();
  if (!meta.empty()) {
    json::Value m = json::Value::MakeObject();
    for (const auto& [k, v] : meta) m.Set(k, json::Value::Str(v));
    root.Set("__metadata__", std::move(m));
  }
  std::set<std::string> names;
  std::vector<uint64_t> rel;
  uint64_t off = 0;
  for (const TensorSpec& s : specs) {
    if (s.name == "__metadata__" || !names.insert(s.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: bad or duplicate name \"", s.name, "\""));
    }
    ASSIGN_OR_RETURN(uint64_t n, ShapeBytes(s.shape, DTypeSize(s.dtype)));
    json::Value t = json::Value::MakeObject();
    t.Set("dtype", json::Value::Str(SafetensorsDTypeName(s.dtype)));
    json::Value shape = json::Value::MakeArray();
    for (int64_t d : s.shape) shape.Push(json::Value::Int(d));
    t.Set("shape", std::move(shape));
    json::Value offs = json::Value::MakeArray();
    offs.Push(json::Value::Int(static_cast<int64_t>(off)));
    offs.Push(json::Value::Int(static_cast<int64_t>(off + n)));
    t.Set("data_offsets", std::move(offs));
    root.Set(s.name, std::move(t));
    rel.push_back(off);
    off += n;
  }
  std::string text = json::Write(root);
  text.append((8 - text.size() % 8) % 8, ' ');
  if (absolute_offsets != nullptr) {
    absolute_offsets->clear();
    for (uint64_t r : rel) absolute_offsets->push_back(8 + text.size() + r);
  }
  return LE64(text.size()) + text;
}

absl::Status WriteSafetensorsStreaming(
    const std::string& path, const std::vector<TensorSpec>& specs,
    const std::map<std::string, std::string>& meta,
    const std::function<absl::Status(size_t, const AppendFn&)>& produce, bool sync) {
  ASSIGN_OR_RETURN(std::string header, BuildSafetensorsHeader(specs, meta, nullptr));
  ASSIGN_OR_RETURN(std::unique_ptr<FileWriter> w, FileWriter::Create(path));
  RETURN_IF_ERROR(w->Append(header));
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSIGN_OR_RETURN(uint64_t want, ShapeBytes(specs[i].shape, DTypeSize(specs[i].dtype)));
    uint64_t got = 0;
    AppendFn append = [&](absl::string_view b) {
      got += b.size();
      return w->Append(b);
    };
    RETURN_IF_ERROR(produce(i, append));
    if (got != want) {
      return absl::InternalError(absl::StrCat("safetensors writer: tensor \"", specs[i].name,
                                              "\" produced ", got, " bytes, expected ", want));
    }
  }
  if (sync) RETURN_IF_ERROR(w->Sync());
  return w->Close();
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                              const std::vector<absl::string_view>& data,
                              const std::map<std::string, std::string>& meta) {
  if (data.size() != specs.size()) return absl::InvalidArgumentError("specs/data size mismatch");
  return WriteSafetensorsStreaming(
      path, specs, meta, [&](size_t i, const AppendFn& append) { return append(data[i]); },
      /*sync=*/true);
}

absl::StatusOr<std::string> SerializeSafetensors(const std::vector<TensorSpec>& specs,
                                                 const std::vector<absl::string_view>& data,
                                                 const std::map<std::string, std::string>& meta) {
  if (data.size() != specs.size()) return absl::InvalidArgumentError("specs/data size mismatch");
  ASSIGN_OR_RETURN(std::string out, BuildSafetensorsHeader(specs, meta, nullptr));
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSIGN_OR_RETURN(uint64_t want, ShapeBytes(specs[i].shape, DTypeSize(specs[i].dtype)));
    if (data[i].size() != want) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", specs[i].name, "\" has ",
                                                     data[i].size(), " bytes, expected ", want));
    }
    out.append(data[i].data(), data[i].size());
  }
  return out;
}

absl::StatusOr<std::unique_ptr<SafetensorsSet>> SafetensorsSet::Open(const std::string& path) {
  auto set = std::make_unique<SafetensorsSet>();
  if (path.size() < 5 || path.substr(path.size() - 5) != ".json") {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, SafetensorsFile::Open(path));
    for (const TensorInfo& t : f->tensors()) set->by_name_[t.name] = {f.get(), &t};
    set->files_.push_back(std::move(f));
    return set;
  }
  ASSIGN_OR_RETURN(std::string text, ReadFile(path, kMaxHeaderSize));
  absl::StatusOr<json::Value> index = json::Parse(text);
  if (!index.ok()) return base::Annotate(index.status(), path);
  ASSIGN_OR_RETURN(const json::Value* wm,
                   json::GetField(*index, "weight_map", json::Value::Type::kObject, path));
  std::string dir = path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/'));
  std::map<std::string, const SafetensorsFile*> opened;
  for (const auto& [name, file] : wm->object()) {
    if (!file.is_string() || file.as_string().empty() ||
        file.as_string().find('/') != std::string::npos || file.as_string()[0] == '.') {
      return absl::InvalidArgumentError(absl::StrCat(path, ": bad file for tensor \"", name, "\""));
    }
    const std::string& fname = file.as_string();
    if (!opened.count(fname)) {
      ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f,
                       SafetensorsFile::Open(dir.empty() ? fname : JoinPath(dir, fname)));
      opened[fname] = f.get();
      set->files_.push_back(std::move(f));
    }
    const TensorInfo* t = opened[fname]->Find(name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": weight_map says \"", name, "\" is in ", fname, " but it is not"));
    }
    set->by_name_[name] = {opened[fname], t};
  }
  return set;
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : by_name_) out.push_back(k);
  return out;
}

absl::StatusOr<std::pair<const SafetensorsFile*, const TensorInfo*>> SafetensorsSet::Find(
    absl::string_view name) const {
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) return absl::NotFoundError(absl::StrCat("no tensor \"", name, "\""));
  return it->second;
}

absl::Status WriteSafetensorsAtomic(
    const std::string& path, const std::vector<TensorSpec>& specs,
    const std::map<std::string, std::string>& meta,
    const std::function<absl::Status(size_t, const AppendFn&)>& produce) {
  const std::string tmp = path + ".tmp";
  absl::Status s = WriteSafetensorsStreaming(tmp, specs, meta, produce, /*sync=*/true);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return base::ErrnoToStatus(errno, absl::StrCat("rename ", tmp, " -> ", path));
  }
  return absl::OkStatus();
}

absl::Status WriteShardedSafetensors(
    const std::string& dir, const std::vector<TensorSpec>& specs, uint64_t max_shard_bytes,
    const std::map<std::string, std::string>& meta,
    const std::function<absl::Status(size_t, const AppendFn&)>& produce) {
  RETURN_IF_ERROR(base::MakeDirs(dir, kDirMode));
  std::vector<std::vector<size_t>> shards(1);
  uint64_t cur = 0, total = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSIGN_OR_RETURN(uint64_t n, ShapeBytes(specs[i].shape, DTypeSize(specs[i].dtype)));
    if (cur > 0 && cur + n > max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += n;
    total += n;
  }
  json::Value wm = json::Value::MakeObject();
  std::vector<std::string> written;
  auto cleanup = [&](absl::Status s) {
    for (const std::string& f : written) ::unlink((f + ".tmp").c_str());
    return s;
  };
  for (size_t s = 0; s < shards.size(); ++s) {
    std::string fname = absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards.size());
    std::vector<TensorSpec> sub;
    for (size_t i : shards[s]) {
      sub.push_back(specs[i]);
      wm.Set(specs[i].name, json::Value::Str(fname));
    }
    written.push_back(JoinPath(dir, fname));
    absl::Status st = WriteSafetensorsStreaming(
        written.back() + ".tmp", sub, meta,
        [&](size_t j, const AppendFn& append) { return produce(shards[s][j], append); },
        /*sync=*/true);
    if (!st.ok()) return cleanup(st);
  }
  for (const std::string& f : written) {
    if (::rename((f + ".tmp").c_str(), f.c_str()) != 0) {
      return cleanup(base::ErrnoToStatus(errno, absl::StrCat("rename ", f, ".tmp")));
    }
  }
  json::Value index = json::Value::MakeObject();
  json::Value index_meta = json::Value::MakeObject();
  index_meta.Set("total_size", json::Value::Int(static_cast<int64_t>(total)));
  index.Set("metadata", std::move(index_meta));
  index.Set("weight_map", std::move(wm));
  return base::WriteFileAtomic(JoinPath(dir, "model.safetensors.index.json"),
                               json::Write(index, 2) + "\n", kFileMode);
}

}  // namespace ember::ckpt
