#include "runtime/flight/analyze.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/files.h"
#include "runtime/base/json.h"
#include "runtime/base/logging.h"

namespace ember::fr {
namespace {

struct OpView {
  std::string op, dtype, state, tag;
  int64_t numel = 0, started_ns = 0, timeout_ms = 0;
};

// A rank's oldest op that did not complete (state scheduled, started or failed), in record order.
struct Head {
  std::string group, op, tag;
  bool p2p = false;
  int64_t seq = 0;
  int peer = -1;  // p2p: the other group rank
};

struct RankGroup {
  int64_t enqueued = 0, completed = 0;
  std::map<int64_t, OpView> ops;  // collective seq -> entry
};

std::string Ranks(const std::vector<int>& r) { return absl::StrCat("[", absl::StrJoin(r, ", "), "]"); }

std::string Describe(const OpView& v, int64_t seq) {
  return absl::StrCat(v.op, " (seq ", seq, ", ", v.numel, " x ", v.dtype, ")");
}

// Wait-for edges of a rank whose oldest unfinished op is `h`: a p2p op waits for its peer, a
// collective for the members that never enqueued it or left no dump.
std::vector<int> WaitsFor(const Head& h, const std::map<int, std::map<std::string, RankGroup>>& data,
                          const std::map<std::string, std::vector<int>>& members,
                          const std::set<int>& dumped) {
  std::vector<int> out;
  auto m = members.find(h.group);
  if (m == members.end()) return out;
  if (h.p2p) {
    if (h.peer >= 0 && h.peer < static_cast<int>(m->second.size())) out.push_back(m->second[h.peer]);
    return out;
  }
  for (int r : m->second) {
    if (!dumped.count(r)) {
      out.push_back(r);
      continue;
    }
    auto g = data.at(r).find(h.group);
    if (g == data.at(r).end() || g->second.enqueued < h.seq) out.push_back(r);
  }
  // A dead member first: it is the likelier root.
  std::stable_partition(out.begin(), out.end(), [&](int r) { return !dumped.count(r); });
  return out;
}

std::string EdgeText(const Head& h, int from, int to) {
  std::string what;
  if (h.p2p) {
    std::string tag = absl::StartsWith(h.tag, "tag=") ? absl::StrCat("tag ", h.tag.substr(4))
                                                       : absl::StrCat("tag \"", h.tag, "\"");
    what = absl::StrCat(h.op, " ", tag, " of group '", h.group, "'");
  } else {
    what = absl::StrCat(h.op, " seq ", h.seq, " of group '", h.group, "'");
  }
  return absl::StrCat("rank ", from, " is waiting for rank ", to, " (", what, ")");
}

// Follows wait-for edges (first target) from each blocked rank to the root: a rank with no dump, a
// rank with nothing pending or waiting on nobody, or a cycle. Of the chains that cross a
// point-to-point op or more than one group, or that end at a rank with no dump through
// collectives that only dumpless ranks are missing from, puts the best (a dead root, then a cycle,
// then the longest) first as a "waits_for" finding. Other hangs within one group of collectives
// (a dumped member that never joined) are left to the per-group findings. Without the dead-root
// case, a survivor stuck in a collective with a killed rank (every dumped member entered it) would
// be reported as "stuck" ahead of the dead rank, depending on where the survivors were when they
// stopped. The text has no "; " (the daemon splits verdicts there).
void AddWaitChain(const std::map<int, Head>& heads,
                  const std::map<int, std::map<std::string, RankGroup>>& data,
                  const std::map<std::string, std::vector<int>>& members,
                  const std::set<int>& dumped, Report* rep) {
  Finding best;
  std::pair<int, size_t> best_score = {-1, 0};  // (dead root 2, cycle 1, other 0; chain length)
  for (const auto& [start, unused] : heads) {
    std::vector<int> path = {start};
    std::vector<std::string> edges;
    bool p2p = false;
    bool dumped_laggard = false;  // a collective edge where a dumped member had not enqueued the op
    std::set<std::string> groups;
    int root = -1;
    std::string why;
    std::vector<int> cycle;
    Head last;
    for (int cur = start;;) {
      auto h = heads.find(cur);
      if (h == heads.end()) {
        root = cur;
        why = dumped.count(cur) ? "never joined: it has no op pending (hung outside communication?)"
                                : "left no dump (dead, or hung before its watchdog dumped)";
        break;
      }
      std::vector<int> next = WaitsFor(h->second, data, members, dumped);
      if (next.empty()) {
        root = cur;
        why = absl::StrCat("is stuck in ", h->second.op, " of group '", h->second.group,
                           "' waiting on no other rank");
        break;
      }
      p2p = p2p || h->second.p2p;
      if (!h->second.p2p) {
        for (int r : next) dumped_laggard = dumped_laggard || dumped.count(r) > 0;
      }
      groups.insert(h->second.group);
      last = h->second;
      edges.push_back(EdgeText(h->second, cur, next[0]));
      auto seen = std::find(path.begin(), path.end(), next[0]);
      if (seen != path.end()) {
        cycle.assign(seen, path.end());
        break;
      }
      path.push_back(next[0]);
      cur = next[0];
    }
    const bool dead_root = cycle.empty() && !dumped.count(root);
    if (!p2p && groups.size() < 2 && !(dead_root && !dumped_laggard)) continue;
    std::pair<int, size_t> score = {!cycle.empty() ? 1 : dumped.count(root) ? 0 : 2, edges.size()};
    if (score <= best_score) continue;
    best_score = score;
    std::string chain = absl::StrJoin(edges, ", ");
    if (!cycle.empty()) {
      std::sort(cycle.begin(), cycle.end());
      best = {"waits_for", last.group, last.seq, last.op, cycle,
              absl::StrCat("ranks ", absl::StrJoin(cycle, ", "),
                           " wait for each other in a cycle (deadlock): ", chain)};
    } else {
      best = {"waits_for", last.group, last.seq, last.op, {root},
              absl::StrCat("rank ", root, " ", why, ": ", chain)};
    }
  }
  if (best_score.first >= 0) rep->findings.insert(rep->findings.begin(), best);
}

}  // namespace

absl::StatusOr<Report> AnalyzeTexts(const std::map<std::string, std::string>& files) {
  Report rep;
  // world rank -> group name -> view
  std::map<int, std::map<std::string, RankGroup>> data;
  std::map<std::string, std::vector<int>> members;
  std::vector<std::string> group_order;
  std::map<int, Head> heads;  // world rank -> oldest unfinished op
  for (const auto& [name, text] : files) {
    absl::StatusOr<json::Value> doc = json::Parse(text);
    if (!doc.ok()) return absl::InvalidArgumentError(absl::StrCat(name, ": ", doc.status().message()));
    const json::Value& d = *doc;
    if (d.Get("schema").StrOr() != "ember.flight_recorder")
      return absl::InvalidArgumentError(absl::StrCat(name, ": not a flight recorder dump"));
    if (!absl::StartsWith(d.Get("version").StrOr(), "1."))
      return absl::InvalidArgumentError(absl::StrCat(name, ": unsupported schema version ",
                                                     d.Get("version").StrOr(), " (this tool reads 1.x)"));
    int rank = static_cast<int>(d.Get("rank").IntOr(-1));
    rep.dumped_ranks.push_back(rank);
    auto& mine = data[rank];
    bool have_head = false;
    std::map<int64_t, std::string> gid_to_name;
    for (const json::Value& g : d.Get("groups").array()) {
      std::string gname = g.Get("name").StrOr();
      gid_to_name[g.Get("id").IntOr(0)] = gname;
      RankGroup& rg = mine[gname];
      rg.enqueued = std::max(rg.enqueued, g.Get("last_enqueued_seq").IntOr(0));
      rg.completed = std::max(rg.completed, g.Get("last_completed_seq").IntOr(0));
      if (!members.count(gname)) {
        group_order.push_back(gname);
        for (const json::Value& r : g.Get("global_ranks").array()) members[gname].push_back(static_cast<int>(r.IntOr(0)));
      }
    }
    for (const json::Value& e : d.Get("entries").array()) {
      if (!have_head && e.Get("state").StrOr() != "completed") {
        Head& h = heads[rank];
        h.group = e.Get("group_name").StrOr();
        h.op = e.Get("op").StrOr();
        h.tag = e.Get("tag").StrOr();
        h.p2p = e.Get("p2p_seq").IntOr(-1) > 0;
        h.seq = h.p2p ? e.Get("p2p_seq").IntOr(0) : e.Get("collective_seq").IntOr(0);
        h.peer = static_cast<int>(e.Get("peer").IntOr(-1));
        have_head = true;
      }
      int64_t seq = e.Get("collective_seq").IntOr(-1);
      if (seq <= 0) continue;
      std::string gname = e.Get("group_name").StrOr();
      OpView v;
      v.op = e.Get("op").StrOr();
      v.dtype = e.Get("in_dtype").StrOr();
      v.numel = e.Get("in_numel").IntOr(0);
      v.state = e.Get("state").StrOr();
      v.tag = e.Get("tag").StrOr();
      v.started_ns = e.Get("time_started_ns").IntOr(0);
      v.timeout_ms = e.Get("timeout_ms").IntOr(0);
      mine[gname].ops[seq] = v;
    }
  }
  std::sort(rep.dumped_ranks.begin(), rep.dumped_ranks.end());
  std::set<int> dumped(rep.dumped_ranks.begin(), rep.dumped_ranks.end());
  std::set<int> reported_missing;

  for (const std::string& gname : group_order) {
    GroupSummary gs;
    gs.name = gname;
    gs.ranks = members[gname];
    std::vector<int> present, missing;
    for (int r : gs.ranks) {
      if (dumped.count(r) && data[r].count(gname)) {
        present.push_back(r);
        gs.last_enqueued[r] = data[r][gname].enqueued;
        gs.last_completed[r] = data[r][gname].completed;
      } else {
        missing.push_back(r);
      }
    }
    std::vector<int> new_missing;
    for (int r : missing)
      if (reported_missing.insert(r).second) new_missing.push_back(r);
    if (!new_missing.empty()) {
      rep.findings.push_back({"missing_dump", gname, 0, "", new_missing,
                              absl::StrCat("no dump from ranks ", Ranks(new_missing),
                                           " (process gone or never reached its watchdog)")});
    }
    // The earliest collective some rank entered but did not complete.
    int64_t stuck = 0;
    for (int r : present) {
      const RankGroup& rg = data[r][gname];
      if (rg.enqueued > rg.completed) {
        int64_t s = rg.completed + 1;
        if (stuck == 0 || s < stuck) stuck = s;
      }
    }
    if (stuck > 0) {
      std::vector<int> never, waiting;
      OpView what;
      for (int r : present) {
        const RankGroup& rg = data[r][gname];
        if (rg.enqueued < stuck) {
          never.push_back(r);
        } else {
          waiting.push_back(r);
          auto it = rg.ops.find(stuck);
          if (it != rg.ops.end() && what.op.empty()) what = it->second;
        }
      }
      std::string desc = what.op.empty() ? absl::StrCat("collective seq ", stuck) : Describe(what, stuck);
      std::string tag = what.tag.empty() ? "" : absl::StrCat(" [tag \"", what.tag, "\"]");
      if (!never.empty()) {
        std::string last;
        for (int r : never) absl::StrAppend(&last, last.empty() ? "" : ", ", "rank ", r, " at seq ", data[r][gname].enqueued);
        rep.findings.push_back({"never_joined", gname, stuck, what.op, never,
                                absl::StrCat("group '", gname, "': ranks ", Ranks(never),
                                             " never joined ", desc, tag, "; ranks ", Ranks(waiting),
                                             " are stuck in it. Last op issued: ", last, ".")});
      } else {
        rep.findings.push_back({"stuck", gname, stuck, what.op, waiting,
                                absl::StrCat("group '", gname, "': every dumped rank entered ", desc,
                                             tag, " but it did not complete on ranks ",
                                             Ranks(waiting),
                                             " (transport failure, a dead peer, or a mismatch)")});
      }
    }
    // The first seq where ranks that recorded it disagree.
    std::set<int64_t> seqs;
    for (int r : present)
      for (const auto& [s, v] : data[r][gname].ops) seqs.insert(s);
    for (int64_t s : seqs) {
      std::map<std::string, std::vector<int>> variants;
      for (int r : present) {
        auto it = data[r][gname].ops.find(s);
        if (it == data[r][gname].ops.end()) continue;
        variants[absl::StrCat(it->second.op, " ", it->second.numel, " x ", it->second.dtype)].push_back(r);
      }
      if (variants.size() > 1) {
        std::string text = absl::StrCat("group '", gname, "': ranks disagree at seq ", s, ":");
        std::vector<int> culprits;
        size_t most = 0;
        for (auto& [k, rs] : variants) most = std::max(most, rs.size());
        for (auto& [k, rs] : variants) {
          absl::StrAppend(&text, " ", Ranks(rs), " called ", k, ";");
          if (rs.size() < most || culprits.empty()) culprits = rs;
        }
        text.pop_back();
        rep.findings.push_back({"mismatch", gname, s, "", culprits, text});
        break;
      }
    }
    rep.groups.push_back(std::move(gs));
  }
  AddWaitChain(heads, data, members, dumped, &rep);
  rep.problem = !rep.findings.empty();
  return rep;
}

absl::StatusOr<Report> AnalyzeDir(const std::string& dir) {
  constexpr uint64_t kMaxDumpBytes = 256 << 20;
  // The directory may be written by a script job's user while a root daemon reads it: neither it
  // nor a dump is reached through a symlink (issue 31: a rank-*.json linking to a root file).
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  DIR* d = dfd < 0 ? nullptr : fdopendir(dfd);
  if (!d) {
    if (dfd >= 0) ::close(dfd);
    return absl::NotFoundError(absl::StrCat("cannot open directory ", dir, " (a symlink is not followed)"));
  }
  std::map<std::string, std::string> files;
  std::vector<std::string> torch_dumps;  // PyTorch's own (script jobs): pickles, not read here
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (absl::StartsWith(n, "torch-rank-")) torch_dumps.push_back(n);
    if (!absl::StartsWith(n, "rank-") || !absl::EndsWith(n, ".json")) continue;
    // Regular files only: a FIFO or device named rank-*.json must not hang or flood us; a symlink
    // is refused (ELOOP), not followed.
    struct stat lst;
    if (::fstatat(dfd, n.c_str(), &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode)) {
      closedir(d);
      return absl::FailedPreconditionError(
          absl::StrCat(dir, "/", n, " is a symlink; flight-recorder dumps are not read through one"));
    }
    absl::StatusOr<std::string> text = base::ReadRegularFile(dir + "/" + n, kMaxDumpBytes);
    if (!text.ok()) {
      closedir(d);
      return text.status();
    }
    files[n] = std::move(*text);
  }
  closedir(d);
  if (files.empty() && !torch_dumps.empty()) {
    return absl::UnimplementedError(absl::StrCat(
        dir, " holds PyTorch flight-recorder dumps (", torch_dumps.size(), ", e.g. ",
        torch_dumps[0], "; pickles from torch >= 2.2 with NCCL) and no Ember rank-*.json; this "
        "version reads Ember's format only: use PyTorch's tools/flight_recorder on them"));
  }
  if (files.empty()) return absl::NotFoundError(absl::StrCat("no rank-*.json dumps in ", dir));
  return AnalyzeTexts(files);
}

std::string Report::ToText() const {
  std::string out = absl::StrCat("dumps from ranks ", Ranks(dumped_ranks), "\n");
  for (const Finding& f : findings) absl::StrAppend(&out, "PROBLEM: ", f.text, "\n");
  for (const GroupSummary& g : groups) {
    absl::StrAppend(&out, "group '", g.name, "' last completed seq:");
    for (const auto& [r, s] : g.last_completed) absl::StrAppend(&out, " rank ", r, "=", s);
    absl::StrAppend(&out, "\n");
  }
  if (findings.empty()) absl::StrAppend(&out, "no problem found\n");
  return out;
}

std::string Report::ToJson() const {
  auto q = [](const std::string& s) { return absl::StrCat("\"", base::JsonEscape(s), "\""); };
  std::string out = absl::StrCat("{\"problem\": ", problem ? "true" : "false",
                                 ", \"dumped_ranks\": [", absl::StrJoin(dumped_ranks, ", "),
                                 "], \"findings\": [");
  for (size_t i = 0; i < findings.size(); ++i) {
    const Finding& f = findings[i];
    absl::StrAppend(&out, i ? ", " : "", "{\"kind\": ", q(f.kind), ", \"group\": ", q(f.group),
                    ", \"seq\": ", f.seq, ", \"op\": ", q(f.op), ", \"ranks\": [",
                    absl::StrJoin(f.ranks, ", "), "], \"text\": ", q(f.text), "}");
  }
  absl::StrAppend(&out, "], \"groups\": [");
  for (size_t i = 0; i < groups.size(); ++i) {
    const GroupSummary& g = groups[i];
    absl::StrAppend(&out, i ? ", " : "", "{\"name\": ", q(g.name), ", \"ranks\": [",
                    absl::StrJoin(g.ranks, ", "), "], \"last_completed_seq\": {");
    bool first = true;
    for (const auto& [r, s] : g.last_completed) {
      absl::StrAppend(&out, first ? "" : ", ", "\"", r, "\": ", s);
      first = false;
    }
    absl::StrAppend(&out, "}}");
  }
  absl::StrAppend(&out, "]}\n");
  return out;
}

}  // namespace ember::fr
