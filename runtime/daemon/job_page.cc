// The job page's routes and JSON (job_page.h); the document itself is in job_page_html.cc.
#include "runtime/daemon/job_page.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/base/json.h"
#include "runtime/base/utf8.h"
#include "runtime/daemon/daemon_impl.h"
#include "runtime/daemon/keys.h"
#include "runtime/daemon/page_auth.h"
#include "runtime/daemon/series.h"

namespace ember::daemon {
namespace {

namespace v1 = jobs::v1;
using base::HttpRequest;
using base::HttpResponse;
using json::Value;

constexpr int kRecentLines = 20;  // steps averaged for the per-rank bars

std::string Sha256Base64(const std::string& s) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(s.data(), s.size(), md, &n, EVP_sha256(), nullptr);
  std::string out(4 * ((n + 2) / 3) + 1, '\0');
  out.resize(EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), md, n));
  return out;
}

std::string UrlDecode(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && absl::ascii_isxdigit(s[i + 1]) &&
               absl::ascii_isxdigit(s[i + 2])) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string UrlEncode(absl::string_view s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '/' || c == '~') {
      out += c;
    } else {
      out += '%';
      out += kHex[static_cast<unsigned char>(c) >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// JSON inside <script type="application/json">: "<" only occurs in strings, where \u003c is the
// same text, so no "</script>" or "<!--" can end the element early.
std::string ScriptSafe(const std::string& json_text) {
  std::string out;
  for (char c : json_text) {
    if (c == '<') out += "\\u003c";
    else out += c;
  }
  return out;
}

std::map<std::string, std::string> ParseForm(absl::string_view q) {
  std::map<std::string, std::string> out;
  for (absl::string_view kv : absl::StrSplit(q, '&', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    out.emplace(UrlDecode(p.first), UrlDecode(p.second));
  }
  return out;
}

int IntParam(const std::map<std::string, std::string>& q, const std::string& k, int def) {
  auto it = q.find(k);
  int v = def;
  return it != q.end() && absl::SimpleAtoi(it->second, &v) ? v : def;
}

// Text that is valid UTF-8 (invalid bytes become U+FFFD), as the JSON writer needs.
std::string ValidUtf8(absl::string_view s) {
  if (base::FirstInvalidUtf8(s) == absl::string_view::npos) return std::string(s);
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const int n = base::Utf8SequenceLength(s, i);
    if (n == 0) {
      out += "\xef\xbf\xbd";
      ++i;
    } else {
      out.append(s.data() + i, n);
      i += n;
    }
  }
  return out;
}

Value Str(absl::string_view s) { return Value::Str(ValidUtf8(s)); }
// The metric the page's third chart shows first (any StepMetrics series can be picked).
constexpr char kPickedMetric[] = "step_s";

Value Num(double v) { return std::isfinite(v) ? Value::Double(v) : Value(); }

bool ValidJobId(absl::string_view id) { return CheckJobId(id).ok(); }  // spec_policy.h

class JobPage {
 public:
  JobPage(Daemon::Impl* d, bool open_read) : d_(d), auth_(d->opts.auth_token, open_read) {
    csp_ = absl::StrCat("default-src 'none'; script-src 'sha256-", Sha256Base64(kJobPageScript),
                        "'; style-src 'sha256-", Sha256Base64(kJobPageStyle),
                        "'; connect-src 'self'; img-src 'self' data:; form-action 'self'; "
                        "frame-ancestors 'none'; base-uri 'none'");
  }

  void Register(base::HttpServer* server) {
    auto self = std::shared_ptr<JobPage>(this);
    server->Handle("/jobs", [self](const HttpRequest& r) { return self->Page(r); });
    server->Handle("/api/jobs", [self](const HttpRequest& r) { return self->Api(r); });
    server->Handle("/login", [self](const HttpRequest& r) { return self->LoginPage(r); });
    server->Handle("/logout", [self](const HttpRequest& r) {
      self->auth_.Logout(r.Cookie(kSessionCookie));  // a copy of the cookie is refused from now
      HttpResponse resp = Redirect("/login");
      resp.headers.push_back({"Set-Cookie", absl::StrCat(kSessionCookie, "=; Path=/; HttpOnly; "
                                                         "SameSite=Strict; Max-Age=0")});
      return resp;
    });
  }

 private:
  static HttpResponse Redirect(const std::string& to) {
    HttpResponse r;
    r.status = 303;
    r.headers.push_back({"Location", to});
    return r;
  }

  HttpResponse Secure(HttpResponse r) const {
    r.headers.push_back({"Content-Security-Policy", csp_});
    r.headers.push_back({"X-Content-Type-Options", "nosniff"});
    r.headers.push_back({"Referrer-Policy", "no-referrer"});
    r.headers.push_back({"Cache-Control", "no-store"});
    return r;
  }

  bool MayRead(const HttpRequest& r) const {
    return auth_.MayRead(r.Cookie(kSessionCookie), r.Header("authorization"));
  }

  static std::string Document(absl::string_view body) {
    return absl::StrCat("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                        "<meta name=\"viewport\" content=\"width=device-width\">"
                        "<title>Ember</title><style>", kJobPageStyle, "</style></head>\n<body>",
                        body, "<script>", kJobPageScript, "</script></body></html>\n");
  }

  HttpResponse Page(const HttpRequest& r) {
    if (r.path == "/jobs") return Redirect("/jobs/");
    if (!absl::StartsWith(r.path, "/jobs/")) return Secure(Error(404, "no such page"));
    if (!MayRead(r)) return Redirect("/login?next=" + UrlEncode(r.path));
    // The first view's data rides in the document (no round trip before the first paint); the
    // script then polls the API.
    Value initial = Value::MakeObject();
    absl::string_view id = r.path;
    absl::ConsumePrefix(&id, "/jobs/");
    if (id.empty()) {
      initial.Set("list", ListJson());
    } else if (ValidJobId(id)) {
      auto rec = d_->ReadRecord(std::string(id));
      if (rec.ok()) {
        v1::Job& job = rec->first;
        initial.Set("detail", DetailJson(&job));
        for (const char* m : {"loss", "tokens_per_s", kPickedMetric}) {
          v1::Series s;
          if (ReadSeries(d_, job, m, 1000, -1, &s).ok()) initial.Set(m, SeriesJson(s));
        }
        // The third chart's choices: every StepMetrics series (series.h), first the default.
        Value metrics = Value::MakeArray();
        for (const std::string& m : MetricNames()) metrics.Push(Str(m));
        initial.Set("metrics", std::move(metrics)).Set("pick", Str(kPickedMetric));
        initial.Set("logs", LogsJson(job, 0, 200));
      }
    }
    HttpResponse resp;
    resp.content_type = "text/html; charset=utf-8";
    resp.body = Document(absl::StrCat(
        "<script type=\"application/json\" id=\"initial\">", ScriptSafe(json::Write(initial)),
        "</script>\n", kJobPageBody));
    return Secure(std::move(resp));
  }

  HttpResponse LoginPage(const HttpRequest& r) {
    std::string next = ParseForm(r.method == "POST" ? r.body : r.query)["next"];
    // Only our own pages: no open redirect to another site.
    if (!absl::StartsWith(next, "/jobs/") || absl::StrContains(next, "//")) next = "/jobs/";
    if (r.method == "POST") {
      const std::string session = auth_.Login(ParseForm(r.body)["token"]);
      if (auth_.auth_off()) return Redirect(next);
      if (session.empty()) return Redirect("/login?failed=1&next=" + UrlEncode(next));
      HttpResponse resp = Redirect(next);
      resp.headers.push_back(
          {"Set-Cookie", absl::StrCat(kSessionCookie, "=", session, "; Path=/; HttpOnly; "
                                      "SameSite=Strict; Max-Age=",
                                      absl::ToInt64Seconds(auth_.session_ttl()))});
      return resp;
    }
    HttpResponse resp;
    resp.content_type = "text/html; charset=utf-8";
    resp.body = Document(kLoginBody);
    return Secure(std::move(resp));
  }

  static HttpResponse JsonResponse(int status, const Value& v) {
    HttpResponse r;
    r.status = status;
    r.content_type = "application/json";
    r.body = json::Write(v);
    return r;
  }

  static HttpResponse Error(int status, const std::string& message) {
    return JsonResponse(status, Value::MakeObject().Set("error", Str(message)));
  }

  static HttpResponse FromStatus(const absl::Status& s) {
    int code = 500;
    if (absl::IsNotFound(s)) code = 404;
    if (absl::IsInvalidArgument(s)) code = 400;
    if (absl::IsUnavailable(s)) code = 503;
    return Error(code, std::string(s.message()));
  }

  HttpResponse Api(const HttpRequest& r) {
    if (!MayRead(r)) return Secure(Error(401, "log in at /login (the emberd token)"));
    if (r.method != "GET") return Secure(Error(405, "read-only: GET"));
    std::vector<std::string> parts = absl::StrSplit(r.path, '/', absl::SkipEmpty());
    // parts: api, jobs[, id[, what]]
    const auto q = ParseForm(r.query);
    if (parts.size() < 2 || parts[1] != "jobs") return Secure(Error(404, "no such page"));
    if (parts.size() == 2) return Secure(JsonResponse(200, ListJson()));
    if (parts.size() > 4 || !ValidJobId(parts[2])) return Secure(Error(404, "no such page"));
    auto rec = d_->ReadRecord(parts[2]);
    if (!rec.ok()) {
      if (absl::IsNotFound(rec.status())) return Secure(Error(404, "no job '" + parts[2] + "'"));
      return Secure(FromStatus(rec.status()));
    }
    v1::Job& job = rec->first;
    if (parts.size() == 3) return Secure(JsonResponse(200, DetailJson(&job)));
    if (parts[3] == "series") {
      v1::Series s;
      absl::Status st = ReadSeries(d_, job, q.count("metric") ? q.at("metric") : "loss",
                                   IntParam(q, "max_points", 1000), IntParam(q, "attempt", -1), &s);
      if (!st.ok()) return Secure(FromStatus(st));
      return Secure(JsonResponse(200, SeriesJson(s)));
    }
    if (parts[3] == "logs") {
      const int rank = IntParam(q, "rank", 0);
      if (rank < 0 || rank >= job.world_size()) {
        return Secure(Error(400, absl::StrCat("rank: ", rank, " is not in 0..", job.world_size() - 1)));
      }
      return Secure(JsonResponse(200, LogsJson(job, rank, IntParam(q, "tail", 50))));
    }
    return Secure(Error(404, "no such page"));
  }

  Value ListJson() {
    auto listed = ListJobs(d_, /*active_only=*/false);
    if (!listed.ok()) return Value::MakeObject().Set("error", Str(listed.status().ToString()));
    std::vector<v1::Job>& jobs = *listed;
    Value arr = Value::MakeArray();
    for (size_t i = 0; i < jobs.size() && i < 200; ++i) {
      d_->FillProgress(&jobs[i]);
      const v1::Job& j = jobs[i];
      arr.Push(Value::MakeObject()
                   .Set("id", Str(j.id()))
                   .Set("name", Str(j.name()))
                   .Set("state", Str(v1::JobState_Name(j.state())))
                   .Set("reason", Str(j.reason()))
                   .Set("world_size", Value::Int(j.world_size()))
                   .Set("device_type", Str(j.device_type()))
                   .Set("step", Value::Int(j.progress().metrics().step()))
                   .Set("steps", Value::Int(j.progress().steps()))
                   .Set("loss", Num(j.progress().metrics().loss()))
                   .Set("submit_unix_ms", Value::Int(j.submit_unix_ms())));
    }
    return Value::MakeObject().Set("jobs", std::move(arr));
  }

  // Committed checkpoints: step-<N> directories under the job's checkpoint root.
  Value Checkpoints(const v1::Job& job) {
    std::string root = job.spec().checkpoint().dir();
    if (root.empty()) root = "checkpoints";
    if (root[0] != '/') root = absl::StrCat(d_->JobDir(job.id()), "/", root);
    std::string latest;
    // The checkpoint directory is the script's: "latest" is read without following a symlink or
    // blocking on a FIFO (job_files.h), and only its first line.
    const std::string rel = RelativeTo(d_->opts.work_root, root + "/latest");
    auto lf = rel.empty()  // an absolute checkpoint.dir outside the work root (data_roots)
                  ? absl::StatusOr<Fd>(Fd(::open((root + "/latest").c_str(),
                                                 O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)))
                  : OpenFileBelow(d_->opts.work_root, rel, O_RDONLY, 0, false);
    if (lf.ok() && lf->get() >= 0) {
      char buf[256];
      const ssize_t got = ::pread(lf->get(), buf, sizeof(buf), 0);
      latest.assign(buf, got > 0 ? got : 0);
      latest = latest.substr(0, latest.find('\n'));
    }
    std::vector<std::pair<int64_t, int64_t>> steps;  // step, mtime ms
    if (DIR* dir = ::opendir(root.c_str())) {
      while (dirent* e = ::readdir(dir)) {
        int64_t step = 0;
        absl::string_view n = e->d_name;
        if (!absl::ConsumePrefix(&n, "step-") || !absl::SimpleAtoi(n, &step)) continue;
        struct stat st;
        if (::lstat(absl::StrCat(root, "/", e->d_name).c_str(), &st) != 0) continue;
        steps.push_back({step, int64_t(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000});
      }
      ::closedir(dir);
    }
    std::sort(steps.rbegin(), steps.rend());
    Value arr = Value::MakeArray();
    for (const auto& [step, ms] : steps) {
      arr.Push(Value::MakeObject()
                   .Set("step", Value::Int(step))
                   .Set("unix_ms", Value::Int(ms))
                   .Set("latest", Value::Bool(absl::StripAsciiWhitespace(latest) ==
                                              absl::StrCat("step-", step))));
    }
    return arr;
  }

  Value DetailJson(v1::Job* job) {
    d_->FillProgress(job);
    Value attempts = Value::MakeArray();
    for (const v1::Attempt& a : job->attempts()) {
      Value nodes = Value::MakeArray();
      for (const auto& na : a.assignment().nodes()) {
        nodes.Push(Str(absl::StrCat(na.node(), " ranks ", na.first_rank(), "-",
                                    na.first_rank() + na.devices_size() - 1)));
      }
      Value o = Value::MakeObject()
                    .Set("number", Value::Int(a.number()))
                    .Set("reason", Str(a.reason()))
                    .Set("verdict", Str(a.verdict()))
                    .Set("start_unix_ms", Value::Int(a.start_unix_ms()))
                    .Set("end_unix_ms", Value::Int(a.end_unix_ms()))
                    .Set("last_step", Value::Int(a.last_step()))
                    .Set("nodes", std::move(nodes));
      if (a.has_root_cause()) {
        o.Set("root_cause", Value::MakeObject()
                                .Set("rank", Value::Int(a.root_cause().rank()))
                                .Set("exit_code", Value::Int(a.root_cause().exit_code()))
                                .Set("signal", Value::Int(a.root_cause().signal()))
                                .Set("oom_killed", Value::Bool(a.root_cause().oom_killed())));
      }
      attempts.Push(std::move(o));
    }
    std::vector<RecentStats> stats(job->world_size());
    for (int r = 0; r < job->world_size(); ++r) {
      auto s = TailStats(RankMetricsPath(d_, job->id(), r), kRecentLines, -1);
      if (s.ok()) stats[r] = *s;
    }
    const std::vector<bool> slow = FindStragglers(stats);
    Value ranks = Value::MakeArray();
    for (int r = 0; r < job->world_size(); ++r) {
      const RecentStats& s = stats[r];
      ranks.Push(Value::MakeObject()
                     .Set("rank", Value::Int(r))
                     .Set("step", Value::Int(s.step))
                     .Set("lines", Value::Int(s.lines))
                     .Set("step_s", Num(s.step_s))
                     .Set("comm_wait_s", Num(s.comm_wait_s))
                     .Set("busy_s", Num(s.busy_s))
                     .Set("tokens_per_s", Num(s.tokens_per_s))
                     .Set("peak_rss_bytes", Num(s.peak_rss_bytes))
                     .Set("straggler", Value::Bool(slow[r])));
    }
    const v1::Progress& p = job->progress();
    Value v = Value::MakeObject()
                  .Set("id", Str(job->id()))
                  .Set("name", Str(job->name()))
                  .Set("state", Str(v1::JobState_Name(job->state())))
                  .Set("reason", Str(job->reason()))
                  .Set("world_size", Value::Int(job->world_size()))
                  .Set("device_type", Str(job->device_type()))
                  .Set("user", Str(job->user()))
                  .Set("submit_unix_ms", Value::Int(job->submit_unix_ms()))
                  .Set("end_unix_ms", Value::Int(job->end_unix_ms()))
                  .Set("progress", Value::MakeObject()
                                       .Set("step", Value::Int(p.metrics().step()))
                                       .Set("steps", Value::Int(p.steps()))
                                       .Set("loss", Num(p.metrics().loss()))
                                       .Set("tokens_per_s", Num(p.metrics().tokens_per_s()))
                                       .Set("eta_s", Num(p.eta_s())))
                  .Set("attempts", std::move(attempts))
                  .Set("checkpoints", Checkpoints(*job))
                  .Set("ranks", std::move(ranks))
                  .Set("straggler_rule",
                       Str(absl::StrCat("own time (step time less comm wait, mean of the last ",
                                        kRecentLines, " logged steps) over 1.5x the median")));
    return v;
  }

  static Value SeriesJson(const v1::Series& s) {
    Value ranks = Value::MakeArray();
    for (const v1::RankSeries& r : s.ranks()) {
      Value step = Value::MakeArray(), last = Value::MakeArray(), lo = Value::MakeArray(),
            hi = Value::MakeArray(), first = Value::MakeArray();
      for (int i = 0; i < r.step_size(); ++i) {
        step.Push(Value::Int(r.step(i)));
        last.Push(Num(r.last(i)));
        lo.Push(Num(r.min(i)));
        hi.Push(Num(r.max(i)));
        first.Push(Value::Int(r.first_step(i)));
      }
      ranks.Push(Value::MakeObject()
                     .Set("rank", Value::Int(r.rank()))
                     .Set("lines", Value::Int(r.lines()))
                     .Set("missing", Value::Bool(r.missing()))
                     .Set("step", std::move(step))
                     .Set("last", std::move(last))
                     .Set("min", std::move(lo))
                     .Set("max", std::move(hi))
                     .Set("first_step", std::move(first)));
    }
    return Value::MakeObject()
        .Set("id", Str(s.id()))
        .Set("metric", Str(s.metric()))
        .Set("ranks", std::move(ranks));
  }

  Value LogsJson(const v1::Job& job, int rank, int tail) {
    tail = std::clamp(tail, 1, 500);
    Value lines = Value::MakeArray();
    // In the daemon's own logs/ directory, never through a symlink (job_files.h).
    auto f = OpenFileBelow(d_->opts.work_root, absl::StrCat(job.id(), "/logs/rank-", rank, ".log"),
                           O_RDONLY, 0, /*own_dir=*/true);
    struct stat st;
    bool here = f.ok() && ::fstat(f->get(), &st) == 0;
    if (here) {
      const int64_t size = st.st_size;
      const int64_t from = std::max<int64_t>(0, size - (64 << 10));
      std::string text(size - from, '\0');
      const ssize_t got = ::pread(f->get(), text.data(), text.size(), from);
      text.resize(got > 0 ? got : 0);
      std::vector<absl::string_view> all = absl::StrSplit(text, '\n');
      if (!all.empty() && all.back().empty()) all.pop_back();
      if (from > 0 && !all.empty()) all.erase(all.begin());  // cut by the 64 KiB window
      for (size_t i = all.size() > size_t(tail) ? all.size() - tail : 0; i < all.size(); ++i) {
        lines.Push(Str(all[i]));
      }
    }
    return Value::MakeObject()
        .Set("rank", Value::Int(rank))
        .Set("on_this_node", Value::Bool(here))
        .Set("lines", std::move(lines));
  }

  Daemon::Impl* const d_;
  PageAuth auth_;  // thread-safe
  std::string csp_;
};

}  // namespace

void RegisterJobPage(base::HttpServer* server, Daemon::Impl* d, bool open_read) {
  (new JobPage(d, open_read))->Register(server);  // owned by the handlers (shared_ptr)
}

}  // namespace ember::daemon
