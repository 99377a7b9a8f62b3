#!/usr/bin/env bats
# Periodic events, the recipe of relaybus(7) PERIODIC EVENTS: cron (or a
# timer) on several hosts publishes the same event for a period, its id
# made of its name and the period and its payload the period alone, so
# that the inbox dedup makes one delivery per handler and period however
# many hosts publish it.  The recipe's own command line (from the man
# page) is what runs here, as two and as five racing publishers.

load test_helper

setup() { fresh_schema; }

teardown() { kill_pids_drop_schema; }

# the recipe's publishing command, from relaybus(7): the line that pipes
# the printf into rb-publish (with its cron-escaped % unescaped)
recipe() {
  local l
  l=$(grep -m1 "printf '{\"id\":\"report.hourly/" "$RB_SRCDIR/man/relaybus.7")
  l=${l#*app  }
  l=${l//\\e/\\}
  l=${l//\\%/%}
  # (the period as the host computed it: given, not the clock's)
  printf '%s\n' "${l#*; }"
}

@test "the recipe: two hosts publish the same period at once: one event, one delivery per handler; the next period is another" {
  need_pg
  rb-setup -s 'reports:report.*' -s 'audit:*'
  local cmd
  cmd=$(recipe)
  [[ "$cmd" == "printf '{\"id\":\"report.hourly/%s\""*"| rb-publish -q" ]]
  local out=$BATS_TEST_TMPDIR/ran
  : >"$out"
  # host A and host B, the same hour
  p=2026-12-05T16 bash -c "$cmd" & local a=$!
  p=2026-12-05T16 bash -c "$cmd" & local b=$!
  wait "$a"
  wait "$b"
  rb-dispatch -q -H reports --drain --exec "jq -r '.event_id + \" \" + (.payload.period)' >>'$out'"
  rb-dispatch -q -H audit --drain --exec "jq -r '\"audit \" + .event_id' >>'$out'"
  [ "$(sort "$out")" = "audit report.hourly/2026-12-05T16
report.hourly/2026-12-05T16 2026-12-05T16" ]
  # a host late by minutes still computes the same period: nothing more
  p=2026-12-05T16 bash -c "$cmd"
  rb-dispatch -q -H reports --drain --exec "cat >>'$out'"
  [ "$(wc -l <"$out")" = 2 ]
  # the next hour is another event
  p=2026-12-05T17 bash -c "$cmd"
  rb-dispatch -q -H reports --drain --exec "jq -r .event_id >>'$out'"
  [ "$(tail -n 1 "$out")" = report.hourly/2026-12-05T17 ]
}

@test "the recipe: five publishers racing over ten periods: exactly ten deliveries, each period once" {
  need_pg
  rb-setup -s 'reports:report.*'
  local cmd pids= h i
  cmd=$(recipe)
  for h in 1 2 3 4 5; do
    ( for i in 0 1 2 3 4 5 6 7 8 9; do p=2026-12-06T0$i bash -c "$cmd" || exit 1; done ) &
    pids="$pids $!"
  done
  for h in $pids; do wait "$h"; done
  local out=$BATS_TEST_TMPDIR/ran
  rb-dispatch -q -H reports --drain --exec "jq -r .event_id >>'$out'"
  [ "$(wc -l <"$out")" = 10 ]
  [ "$(sort -u "$out" | wc -l)" = 10 ]
}

@test "why the payload holds the period alone: a host that adds its own name is a conflict (exit 81), and its event is not delivered again" {
  pg_only "an id published again with another payload is a conflict (exit 81) on PostgreSQL"
  need_pg
  rb-setup -s 'reports:report.*'
  echo '{"id":"report.hourly/2026-12-05T16","name":"report.hourly","payload":{"period":"2026-12-05T16","host":"a"}}' | rb-publish -q
  run --separate-stderr bash -c \
    "echo '{\"id\":\"report.hourly/2026-12-05T16\",\"name\":\"report.hourly\",\"payload\":{\"period\":\"2026-12-05T16\",\"host\":\"b\"}}' | rb-publish -q"
  [ "$status" -eq 81 ]
  local out=$BATS_TEST_TMPDIR/ran
  rb-dispatch -q -H reports --drain --exec "jq -r .payload.host >>'$out'"
  [ "$(cat "$out")" = a ]
}
