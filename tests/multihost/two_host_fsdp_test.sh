#!/usr/bin/env bash
# Issue 20: a 2-host x 2-rank FSDP job of the real ember-worker (tiny GPT, deterministic) across
# two network namespaces trains to the same per-step losses as the same job as 4 ranks on one host
# (emberctl run --standalone, loopback + shared memory), within 1e-5 relative; the ranks are placed
# on both hosts, and the ranks across them move their data over TCP between the hosts' addresses
# (ss byte counts of ember-worker sockets host1 <-> host2). Needs root: skips otherwise.
# A 6th argument is a qdisc for every link (netns.sh mh_qdisc: "netem delay 5ms loss 1%" is a 10 ms
# RTT and 1% loss each way, the kernel's netem or else userspace nfq_netem; "tbf rate 100mbit ..."
# a rate limit); the same losses are required, and the two-host tokens/s is printed. With netem
# the ping RTT host1 -> host2 must be at least the two delays, and the packets the emulation
# dropped and the TCP retransmits are printed; nfq_netem's counts must show the job's traffic
# delayed and about the asked loss dropped, and its iptables rules gone after it stops.
set -u
source "$(dirname "$0")/netns.sh"
NETEM="${6:-}"
mh_init 2 mh "$@"
[ -n "$NETEM" ] && mh_qdisc $NETEM
if [ "${MH_NETEM_DELAY_MS:-0}" != 0 ]; then
  if command -v ping >/dev/null; then
    # -U: user-to-user time (nfq_netem holds arrivals after the kernel stamped them).
    PING=$(mh_exec 1 ping -U -c 20 -i 0.05 -q "$(mh_ip 2)" | tail -2 | tr '\n' ' ')
    echo "ping host1 -> host2: $PING"
    RTT_MIN=$(echo "$PING" | sed -n 's|.*= \([0-9.]*\)/.*|\1|p')
    awk -v r="${RTT_MIN:-0}" -v d="$MH_NETEM_DELAY_MS" 'BEGIN { exit !(r >= 2 * d * 0.95) }' \
      || fail "ping RTT min ${RTT_MIN:-none} ms, want >= 2 x ${MH_NETEM_DELAY_MS} ms"
  else
    echo "no ping on PATH (iputils-ping): the RTT is not measured"
  fi
fi

STEPS=30
mh_spec mh-fsdp "$STEPS" "" > "$T/one.yaml"
mh_spec mh-fsdp "$STEPS" ", nodes: 2" > "$T/two.yaml"

# One host: 4 ranks, loopback, shared memory.
timeout 60 "$MH_EMBERCTL" run --standalone --nproc 4 --worker "$WORKER" --work-root "$T/ref" \
  "$T/one.yaml" > "$T/ref.out" 2>&1 || { tail -20 "$T/ref.out"; fail "one-host run"; }
REF=$(find "$T/ref" -path '*/metrics/rank-0.jsonl' | head -1)
[ -n "$REF" ] || fail "one-host run wrote no metrics/rank-0.jsonl"

# Two hosts.
mh_cluster "$STORE" "$EMBERD" "$WORKER" "$T"
for _ in $(seq 100); do
  [ "$(mh_ctl 1 --output json nodes 2>/dev/null | grep -c '"name"')" -ge 2 ] && break
  sleep 0.1
done
# Sample host1's TCP connections to host2 (cumulative byte counts) while the job runs.
( while :; do mh_exec 1 ss -tnpiH state established dst "$(mh_ip 2)" 2>/dev/null; sleep 0.1; done ) \
  > "$T/ss.out" &
SAMPLER=$!
MH_PIDS="$MH_PIDS $SAMPLER"
timeout 90 ip netns exec "${MH}-1" env EMBER_ADDRESS="$MH_API" EMBER_TOKEN_FILE="$MH_TOKEN" \
  "$MH_EMBERCTL" submit "$T/two.yaml" --follow > "$T/follow.out" 2>&1
rc=$?
kill -KILL "$SAMPLER" 2>/dev/null
grep -q SUCCEEDED "$T/follow.out" || {
  tail -30 "$T/follow.out" "$T"/host*.log; cat "$T"/jobs/*/logs/rank-*.log 2>/dev/null | tail -40
  fail "two-host job did not succeed (rc $rc)"; }
JOB=$(head -1 "$T/follow.out" | awk '{print $1}')
STATUS=$(mh_ctl 1 --output json status "$JOB")
echo "$STATUS" | grep -q '"host1"' && echo "$STATUS" | grep -q '"host2"' \
  || fail "the job is not placed on both hosts: $STATUS"
for i in 1 2; do
  grep -q "EMBER_COMM_BOOT_ID" "$T/worker-host$i.sh" || fail "worker wrapper $i"
done
# Cross-host pairs moved their data over TCP between the hosts' addresses: the bootstrap dials TCP
# to every peer even where shm then carries the data, so count bytes, not connections. Per
# connection (host1 address:port -> host2 address:port) the largest sampled bytes_sent +
# bytes_received; the 30 steps' all-gathers and reduce-scatters across the hosts are megabytes,
# the bootstrap alone a few kilobytes.
XBYTES=$(awk -v a="$(mh_ip 1)" -v b="$(mh_ip 2)" '
  $0 ~ "ember-worker" && index($0, a ":") && index($0, b ":") { key = $4 " " $5; next }
  key != "" { s = 0; r = 0
    if (match($0, /bytes_sent:[0-9]+/)) s = substr($0, RSTART + 11, RLENGTH - 11)
    if (match($0, /bytes_received:[0-9]+/)) r = substr($0, RSTART + 15, RLENGTH - 15)
    if (s + r > best[key]) best[key] = s + r; key = "" }
  END { t = 0; for (k in best) t += best[k]; print t + 0 }' "$T/ss.out")
echo "ember-worker TCP bytes host1 <-> host2: $XBYTES"
[ "$XBYTES" -gt 1000000 ] || { head -20 "$T/ss.out"; fail "cross-host ranks did not move their data over TCP ($XBYTES bytes)"; }

if [ "$MH_NETEM_USER" = 1 ]; then
  # nfq_netem held the job's packets and dropped about the asked fraction; its rules are gone.
  mh_netem_stop | tee "$T/netem.counts"
  for i in $(seq 0 2); do
    [ "$(mh_exec "$i" iptables-save | grep -c NFQUEUE)" = 0 ] || fail "ns $i: NFQUEUE rule left after nfq_netem stopped"
  done
  awk -v p="$MH_NETEM_LOSS" '
    { for (f = 1; f < NF; f++) { if ($(f + 1) ~ /^packets,?$/) n[$2] = $f; if ($(f + 1) == "delayed,") d[$2] = $f
                                 if ($(f + 1) == "dropped") l[$2] = $f } }
    END { for (k in n) { tn += n[k]; tl += l[k] }
          if (d["1:"] < 1000) { print "host1 delayed " d["1:"] + 0 " packets, want > 1000"; exit 1 }
          if (p > 0 && (tn < 2000 || tl < tn * p / 2 || tl > tn * p * 2)) {
            print "dropped " tl + 0 " of " tn + 0 " packets, want about " p * 100 "%"; exit 1 }
          printf "nfq_netem: %d packets, %d dropped (%.2f%%) over all links\n", tn, tl, tn ? 100 * tl / tn : 0 }' \
    "$T/netem.counts" || fail "nfq_netem did not delay and drop the job's traffic as asked"
elif [ -n "$NETEM" ]; then
  # The traffic went through the qdisc (and a rate limit actually held packets back).
  QS=$(mh_exec 1 tc -s qdisc show dev eth0 | tr '\n' ' ')
  echo "host1 eth0: $QS"
  SENT=$(echo "$QS" | sed -n 's/.*Sent \([0-9]*\) bytes.*/\1/p')
  [ "${SENT:-0}" -gt 1000000 ] || fail "host1's qdisc sent ${SENT:-0} bytes, want > 1 MB"
  case "$NETEM" in tbf*)
    OVER=$(echo "$QS" | sed -n 's/.*overlimits \([0-9]*\).*/\1/p')
    [ "${OVER:-0}" -gt 0 ] || fail "tbf never held a packet back (overlimits ${OVER:-0})" ;;
  esac
fi
for i in 1 2; do
  echo "host$i TCP: $(mh_exec "$i" nstat -asz TcpOutSegs TcpRetransSegs 2>/dev/null | awk 'NR > 1 { printf "%s %s ", $1, $2 }')"
done
TWO=$(find "$T/jobs" -path "*/$JOB/metrics/rank-0.jsonl" | head -1)
[ -n "$TWO" ] || fail "two-host run wrote no metrics/rank-0.jsonl"
mh_losses "$REF" > "$T/ref.losses"
mh_losses "$TWO" > "$T/two.losses"
[ "$(wc -l < "$T/ref.losses")" -eq "$STEPS" ] || fail "one-host run logged $(wc -l < "$T/ref.losses") steps, want $STEPS"
[ "$(wc -l < "$T/two.losses")" -eq "$STEPS" ] || fail "two-host run logged $(wc -l < "$T/two.losses") steps, want $STEPS"
paste "$T/ref.losses" "$T/two.losses" | awk '
  { if ($1 != $3) { print "step mismatch: " $0; bad = 1; next }
    d = $2 - $4; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2;
    if (d > 1e-5 * m) { print "step " $1 ": one host " $2 ", two hosts " $4; bad = 1 }
    if ($2 == $4) same++ }
  END { print "losses: " NR " steps, " same+0 " bitwise equal"; exit bad }' \
  || fail "losses differ between one host and two hosts"
TPS=$(sed -n 's/.*"tokens_per_s":\([^,]*\),.*/\1/p' "$TWO" | awk '{ s += $1 } END { printf "%.0f", s / NR }')
REF_TPS=$(sed -n 's/.*"tokens_per_s":\([^,]*\),.*/\1/p' "$REF" | awk '{ s += $1 } END { printf "%.0f", s / NR }')
echo "PASS: $JOB on host1+host2 over TCP${NETEM:+ with qdisc $NETEM}, losses as on one host;" \
  "mean tokens/s (rank 0): two hosts $TPS, one host $REF_TPS"
