// The job page on emberd's HTTP server (runtime/base/http_server.h): an HTML/JS/SVG page with no
// external assets (clusters are offline), embedded in the binary (job_page_html.cc), and the JSON
// it polls. Routes:
//   GET  /jobs/                      the job list       GET /jobs/<id>   one job (same document)
//   GET  /api/jobs                   jobs, newest first
//   GET  /api/jobs/<id>              record, attempts (reasons, flight-recorder verdicts),
//                                    checkpoints, per-rank recent step time / comm wait / memory
//                                    and the straggler mark (series.h FindStragglers)
//   GET  /api/jobs/<id>/series?metric=loss&max_points=1000[&attempt=N]   (GetSeries as JSON)
//   GET  /api/jobs/<id>/logs?rank=R&tail=N   the last N (<= 500) lines of a rank's log on this node
//   GET/POST /login, GET /logout     the session cookie (page_auth.h)
// Access: page_auth.h. A page request without a session is sent to /login; an API request gets
// 401. Every response carries a Content-Security-Policy that allows only the page's own inline
// script and style (by hash) and same-origin fetches; every dynamic value is written with
// textContent/setAttribute, never parsed as HTML.
//
// Thread-safe: handlers run on the HTTP server's threads; they read the store and files only.
#ifndef EMBER_RUNTIME_DAEMON_JOB_PAGE_H_
#define EMBER_RUNTIME_DAEMON_JOB_PAGE_H_

#include <string>

#include "runtime/base/http_server.h"
#include "runtime/daemon/daemon.h"

namespace ember::daemon {

// The embedded document (job_page_html.cc): style, script and body, assembled by JobPageHtml().
extern const char kJobPageStyle[];
extern const char kJobPageScript[];
extern const char kJobPageBody[];
extern const char kLoginBody[];

// Registers the routes above on `server`. `d` must outlive the server's handlers (the daemon
// stops its HTTP server before it goes away).
void RegisterJobPage(base::HttpServer* server, Daemon::Impl* d, bool open_read);

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_JOB_PAGE_H_
