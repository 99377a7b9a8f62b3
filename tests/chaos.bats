#!/usr/bin/env bats
# The chaos suite, short: scripts/chaos (its own PostgreSQL, restarted;
# concurrent publishers; two handlers with two rb-dispatch --pipe each,
# killed with SIGKILL at random; every 7th run of a handler fails), then
# its exactness checks: every (event, handler) handled, nothing
# unexpected, nothing pending, dead or held, attempts only as charged,
# per-key order as relaybus(7) states it for the mode.  The long version
# is the same script with larger numbers (README.md, "Chaos").

load test_helper

setup() {
  need_pg
  pg_only "scripts/chaos runs its own PostgreSQL"
}

@test "chaos: kill -9 of dispatchers, a PostgreSQL restart, injected failures: every event handled, nothing left, keys replayed in order" {
  run -0 "$RB_SRCDIR/scripts/chaos" --events 900 --kills 5 --kill-every 1 --restarts 1 --bindir "$RB_BINDIR"
  echo "$output" | tail -n 3
  [[ "${lines[-1]}" == "chaos: ok: 900 events x 2 handlers, 4 dispatchers, 5 kills, 1 restarts,"* ]]
}

@test "chaos: the same with --strict-order: no key ever goes back" {
  run -0 "$RB_SRCDIR/scripts/chaos" --events 900 --kills 5 --kill-every 1 --restarts 1 --strict --bindir "$RB_BINDIR"
  echo "$output" | tail -n 3
  [[ "${lines[-1]}" == "chaos: ok: 900 events x 2 handlers, 4 dispatchers, 5 kills, 1 restarts, fail every 7, mode --strict-order: "*", 0 keys went back, 0 left, 0 dead, "* ]]
}
