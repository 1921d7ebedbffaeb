#include "runtime/worker/weights_protocol.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ember::worker {

std::string EncodeManifest(const WeightsManifest& m) {
  std::string out = absl::StrCat("ember-weights v1 attempt=", m.attempt, " world=", m.world, "\n");
  for (const auto& t : m.tensors) absl::StrAppend(&out, t.name, " F32 ", absl::StrJoin(t.shape, ","), "\n");
  return out;
}

absl::StatusOr<WeightsManifest> ParseManifest(absl::string_view text) {
  WeightsManifest m;
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  auto bad = [](size_t line, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("weights manifest line ", line + 1, ": ", why));
  };
  if (lines.empty() || !absl::ConsumePrefix(&lines[0], "ember-weights v1 attempt=")) {
    return bad(0, "expected 'ember-weights v1 attempt=A world=W' (a manifest of another version?)");
  }
  std::pair<absl::string_view, absl::string_view> aw = absl::StrSplit(lines[0], " world=");
  if (!absl::SimpleAtoi(aw.first, &m.attempt) || !absl::SimpleAtoi(aw.second, &m.world) || m.world < 1) {
    return bad(0, absl::StrCat("bad attempt/world in '", lines[0], "'"));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<absl::string_view> f = absl::StrSplit(lines[i], ' ');
    if (f.size() != 3 || f[1] != "F32") return bad(i, absl::StrCat("expected 'NAME F32 DIMS', got '", lines[i], "'"));
    WeightsManifest::Tensor t;
    t.name = std::string(f[0]);
    uint64_t n = 1;
    for (absl::string_view d : absl::StrSplit(f[2], ',', absl::SkipEmpty())) {
      int64_t v = 0;
      if (!absl::SimpleAtoi(d, &v) || v < 0 || v > (int64_t{1} << 40)) return bad(i, absl::StrCat("bad dimension '", d, "'"));
      t.shape.push_back(v);
      n *= static_cast<uint64_t>(v);
      if (n > (uint64_t{1} << 40)) return bad(i, "tensor larger than 4 TiB");
    }
    t.offset = m.total_bytes;
    t.bytes = 4 * n;
    m.total_bytes += t.bytes;
    m.tensors.push_back(std::move(t));
  }
  return m;
}

std::optional<int64_t> ParseMessage(absl::string_view message, absl::string_view prefix) {
  int64_t step = 0;
  if (!absl::ConsumePrefix(&message, prefix) || !absl::ConsumePrefix(&message, " ") ||
      !absl::SimpleAtoi(message, &step)) {
    return std::nullopt;
  }
  return step;
}

std::optional<int> ParseRankAgent(absl::string_view name) {
  int rank = 0;
  if (!absl::ConsumePrefix(&name, "rank") || !absl::SimpleAtoi(name, &rank) || rank < 0) return std::nullopt;
  return rank;
}

}  // namespace ember::worker
