#!/usr/bin/env bats
# relaybus_complete: a handler completes its delivery inside its own
# transaction (effectively-once), with real sessions: the fence, the lane
# lock against takeovers (both orders, a takeover in progress, REPEATABLE
# READ), the owner's claims and renewals beside it, and the history row.

load test_helper

setup_file() {
  drop_schema
  on_mongo && return 0
  have_pg || return 0
  rb-setup -s h:ev
  q "CREATE TABLE business (event_id text PRIMARY KEY)"
}
teardown_file() { drop_schema; }
setup() {
  pg_only "relaybus_complete is a PostgreSQL function (relaybus(7), MONGODB)"
  need_pg
  q "TRUNCATE relaybus_events, relaybus_deliveries, relaybus_keys, business;
     UPDATE relaybus_lanes SET lease_owner = NULL, lease_expires_at = NULL, in_flight = '{}'"
  if [ "$(q "SELECT to_regclass('relaybus_completions') IS NOT NULL")" = t ]; then q "TRUNCATE relaybus_completions"; fi
}

# (claims beside an open session run under a timeout: one that waits for a
# lock it must not wait for fails the test instead of hanging it)
publish() { for id in "$@"; do printf '{"id":"%s","name":"ev","payload":{"n":1}}\n' "$id"; done | rb-publish -q; }

# The handler's transaction, in one psql: the business write, then
# relaybus_complete with the three fields of the delivery line, then
# COMMIT.  Prints what relaybus_complete returned.
handle() {  # line
  sql -v line="$1" <<'SQL'
BEGIN;
INSERT INTO business SELECT :'line'::jsonb->>'event_id';
SELECT relaybus_complete(l->>'lease', l->>'event_id', l->>'handler') FROM (SELECT :'line'::jsonb AS l) x;
COMMIT;
SQL
}

# A session held open in the background (application_name NAME): SQL in
# with `say NAME SQL`, everything it prints in $BATS_TEST_TMPDIR/NAME.out,
# readable once `bye NAME` has ended it.
open_session() {  # name [psql args]
  local n=$1
  shift
  mkfifo "$BATS_TEST_TMPDIR/$n.fifo"
  # (without the other sessions' ends of their fifos: each must see its EOF)
  (for v in ${!fd_@}; do eval "exec ${!v}>&-"; done
   PGAPPNAME=$n sql -v VERBOSITY=verbose "$@" <"$BATS_TEST_TMPDIR/$n.fifo" >"$BATS_TEST_TMPDIR/$n.out" 2>&1) 3>&- &
  eval "pid_$n=\$!"
  eval "exec {fd_$n}>\"\$BATS_TEST_TMPDIR/\$n.fifo\""
}
say() { local fd="fd_$1"; echo "$2" >&"${!fd}"; }
bye() { local fd="fd_$1" pid="pid_$1"; eval "exec ${!fd}>&-"; wait "${!pid}" || true; }
# wait until session NAME is in STATE (pg_stat_activity.state, or "Lock":
# waiting for a lock)
await() {  # name state
  local cond="state = '$2'"
  [ "$2" = Lock ] && cond="wait_event_type = 'Lock'"
  for _ in $(seq 1 100); do
    [ "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = '$1' AND $cond")" = 1 ] && return 0
    sleep 0.1
  done
  echo "session $1 never got to $2" >&2
  return 1
}

@test "relaybus_complete in the handler's transaction: completed, the delivery gone, the business row there; the lane row only read" {
  publish e1
  line=$(rb-claim -H h --owner A)
  id=$(jq -r .delivery_id <<<"$line")
  lane=$(jq -r .lane <<<"$line")
  lane_before=$(q "SELECT epoch || ' ' || lease_owner || ' ' || in_flight::text FROM relaybus_lanes WHERE handler = 'h' AND lane = $lane")
  open_session listener
  say listener "LISTEN relaybus_$RB_SCHEMA;"
  await listener idle
  run handle "$line"
  [ "$status" -eq 0 ]
  [ "$output" = completed ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 0 ]
  [ "$(q "SELECT string_agg(event_id, ',') FROM business")" = e1 ]
  # no history table: nothing else written
  [ "$(q "SELECT to_regclass('relaybus_completions') IS NULL")" = t ]
  # the lane row is not written: same epoch, owner, and the id still in flight
  [ "$(q "SELECT epoch || ' ' || lease_owner || ' ' || in_flight::text FROM relaybus_lanes WHERE handler = 'h' AND lane = $lane")" = "$lane_before" ]
  [[ $lane_before == *"{$id}" ]]
  # and no notification was sent
  say listener "SELECT 'after';"
  bye listener
  grep -q after "$BATS_TEST_TMPDIR/listener.out"
  ! grep -qi notification "$BATS_TEST_TMPDIR/listener.out" || false
  # the owner's next claim (as the holder that claimed it, as rb-claim
  # would in one run: another rb-claim is another holder) finds it gone and
  # hands the lane back
  h=$(q "SELECT holder FROM relaybus_lanes WHERE handler = 'h' AND lane = $lane")
  [ "$(q "SELECT count(*) FROM relaybus_claim('h', 'A', 10, 30000, 10, NULL::bigint[], true, 1, NULL, $h, false)")" = 0 ]
  [ "$(q "SELECT lease_owner IS NULL AND in_flight = '{}' FROM relaybus_lanes WHERE handler = 'h' AND lane = $lane")" = t ]
}

@test "the delivery line as it comes (jsonb), COMMIT only on completed: completed once, lost the second time" {
  publish r1
  line=$(rb-claim -H h --owner A)
  # (the recipe: COMMIT only when relaybus_complete said completed)
  recipe() {
    sql -v line="$1" <<'SQL'
BEGIN;
INSERT INTO business SELECT :'line'::jsonb->>'event_id' ON CONFLICT DO NOTHING;
SELECT relaybus_complete(:'line') = 'completed' AS done \gset
\if :done
  COMMIT;
\else
  ROLLBACK;
\endif
SELECT :'done';
SQL
  }
  run recipe "$line"
  [ "$output" = t ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 0 ]
  q "DELETE FROM business"
  run recipe "$line"
  [ "$output" = f ]
  [ "$(q "SELECT count(*) FROM business")" = 0 ]
}

@test "bad arguments: not a lease token (22023), a missing one (22004); nothing changes" {
  publish b1
  line=$(rb-claim -H h --owner A)
  for lease in '' 'x' '1:2' '256:1:0' '1:1:2147483648' '1:9223372036854775808:0' '-1:1:0' ' 1:1:0'; do
    run sql -v VERBOSITY=verbose -c "SELECT relaybus_complete('$lease', 'b1', 'h')"
    [ "$status" -ne 0 ]
    [[ $output == *"22023: relaybus_complete: \"$lease\" is not a lease token (lane:epoch:claims)"* ]]
  done
  run sql -v VERBOSITY=verbose -c "SELECT relaybus_complete(NULL, 'b1', 'h')"
  [[ $output == *"22004: relaybus_complete: lease, event_id and handler are required"* ]]
  run sql -v VERBOSITY=verbose -c "SELECT relaybus_complete('{\"event_id\":\"b1\",\"handler\":\"h\"}'::jsonb)"
  [[ $output == *"22004"* ]]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 1 ]
  # another handler's name or event id with this lease: lost
  [ "$(q "SELECT relaybus_complete('$(jq -r .lease <<<"$line")', 'b2', 'h')")" = lost ]
  [ "$(q "SELECT relaybus_complete('$(jq -r .lease <<<"$line")', 'b1', 'other')")" = lost ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 1 ]
}

@test "history on: the row has the attempt count the dispatcher's completion writes" {
  rb-setup --completion-history
  publish g1 g2
  rb-claim -H h --owner A --batch 2 | jq -c '. + {ok: false, error: "once", retry_ms: 0}' | rb-complete -q >/dev/null
  rb-claim -H h --owner A --batch 2 >"$BATS_TEST_TMPDIR/c"
  [ "$(jq -r .attempt "$BATS_TEST_TMPDIR/c" | sort -u)" = 2 ]
  # g1 through rb-complete, g2 through relaybus_complete
  jq -c 'select(.event_id == "g1") | . + {ok: true}' "$BATS_TEST_TMPDIR/c" | rb-complete -q >/dev/null
  run handle "$(jq -c 'select(.event_id == "g2")' "$BATS_TEST_TMPDIR/c")"
  [ "$output" = completed ]
  [ "$(q "SELECT string_agg(event_id || ':' || handler || ':' || attempts, ' ' ORDER BY event_id) FROM relaybus_completions")" = "g1:h:2 g2:h:2" ]
}

@test "a stale lease after a takeover: lost, and nothing changed (no deletion, no history row)" {
  rb-setup -q --completion-history
  publish s1
  a=$(rb-claim -H h --owner A --lease 300ms)
  sleep 0.4
  b=$(rb-claim -H h --owner B)
  [ "$(jq -r .attempt <<<"$b")" = 2 ]
  before=$(q "SELECT d.attempts || ' ' || d.claims || ' ' || d.status || ' ' || l.epoch || ' ' || l.lease_owner || ' ' || l.in_flight::text
                FROM relaybus_deliveries d JOIN relaybus_lanes l ON l.handler = d.handler AND l.lane = d.lane")
  # (the handler's writes commit here too: relaybus_complete's own effect is what is checked)
  run handle "$a"
  [ "$output" = lost ]
  [ "$(q "SELECT d.attempts || ' ' || d.claims || ' ' || d.status || ' ' || l.epoch || ' ' || l.lease_owner || ' ' || l.in_flight::text
            FROM relaybus_deliveries d JOIN relaybus_lanes l ON l.handler = d.handler AND l.lane = d.lane")" = "$before" ]
  [ "$(q "SELECT count(*) FROM relaybus_completions")" = 0 ]
  q "DELETE FROM business"
  run handle "$b"
  [ "$output" = completed ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 0 ]
}

@test "a completion racing a takeover, completion first: the takeover passes the lane over until the commit, then finds nothing" {
  rb-setup -q --completion-history
  publish c1
  a=$(rb-claim -H h --owner A --lease 500ms)
  open_session s1 -v line="$a"
  say s1 "BEGIN; INSERT INTO business VALUES ('c1');
          SELECT relaybus_complete(l->>'lease', l->>'event_id', l->>'handler') FROM (SELECT :'line'::jsonb AS l) x;"
  await s1 'idle in transaction'
  sleep 0.6
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE lease_owner = 'A' AND lease_expires_at < now()")" = 1 ]
  # expired, but locked by the handler's transaction: B gets nothing
  run timeout -s KILL 20 rb-claim -H h --owner B
  [ "$status" -eq 1 ]
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE lease_owner = 'B'")" = 0 ]
  say s1 "COMMIT;"
  bye s1
  grep -qx completed "$BATS_TEST_TMPDIR/s1.out"
  run timeout -s KILL 20 rb-claim -H h --owner B
  [ "$status" -eq 1 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 0 ]
  [ "$(q "SELECT count(*) FROM business WHERE event_id = 'c1'")" = 1 ]
  [ "$(q "SELECT count(*) FROM relaybus_completions WHERE event_id = 'c1'")" = 1 ]
}

@test "a completion racing a takeover, the handler rolls back: the takeover then wins, the late completion is lost" {
  rb-setup -q --completion-history
  publish c2
  a=$(rb-claim -H h --owner A --lease 500ms)
  open_session s1 -v line="$a"
  say s1 "BEGIN; INSERT INTO business VALUES ('c2');
          SELECT relaybus_complete(l->>'lease', l->>'event_id', l->>'handler') FROM (SELECT :'line'::jsonb AS l) x;"
  await s1 'idle in transaction'
  sleep 0.6
  run timeout -s KILL 20 rb-claim -H h --owner B
  [ "$status" -eq 1 ]
  say s1 "ROLLBACK;"
  bye s1
  run timeout -s KILL 20 rb-claim -H h --owner B
  [ "$status" -eq 0 ]
  [ "$(jq -r '.event_id + " " + (.attempt|tostring)' <<<"$output")" = "c2 2" ]
  b=$output
  run handle "$a"
  [ "$output" = lost ]
  q "DELETE FROM business"
  run handle "$b"
  [ "$output" = completed ]
  [ "$(q "SELECT count(*) FROM business WHERE event_id = 'c2'")" = 1 ]
  [ "$(q "SELECT string_agg(event_id || ':' || attempts, ',') FROM relaybus_completions")" = c2:2 ]
}

@test "a takeover in progress: the handler's completion waits for it, then is lost" {
  publish c3
  a=$(rb-claim -H h --owner A --lease 300ms)
  sleep 0.4
  # B's claim, held open: it has the lane FOR UPDATE
  open_session takeover
  say takeover "BEGIN; SELECT count(*) FROM relaybus_claim('h', 'B', 10, 30000, 10);"
  await takeover 'idle in transaction'
  open_session s1 -v line="$a"
  say s1 "BEGIN; INSERT INTO business VALUES ('c3');
          SELECT relaybus_complete(l->>'lease', l->>'event_id', l->>'handler') FROM (SELECT :'line'::jsonb AS l) x;
          COMMIT;"
  await s1 Lock
  say takeover "COMMIT;"
  bye takeover
  bye s1
  grep -qx lost "$BATS_TEST_TMPDIR/s1.out"
  [ "$(q "SELECT d.attempts || ' ' || l.lease_owner FROM relaybus_deliveries d JOIN relaybus_lanes l ON l.handler = d.handler AND l.lane = d.lane")" = "1 B" ]
}

@test "REPEATABLE READ: a takeover after the snapshot fails the completion with 40001; the owner's renewal does not" {
  publish rr1 rr2
  # a renewal committed after the snapshot: the lock is taken, completed
  a=$(rb-claim -H h --owner A --lease 5s --batch 1)
  open_session s1 -v line="$a"
  say s1 "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM business;"
  await s1 'idle in transaction'
  # (the holder of A's lanes: the rb-claim that took them)
  [ "$(q "SELECT relaybus_extend('h', 'A', 5000, (SELECT max(holder) FROM relaybus_lanes WHERE handler = 'h' AND lease_owner = 'A'))")" -ge 1 ]
  say s1 "INSERT INTO business SELECT :'line'::jsonb->>'event_id';
          SELECT relaybus_complete(:'line'); COMMIT;"
  bye s1
  grep -qx completed "$BATS_TEST_TMPDIR/s1.out"
  # a takeover committed after the snapshot: serialization failure
  q "UPDATE relaybus_lanes SET lease_owner = NULL, lease_expires_at = NULL, in_flight = '{}'"
  a=$(rb-claim -H h --owner A --lease 300ms --batch 1)
  ev=$(jq -r .event_id <<<"$a")
  open_session s2 -v line="$a"
  say s2 "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM business;"
  await s2 'idle in transaction'
  sleep 0.4
  b=$(rb-claim -H h --owner B)
  [ "$(jq -r .event_id <<<"$b")" = "$ev" ]
  say s2 "INSERT INTO business SELECT :'line'::jsonb->>'event_id';
          SELECT relaybus_complete(:'line');"
  bye s2
  grep -q "40001: could not serialize access due to concurrent update" "$BATS_TEST_TMPDIR/s2.out"
  ! grep -qx completed "$BATS_TEST_TMPDIR/s2.out" || false
  [ "$(q "SELECT count(*) FROM business WHERE event_id = '$ev'")" = 0 ]
  [ "$(q "SELECT d.attempts || ' ' || l.lease_owner FROM relaybus_deliveries d JOIN relaybus_lanes l ON l.handler = d.handler AND l.lane = d.lane WHERE d.event_id = '$ev'")" = "1 B" ]
  # retried in a new transaction: lost
  [ "$(q "SELECT relaybus_complete('$(jq -r .lease <<<"$a")', '$ev', 'h')")" = lost ]
}

@test "a handler's transaction holding the lane delays a takeover; the owner's claims and renewals go on" {
  # o1 (keyed kk) and kk (unkeyed, its lane from its id) share a lane
  printf '%s\n' '{"id":"o1","name":"ev","key":"kk","payload":1}' | rb-publish -q
  a=$(rb-claim -H h --owner A --lease 1s)
  lane=$(jq -r .lane <<<"$a")
  open_session s1 -v line="$a"
  say s1 "BEGIN; INSERT INTO business VALUES ('o1'); SELECT relaybus_complete(:'line');"
  await s1 'idle in transaction'
  publish kk
  # the owner (the holder that claimed o1: another rb-claim is another
  # holder) claims more on that lane, and renews, without waiting
  h=$(q "SELECT holder FROM relaybus_lanes WHERE handler = 'h' AND lane = $lane")
  run timeout -s KILL 20 psql "$RELAYBUS_URL" -X -A -t -q -c "SELECT event_id || ' ' || lane FROM \"$RB_SCHEMA\".relaybus_claim('h', 'A', 10, 1000, 10, NULL::bigint[], true, 1, NULL, $h, false)"
  [ "$status" -eq 0 ]
  [ "$output" = "kk $lane" ]
  run timeout -s KILL 20 psql "$RELAYBUS_URL" -X -A -t -q -c "SELECT \"$RB_SCHEMA\".relaybus_extend('h', 'A', 1000, $h)"
  [ "$status" -eq 0 ]
  [ "$output" -ge 1 ]
  sleep 1.2
  # expired, but the lane is locked: the takeover passes it over
  run timeout -s KILL 20 rb-claim -H h --owner B
  [ "$status" -eq 1 ]
  say s1 "COMMIT;"
  bye s1
  grep -qx completed "$BATS_TEST_TMPDIR/s1.out"
  # now B takes the lane over: kk (A's, never completed) runs again, o1 does not
  run timeout -s KILL 20 rb-claim -H h --owner B
  [ "$status" -eq 0 ]
  [ "$(jq -r '.event_id + " " + (.attempt|tostring)' <<<"$output")" = "kk 2" ]
  [ "$(q "SELECT string_agg(event_id, ',') FROM business")" = o1 ]
}

@test "the --exec recipe of relaybus(7), run by rb-dispatch configured by RELAYBUS_URL alone: each effect once, every delivery completed by its handler (exit 80), none lost" {
  q "CREATE TABLE IF NOT EXISTS mailed (order_id text PRIMARY KEY); TRUNCATE mailed"
  # the recipe as the page prints it (\e is a backslash in mdoc), the file mark-mailed
  sed -n '/^#!\/bin\/sh$/,/^exit 1$/p' "$RB_SRCDIR/man/relaybus.7" | sed 's/\\e/\\/g' >"$BATS_TEST_TMPDIR/mark-mailed"
  chmod +x "$BATS_TEST_TMPDIR/mark-mailed"
  grep -q 'relaybus_complete(:' "$BATS_TEST_TMPDIR/mark-mailed"
  grep -qx '# mark-mailed: records the mail, completes the delivery, exits 80' "$BATS_TEST_TMPDIR/mark-mailed"
  for i in 1 2 3 4 5; do printf '{"id":"x%d","name":"ev","payload":{"order":"o%d"}}\n' "$i" "$i"; done | rb-publish -q
  # the dispatcher has RELAYBUS_URL and no PG* variable; the handler gets
  # MAILER_URL (relaybus_complete on its search path), as the page says
  run --separate-stderr env -u PGHOST -u PGPORT -u PGUSER -u PGDATABASE MAILER_URL="$RELAYBUS_URL" \
    PGOPTIONS="-c search_path=$RB_SCHEMA -c client_min_messages=warning" \
    rb-dispatch -v -H h --exec "$BATS_TEST_TMPDIR/mark-mailed" --drain
  [ "$status" -eq 0 ]
  [ "$(q "SELECT string_agg(order_id, ',' ORDER BY order_id) FROM mailed")" = o1,o2,o3,o4,o5 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 0 ]
  # exit 80: rb-dispatch knows the handler completed each one (not lost)
  [[ $stderr == *"5 claimed, 5 completed, 0 failed and rescheduled, 0 dead, 0 released, 0 lost, 5 completed by the handler"* ]] || { echo "$stderr"; false; }
}
