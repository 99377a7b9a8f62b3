#!/usr/bin/env bats
# A reader that goes away (`| head`) is normal in a pipeline: no program
# prints "Broken pipe".  Read-only output ends quietly with 74 (said with
# -v); rb-publish and rb-complete, which stop with input left over, say
# through which line they got (hidden by -q).

load test_helper

setup_file() {
  have_pg || return 0
  rb-setup -s 'pipes:*'
}

teardown_file() { drop_schema; }

# Run a command with its stdout on a pipe whose reader is already gone:
# its first write fails with EPIPE, every time (no race with a reader).
closed_stdout() {
  perl -e 'pipe(my $r, my $w) or die "pipe: $!"; close $r; open(STDOUT, ">&", $w) or die; close $w;
    exec @ARGV or die "exec: $!"' "$@"
}

@test "rb-setup --print-sql into a closed pipe: 74, nothing on stderr; -v says so" {
  run --separate-stderr closed_stdout rb-setup --print-sql
  [ "$status" -eq 74 ]
  [ -z "$stderr" ]
  run --separate-stderr closed_stdout rb-setup -v --print-sql
  [ "$status" -eq 74 ]
  [ "$stderr" = "rb-setup: stdout closed: the script was cut short" ]
}

@test "rb-admin list, lanes and a --table into a closed pipe: 74, nothing on stderr" {
  need_pg
  gen_events 3 pipes.a | rb-publish -q
  for args in "list" "lanes --all" "--table list" "stats"; do
    # shellcheck disable=SC2086
    run --separate-stderr closed_stdout rb-admin $args
    [ "$status" -eq 74 ] || { echo "rb-admin $args: $status"; false; }
    [ -z "$stderr" ] || { echo "rb-admin $args: $stderr"; false; }
  done
  run --separate-stderr closed_stdout rb-admin -v list
  [ "$stderr" = "rb-admin: stdout closed" ]
}

@test "rb-admin list | head -1 over a backlog larger than a pipe's buffer: no Broken pipe" {
  need_pg
  gen_events 3000 pipes.big | sed 's/"id":"e/"id":"big-/' | rb-publish -q
  run bash -c 'rb-admin list | head -1'
  [ "$status" -eq 0 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ "$output" == '{"delivery_id":'* ]]
}

@test "rb-publish -o into a closed pipe: one line through which line it committed, no Broken pipe; -q: none" {
  need_pg
  gen_events 5 pipes.p | sed 's/"id":"e/"id":"p-/' >"$BATS_TEST_TMPDIR/in"
  run --separate-stderr closed_stdout rb-publish -o --batch 2 <"$BATS_TEST_TMPDIR/in"
  [ "$status" -eq 74 ]
  [ "$stderr" = "rb-publish: stdout closed: committed through line 2, the rest not published" ]
  [ "$(q "SELECT count(*) FROM relaybus_events WHERE id LIKE 'p-%'")" = 2 ]
  gen_events 5 pipes.q | sed 's/"id":"e/"id":"q-/' >"$BATS_TEST_TMPDIR/in"
  run --separate-stderr closed_stdout rb-publish -q -o --batch 2 <"$BATS_TEST_TMPDIR/in"
  [ "$status" -eq 74 ]
  [ -z "$stderr" ]
}

@test "rb-complete into a closed pipe: one line through which line it applied, no Broken pipe" {
  need_pg
  gen_events 4 pipes.c | sed 's/"id":"e/"id":"c-/' | rb-publish -q
  rb-claim -q -H pipes --batch 10000 | jq -c '. + {ok: true}' >"$BATS_TEST_TMPDIR/results"
  n=$(wc -l <"$BATS_TEST_TMPDIR/results")
  [ "$n" -gt 0 ]
  run --separate-stderr closed_stdout rb-complete -o --batch 100000 <"$BATS_TEST_TMPDIR/results"
  [ "$status" -eq 74 ]
  [ "$stderr" = "rb-complete: stdout closed: applied through line $n, the rest of the input not read" ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'pipes'")" = 0 ]
}

@test "rb-claim into a closed pipe prints no Broken pipe" {
  need_pg
  gen_events 2 pipes.r | sed 's/"id":"e/"id":"r-/' | rb-publish -q
  run --separate-stderr closed_stdout rb-claim -H pipes
  [ "$status" -ne 0 ]
  [[ "$stderr" != *"Broken pipe"* ]]
}
