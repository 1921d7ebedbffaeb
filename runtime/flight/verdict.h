// FlightVerdict: one line naming the culprit of a failed attempt from its flight-recorder dumps,
// for the daemon to attach to the attempt (DaemonOptions::analyze_flight). Wraps the analyzer beside it
// analyzer: "rank 1 never joined all_gather seq 7 of group 'world'", "ranks 0, 2 disagree ...".
//
// Pure function over files; thread-safe.
#ifndef EMBER_RUNTIME_FLIGHT_VERDICT_H_
#define EMBER_RUNTIME_FLIGHT_VERDICT_H_

#include <string>

namespace ember {

// "" when `dir` has no dumps or the analyzer found no problem. At most three findings, the most
// telling first (the root of a point-to-point wait chain, never joined, mismatch, stuck, failed,
// missing dumps), joined by "; ". When some rank left no dump (killed, crashed), the survivors
// stopped wherever the stop request found them, so the order is: a wait chain to a dead rank or
// a cycle, mismatch, "rank R left no dump (...)" (ranks with no dump, unless a chain named them),
// then the rest; the dead rank leads whatever the timing. A wait chain reads "rank S left no
// dump (...): rank R is waiting for rank S (recv tag T of group 'G')" (also when R waits in a
// collective that only dumpless ranks are missing from, e.g. after a kill -9 of S), or "rank S
// never joined: ..." when S dumped with nothing pending, or "ranks A, B wait for each other in a
// cycle (deadlock): ...". A hang finding reads "rank R never joined OP seq S of group 'G'" ("ranks R1, R2 never joined ...");
// the daemon relies on that phrase to lead a failure's reason with the hung ranks
// (DaemonOptions::analyze_flight).
std::string FlightVerdict(const std::string& dir);

}  // namespace ember

#endif  // EMBER_RUNTIME_FLIGHT_VERDICT_H_
