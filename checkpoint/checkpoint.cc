#include "checkpoint/checkpoint.h"

#include <dirent.h>

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "checkpoint/checksum.h"
#include "checkpoint/safetensors.h"
#include "runtime/base/status_macros.h"
#include "spdlog/spdlog.h"

namespace ember::ckpt {
namespace {

std::string TmpDirName(int64_t step) { return absl::StrCat(".tmp-step-", step); }
std::string DataFileName(int rank) { return absl::StrFormat("rank-%05d.safetensors", rank); }
std::string ManifestName(int rank) { return absl::StrFormat("rank-%05d.manifest.json", rank); }

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (struct dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status Truncated(const ChunkRef& c, uint64_t size, const std::string& what) {
  return absl::DataLossError(absl::StrCat(what, ": ", c.file, " is truncated (", size,
                                          " bytes; the chunk needs [", c.offset, ", ",
                                          c.offset + c.length, "))"));
}

absl::Status Mismatch(const ChunkRef& c, uint64_t got, const std::string& what) {
  return absl::DataLossError(absl::StrCat(what, ": checksum mismatch in ", c.file, " at offset ",
                                          c.offset, " (expected ", HashHex(c.xxh3), ", got ",
                                          HashHex(got), ")"));
}

bool ParseStepDir(absl::string_view name, absl::string_view prefix, int64_t* step) {
  return absl::ConsumePrefix(&name, prefix) && absl::SimpleAtoi(name, step) && *step >= 0;
}

// Writes this rank's data file and manifest into `tmp`; returns the manifest's token.
absl::StatusOr<std::string> WriteRankFiles(const SaveOptions& opts, const RankState& st,
                                           const std::string& tmp) {
  Metadata m;
  m.step = st.step;
  m.world_size = opts.world_size;
  m.parallelism = st.parallelism;
  m.extra = st.extra;
  const std::string file = DataFileName(opts.rank);
  std::vector<TensorSpec> specs;
  std::vector<absl::string_view> data;
  for (const ShardSpec& s : st.tensors) {
    ASSIGN_OR_RETURN(uint64_t row_bytes, RowBytes(s.dtype, s.global_shape));
    if (row_bytes == 0 ? !s.data.empty() : s.data.size() % row_bytes != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", s.name, "\": ", s.data.size(),
                                                     " bytes is not a whole number of rows"));
    }
    int64_t rows = row_bytes == 0 ? 0 : static_cast<int64_t>(s.data.size() / row_bytes);
    if (rows == 0 && row_bytes == 0 && s.row_begin == 0) rows = Dim0(s.global_shape);
    std::vector<int64_t> local = s.global_shape;
    if (!local.empty()) local[0] = rows;
    specs.push_back({s.name, s.dtype, local});
    data.push_back(s.data);
    TensorMeta t{s.name, s.dtype, s.global_shape, {}};
    if (rows > 0) t.chunks.push_back({file, 0, s.data.size(), s.row_begin, rows, Xxh3(s.data)});
    m.tensors.push_back(std::move(t));
  }
  RankMeta rm;
  rm.rank = opts.rank;
  std::vector<std::pair<std::string, const std::string*>> blobs = {
      {"rng", &st.rng_state}, {"data_loader", &st.data_loader_state}};
  size_t first_blob = specs.size();
  for (const auto& [k, v] : blobs) {
    specs.push_back({absl::StrCat("__rank__.", k), DType::kU8, {static_cast<int64_t>(v->size())}});
    data.push_back(*v);
  }
  std::vector<uint64_t> offsets;
  RETURN_IF_ERROR(BuildSafetensorsHeader(specs, {{"ember.rank", absl::StrCat(opts.rank)},
                                                  {"ember.step", absl::StrCat(st.step)}},
                                         &offsets)
                      .status());
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    if (!m.tensors[i].chunks.empty()) m.tensors[i].chunks[0].offset = offsets[i];
  }
  for (size_t b = 0; b < blobs.size(); ++b) {
    const std::string& v = *blobs[b].second;
    rm.blobs[blobs[b].first] = {file, offsets[first_blob + b], v.size(), 0, 0, Xxh3(v)};
  }
  m.ranks.push_back(std::move(rm));
  const std::string path = JoinPath(tmp, file);
  RETURN_IF_ERROR(WriteSafetensorsStreaming(
      path, specs, {{"ember.rank", absl::StrCat(opts.rank)}, {"ember.step", absl::StrCat(st.step)}},
      [&](size_t i, const AppendFn& append) -> absl::Status {
        if (opts.TEST_delay_per_tensor > absl::ZeroDuration()) absl::SleepFor(opts.TEST_delay_per_tensor);
        return append(data[i]);
      },
      /*sync=*/true));
  uint64_t size = offsets.empty() ? 0 : offsets.back() + data.back().size();
  m.files.push_back({file, size});
  std::sort(m.tensors.begin(), m.tensors.end(),
            [](const TensorMeta& a, const TensorMeta& b) { return a.name < b.name; });
  RETURN_IF_ERROR(ValidateMetadata(m, /*complete=*/false));
  std::string manifest = SerializeMetadata(m);
  RETURN_IF_ERROR(base::WriteFileAtomic(JoinPath(tmp, ManifestName(opts.rank)), manifest, kFileMode));
  return HashHex(Xxh3(manifest));
}

// Rank 0: merges the manifests into the complete metadata and commits the directory.
absl::Status Commit(const SaveOptions& opts, const RankState& st, const std::string& tmp,
                    const std::vector<std::string>& tokens, CommitProtocol* protocol) {
  Metadata all;
  all.step = st.step;
  all.world_size = opts.world_size;
  all.parallelism = st.parallelism;
  all.extra = st.extra;
  std::map<std::string, TensorMeta> tensors;
  std::set<std::string> keep = {kMetadataFile};
  for (int r = 0; r < opts.world_size; ++r) {
    const std::string mpath = JoinPath(tmp, ManifestName(r));
    ASSIGN_OR_RETURN(std::string text, ReadFile(mpath, kMaxMetadataSize));
    if (HashHex(Xxh3(text)) != tokens[r]) {
      return absl::DataLossError(absl::StrCat(mpath, " does not match rank ", r, "'s vote (stale file?)"));
    }
    ASSIGN_OR_RETURN(Metadata m, ParseMetadata(text, /*complete=*/false));
    keep.insert(ManifestName(r));
    for (const FileMeta& f : m.files) {
      keep.insert(f.name);
      all.files.push_back(f);
    }
    for (RankMeta& rm : m.ranks) all.ranks.push_back(std::move(rm));
    for (TensorMeta& t : m.tensors) {
      auto [it, fresh] = tensors.emplace(t.name, t);
      if (fresh) continue;
      if (it->second.dtype != t.dtype || it->second.shape != t.shape) {
        return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\": rank ", r,
                                                       " disagrees on dtype or global shape"));
      }
      for (ChunkRef& c : t.chunks) it->second.chunks.push_back(std::move(c));
    }
  }
  for (auto& [name, t] : tensors) {
    std::sort(t.chunks.begin(), t.chunks.end(),
              [](const ChunkRef& a, const ChunkRef& b) { return a.row_begin < b.row_begin; });
    all.tensors.push_back(std::move(t));
  }
  RETURN_IF_ERROR(ValidateMetadata(all, /*complete=*/true));
  // Leftovers of an earlier, failed save of the same step are not part of this checkpoint.
  for (const std::string& f : ListDir(tmp)) {
    if (!keep.count(f)) RETURN_IF_ERROR(RemoveAll(JoinPath(tmp, f)));
  }
  // Metadata last: a directory without metadata.json is never a checkpoint.
  RETURN_IF_ERROR(base::WriteFileAtomic(JoinPath(tmp, kMetadataFile), SerializeMetadata(all), kFileMode));
  RETURN_IF_ERROR(base::SyncDir(tmp));
  const std::string final_dir = JoinPath(opts.root, StepDirName(st.step));
  // Again at the last moment a stale rank 0 (its attempt superseded during the save) can be
  // stopped before it changes anything the job's current attempt sees (CommitProtocol::Claim).
  RETURN_IF_ERROR(protocol->Claim(st.step, /*rank=*/0));
  if (PathExists(final_dir)) {
    // Re-saving a step: the run resumed from an older one (latest was lost or damaged, or a crash
    // came between this rename and `latest`). The old directory is the only copy of whatever it
    // holds, so it is moved aside, never deleted.
    const std::string aside = JoinPath(
        opts.root, absl::StrCat(".superseded-", StepDirName(st.step), "-", absl::ToUnixMillis(absl::Now())));
    if (::rename(final_dir.c_str(), aside.c_str()) != 0) {
      return base::ErrnoToStatus(errno, absl::StrCat("rename ", final_dir, " -> ", aside));
    }
    spdlog::warn("checkpoint step {}: {} already existed; moved it to {} (delete it by hand once "
                 "it is not needed)", st.step, final_dir, aside);
  }
  // The last moment a stale rank 0 (of a superseded attempt) can be stopped: a fenced store write.
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    return base::ErrnoToStatus(errno, absl::StrCat("rename ", tmp, " -> ", final_dir));
  }
  RETURN_IF_ERROR(base::SyncDir(opts.root));
  RETURN_IF_ERROR(
      base::WriteFileAtomic(JoinPath(opts.root, "latest"), StepDirName(st.step) + "\n", kFileMode));
  // Retention: keep the newest keep_last committed steps at or below this one. Steps above it were
  // left by a run that got further than this one resumed from: never deleted here. Temporary
  // directories of older steps (dead saves) go.
  std::vector<int64_t> older;
  for (int64_t s : ListSteps(opts.root)) {
    if (s <= st.step) older.push_back(s);
  }
  const size_t keep_last = static_cast<size_t>(std::max(1, opts.keep_last));
  for (size_t i = 0; i + keep_last < older.size(); ++i) {
    RETURN_IF_ERROR(RemoveAll(JoinPath(opts.root, StepDirName(older[i]))));
  }
  for (const std::string& f : ListDir(opts.root)) {
    int64_t s;
    if (ParseStepDir(f, ".tmp-step-", &s) && s < st.step) RETURN_IF_ERROR(RemoveAll(JoinPath(opts.root, f)));
  }
  return base::SyncDir(opts.root);
}

}  // namespace

std::string StepDirName(int64_t step) { return absl::StrCat("step-", step); }

std::vector<int64_t> ListSteps(const std::string& root) {
  std::vector<int64_t> steps;
  for (const std::string& f : ListDir(root)) {
    int64_t s;
    if (ParseStepDir(f, "step-", &s) && PathExists(JoinPath(JoinPath(root, f), kMetadataFile))) {
      steps.push_back(s);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::StatusOr<std::string> ResolveLatest(const std::string& root) {
  auto text = ReadFile(JoinPath(root, "latest"), 4096);
  if (!text.ok()) {
    if (text.status().code() == absl::StatusCode::kNotFound) {
      return absl::NotFoundError(absl::StrCat("no committed checkpoint under ", root));
    }
    return text.status();
  }
  absl::string_view name = absl::StripAsciiWhitespace(*text);
  int64_t step;
  if (!ParseStepDir(name, "step-", &step)) {
    return absl::DataLossError(absl::StrCat(root, "/latest holds \"", name, "\", not step-<N>"));
  }
  return JoinPath(root, name);
}

absl::StatusOr<std::string> FindResumeCheckpoint(const std::string& root) {
  absl::StatusOr<std::string> latest = ResolveLatest(root);
  std::string why;
  if (latest.ok()) {
    if (PathExists(JoinPath(*latest, kMetadataFile))) return *latest;
    why = absl::StrCat(root, "/latest names ", *latest, ", which holds no ", kMetadataFile);
  } else {
    why = std::string(latest.status().message());
  }
  const std::vector<int64_t> steps = ListSteps(root);
  if (steps.empty()) {
    if (!latest.ok() && !absl::IsNotFound(latest.status())) {
      spdlog::warn("{}; no committed checkpoint under {}: starting from step 0", why, root);
    }
    return absl::NotFoundError(absl::StrCat("no committed checkpoint under ", root, " (", why, ")"));
  }
  std::vector<std::string> skipped;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const std::string dir = JoinPath(root, StepDirName(*it));
    absl::StatusOr<std::unique_ptr<CheckpointReader>> r = CheckpointReader::Open(dir);
    absl::Status s = r.ok() ? (*r)->VerifyAll() : r.status();
    if (s.ok()) {
      spdlog::warn("{}; resuming from {}, the newest checkpoint that verifies{}{}", why, dir,
                   skipped.empty() ? "" : " (skipped: ", absl::StrJoin(skipped, "; ") +
                   (skipped.empty() ? "" : ")"));
      return dir;
    }
    skipped.push_back(std::string(s.message()));
  }
  return absl::DataLossError(absl::StrCat(
      why, "; and no committed checkpoint under ", root, " verifies: ", absl::StrJoin(skipped, "; "),
      ". Nothing was deleted: point ", root, "/latest at a good step-<N>, or move the step "
      "directories away to start from step 0"));
}

absl::Status SaveCheckpoint(const SaveOptions& opts, const RankState& st, CommitProtocol* protocol) {
  if (opts.rank < 0 || opts.rank >= opts.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", opts.rank, " not in world of ", opts.world_size));
  }
  // A rank of a superseded attempt (fenced off in the store) writes nothing, not even its data.
  RETURN_IF_ERROR(base::Annotate(protocol->Claim(st.step, opts.rank),
                                 absl::StrCat("checkpoint step ", st.step)));
  const std::string tmp = JoinPath(opts.root, TmpDirName(st.step));
  absl::StatusOr<std::string> token = [&]() -> absl::StatusOr<std::string> {
    RETURN_IF_ERROR(base::MakeDirs(tmp, kDirMode));
    return WriteRankFiles(opts, st, tmp);
  }();
  if (!token.ok()) {
    // Vote "error" so rank 0 aborts now instead of timing out; report our own error.
    protocol->MarkDone(st.step, opts.rank, absl::StrCat("error: rank ", opts.rank, ": ",
                                                        token.status().message())).IgnoreError();
    if (opts.rank != 0) return token.status();
  } else {
    RETURN_IF_ERROR(protocol->MarkDone(st.step, opts.rank, *token));
  }
  if (opts.rank != 0) {
    ASSIGN_OR_RETURN(std::string outcome, protocol->WaitOutcome(st.step, opts.commit_timeout));
    if (outcome != "ok") {
      return absl::AbortedError(absl::StrCat("checkpoint step ", st.step, " not committed: ", outcome));
    }
    return absl::OkStatus();
  }
  absl::Status s = token.status();
  if (s.ok()) {
    auto tokens = protocol->WaitAllDone(st.step, opts.world_size, opts.commit_timeout);
    if (!tokens.ok()) {
      s = tokens.status();
    } else {
      for (const std::string& t : *tokens) {
        if (absl::StartsWith(t, "error")) { s = absl::AbortedError(t); break; }
      }
      if (s.ok()) s = Commit(opts, st, tmp, *tokens, protocol);
    }
  }
  protocol->Publish(st.step, s.ok() ? "ok" : absl::StrCat("error: ", s.message())).IgnoreError();
  if (!s.ok()) {
    spdlog::error("checkpoint step {} failed: {}", st.step, s.ToString());
    return base::Annotate(s, absl::StrCat("checkpoint step ", st.step));
  }
  spdlog::info("checkpoint step {} committed to {}", st.step, JoinPath(opts.root, StepDirName(st.step)));
  return absl::OkStatus();
}

// ---- AsyncSaver ----

AsyncSaver::AsyncSaver(SaveOptions opts, std::shared_ptr<CommitProtocol> protocol)
    : opts_(std::move(opts)), protocol_(std::move(protocol)) {}

AsyncSaver::~AsyncSaver() { Wait().IgnoreError(); }

absl::Status AsyncSaver::Start(const RankState& state) {
  absl::Time t0 = absl::Now();
  std::thread prev;
  {
    absl::MutexLock l(&mu_);
    prev = std::move(thread_);
  }
  if (prev.joinable()) prev.join();
  absl::MutexLock l(&mu_);
  if (!collected_ && !last_.ok()) {
    collected_ = true;
    return base::Annotate(last_, "previous async checkpoint failed");
  }
  // Host copy: the caller may overwrite its tensors as soon as we return.
  struct Owned {
    RankState state;
    std::vector<std::string> bufs;
  };
  auto owned = std::make_shared<Owned>();
  owned->state = state;
  owned->bufs.reserve(state.tensors.size());
  for (size_t i = 0; i < state.tensors.size(); ++i) {
    owned->bufs.emplace_back(state.tensors[i].data.data(), state.tensors[i].data.size());
    owned->state.tensors[i].data = owned->bufs.back();
  }
  in_flight_ = true;
  collected_ = false;
  last_blocked_ = absl::Now() - t0;
  thread_ = std::thread([this, owned]() {
    absl::Status s = SaveCheckpoint(opts_, owned->state, protocol_.get());
    absl::MutexLock l(&mu_);
    last_ = s;
    in_flight_ = false;
    if (s.ok()) committed_ = owned->state.step;
  });
  return absl::OkStatus();
}

absl::Status AsyncSaver::Wait() {
  std::thread t;
  {
    absl::MutexLock l(&mu_);
    t = std::move(thread_);
  }
  if (t.joinable()) t.join();
  absl::MutexLock l(&mu_);
  collected_ = true;
  return last_;
}

absl::Duration AsyncSaver::last_blocked() const {
  absl::MutexLock l(&mu_);
  return last_blocked_;
}

std::optional<int64_t> AsyncSaver::last_committed_step() const {
  absl::MutexLock l(&mu_);
  return committed_;
}

// ---- CheckpointReader ----

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& path) {
  std::string dir = path;
  if (!PathExists(JoinPath(path, kMetadataFile))) {
    ASSIGN_OR_RETURN(dir, ResolveLatest(path));
  }
  ASSIGN_OR_RETURN(std::string text, ReadFile(JoinPath(dir, kMetadataFile), kMaxMetadataSize));
  absl::StatusOr<Metadata> m = ParseMetadata(text, /*complete=*/true);
  if (!m.ok()) return base::Annotate(m.status(), JoinPath(dir, kMetadataFile));
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  r->dir_ = dir;
  r->meta_ = std::move(*m);
  return r;
}

absl::StatusOr<absl::string_view> CheckpointReader::ChunkBytes(const ChunkRef& c,
                                                               const std::string& what) const {
  absl::MutexLock l(&mu_);
  auto it = files_.find(c.file);
  if (it == files_.end()) {
    auto f = MappedFile::Open(JoinPath(dir_, c.file));
    if (!f.ok()) return base::Annotate(f.status(), absl::StrCat(what, ": missing data file ", c.file));
    it = files_.emplace(c.file, std::move(*f)).first;
  }
  absl::string_view bytes = it->second->bytes();
  if (c.offset > bytes.size() || c.length > bytes.size() - c.offset) {
    return Truncated(c, bytes.size(), what);
  }
  absl::string_view chunk = bytes.substr(c.offset, c.length);
  auto key = std::make_pair(c.file, c.offset);
  if (!verified_.count(key)) {
    uint64_t h = Xxh3(chunk);
    if (h != c.xxh3) return Mismatch(c, h, what);
    verified_[key] = true;
  }
  return chunk;
}

absl::StatusOr<std::string> CheckpointReader::ReadRows(absl::string_view name, int64_t row_begin,
                                                       int64_t row_end, std::optional<DType> as) const {
  const TensorMeta* t = meta_.Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no tensor \"", name, "\" in ", dir_));
  if (row_begin < 0 || row_end < row_begin || row_end > Dim0(t->shape)) {
    return absl::OutOfRangeError(absl::StrCat("tensor \"", name, "\": rows [", row_begin, ", ",
                                              row_end, ") outside [0, ", Dim0(t->shape), ")"));
  }
  ASSIGN_OR_RETURN(uint64_t row_bytes, RowBytes(t->dtype, t->shape));
  auto what = [&](size_t i) {
    const ChunkRef& c = t->chunks[i];
    return absl::StrCat("tensor \"", name, "\" chunk ", i, " (rows [", c.row_begin, ", ",
                        c.row_begin + c.rows, "))");
  };
  // The metadata's sizes are only claims: check every chunk against its file on disk before
  // allocating the output (a few-KB metadata.json must not make us allocate gigabytes).
  for (size_t i = 0; i < t->chunks.size(); ++i) {
    const ChunkRef& c = t->chunks[i];
    if (std::max(row_begin, c.row_begin) >= std::min(row_end, c.row_begin + c.rows)) continue;
    RETURN_IF_ERROR(CheckOnDisk(c, what(i)).status());
  }
  std::string out(static_cast<size_t>(row_end - row_begin) * row_bytes, '\0');
  for (size_t i = 0; i < t->chunks.size(); ++i) {
    const ChunkRef& c = t->chunks[i];
    int64_t b = std::max(row_begin, c.row_begin), e = std::min(row_end, c.row_begin + c.rows);
    if (b >= e) continue;
    ASSIGN_OR_RETURN(absl::string_view chunk, ChunkBytes(c, what(i)));
    std::memcpy(&out[(b - row_begin) * row_bytes], chunk.data() + (b - c.row_begin) * row_bytes,
                (e - b) * row_bytes);
  }
  if (!as.has_value() || *as == t->dtype) return out;
  size_t n = out.size() / DTypeSize(t->dtype);
  std::string conv(n * DTypeSize(*as), '\0');
  absl::Status s = ConvertDType(t->dtype, out.data(), *as, conv.data(), n);
  if (!s.ok()) return base::Annotate(s, absl::StrCat("tensor \"", name, "\""));
  return conv;
}

absl::StatusOr<std::string> CheckpointReader::ReadShard(absl::string_view name, int rank, int world,
                                                        std::optional<DType> as) const {
  const TensorMeta* t = meta_.Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no tensor \"", name, "\" in ", dir_));
  auto [b, e] = ShardRows(Dim0(t->shape), rank, world);
  return ReadRows(name, b, e, as);
}

absl::StatusOr<std::string> CheckpointReader::ReadFull(absl::string_view name,
                                                       std::optional<DType> as) const {
  const TensorMeta* t = meta_.Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no tensor \"", name, "\" in ", dir_));
  return ReadRows(name, 0, Dim0(t->shape), as);
}

absl::StatusOr<std::string> CheckpointReader::ReadBlob(int saved_rank, absl::string_view blob) const {
  for (const RankMeta& r : meta_.ranks) {
    if (r.rank != saved_rank) continue;
    auto it = r.blobs.find(std::string(blob));
    if (it == r.blobs.end()) break;
    ASSIGN_OR_RETURN(absl::string_view b,
                     ChunkBytes(it->second, absl::StrCat("rank ", saved_rank, " blob \"", blob, "\"")));
    return std::string(b);
  }
  return absl::NotFoundError(absl::StrCat("rank ", saved_rank, " saved no \"", blob, "\""));
}

absl::StatusOr<const RegularFile*> CheckpointReader::CheckOnDisk(const ChunkRef& c,
                                                                 const std::string& what) const {
  const RegularFile* f;
  {
    absl::MutexLock l(&mu_);
    auto it = streams_.find(c.file);
    if (it == streams_.end()) {
      auto opened = RegularFile::Open(JoinPath(dir_, c.file));
      if (!opened.ok()) {
        return base::Annotate(opened.status(), absl::StrCat(what, ": missing data file ", c.file));
      }
      it = streams_.emplace(c.file, std::move(*opened)).first;
    }
    f = it->second.get();
  }
  if (c.offset > f->size() || c.length > f->size() - c.offset) return Truncated(c, f->size(), what);
  return f;
}

absl::Status CheckpointReader::StreamChunk(
    const ChunkRef& c, const std::string& what,
    const std::function<absl::Status(absl::string_view)>& fn) const {
  ASSIGN_OR_RETURN(const RegularFile* f, CheckOnDisk(c, what));
  Xxh3Stream hash;
  absl::Status s = f->ReadRange(c.offset, c.length, [&](absl::string_view piece) {
    hash.Update(piece);
    return fn ? fn(piece) : absl::OkStatus();
  });
  if (!s.ok()) return base::Annotate(s, what);
  if (hash.Digest() != c.xxh3) return Mismatch(c, hash.Digest(), what);
  absl::MutexLock l(&mu_);
  verified_[std::make_pair(c.file, c.offset)] = true;
  return absl::OkStatus();
}

absl::Status CheckpointReader::VerifyAll() const {
  std::vector<std::string> bad;
  auto check = [&](const ChunkRef& c, const std::string& what) {
    absl::Status s = StreamChunk(c, what, nullptr);
    if (!s.ok()) bad.push_back(std::string(s.message()));
  };
  for (const TensorMeta& t : meta_.tensors) {
    for (size_t i = 0; i < t.chunks.size(); ++i) {
      const ChunkRef& c = t.chunks[i];
      check(c, absl::StrCat("tensor \"", t.name, "\" chunk ", i, " (rows [", c.row_begin, ", ",
                            c.row_begin + c.rows, "))"));
    }
  }
  for (const RankMeta& r : meta_.ranks) {
    for (const auto& [k, c] : r.blobs) check(c, absl::StrCat("rank ", r.rank, " blob \"", k, "\""));
  }
  if (bad.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(dir_, ": ", bad.size(), " bad chunk(s): ", absl::StrJoin(bad, "; ")));
}

}  // namespace ember::ckpt
