#!/usr/bin/env bats
# The EXAMPLES of rb-claim(1), rb-complete(1) and rb-dispatch(1), run as
# the pages print them (issue 39 item 5), in a folder holding the example
# handler they name (examples/send-mail, installed in DOCDIR/examples),
# against a schema of the test's own.  The long-running forms (no
# --drain) are stopped with SIGTERM after their work is done.

load test_helper

setup() {
  fresh_schema
  cd "$BATS_TEST_TMPDIR"
  cp "$RB_SRCDIR/examples/send-mail" .
}
# the application's tables the pages name are in the connection's default
# schema (public), where --sql statements run, not in RELAYBUS_SCHEMA
teardown() {
  q "SET lock_timeout = '30s'; DROP TABLE IF EXISTS public.totals, public.audit" 2>/dev/null || true
  kill_pids_drop_schema
}

# the literal blocks of PAGE's EXAMPLES as files PREFIX1, PREFIX2, ...; the
# roff escapes undone (\e a backslash, \& nothing)
examples() {  # page prefix
  awk -v pfx="$2" '
    /^\.Sh / { inex = ($0 == ".Sh EXAMPLES"); next }
    inex && /^\.Bd -literal/ { n++; f = pfx n; printf "" >f; inblock = 1; next }
    inblock && /^\.Ed/ { inblock = 0; close(f); next }
    inblock { gsub(/\\e/, "\\"); gsub(/\\&/, ""); print >f }' "$RB_SRCDIR/man/$1"
}

orders() {  # n prefix
  for i in $(seq "$1"); do
    printf '{"id":"%s%d","name":"order.paid","payload":{"order":"%s%d","total":%d}}\n' "$2" "$i" "$2" "$i" "$i"
  done | rb-publish -q
}

pending() { q "SELECT count(*) FROM relaybus_deliveries WHERE handler = '$1'"; }

# a long-running example (one command): started, given DUR to do its work,
# stopped by SIGTERM (status 124); one that SIGTERM does not end within a
# minute is killed (137), so the test fails, saying so, instead of waiting
until_stopped() {  # dur file
  timeout -k 60 -s TERM "$1" sh -c "exec $(cat "$2")"
}

@test "rb-claim(1) EXAMPLES, pasted, with examples/send-mail: the cron forms complete every delivery, the --follow form until stopped" {
  need_pg
  examples rb-claim.1 ex
  [ -f ex4 ] && [ ! -e ex5 ]
  grep -q '\./send-mail' ex1
  rb-setup -q -s 'mailer:order.*'
  for n in 1 2 4; do
    orders 3 "c$n-"
    run -0 --separate-stderr bash ex$n
    [ "$(pending mailer)" = 0 ] || { echo "ex$n: $(cat ex$n)"; false; }
  done
  orders 3 c3-
  run -124 --separate-stderr timeout -k 60 -s TERM 5 bash -c "$(cat ex3)"
  [ "$(pending mailer)" = 0 ]
}

@test "rb-complete(1) EXAMPLES, pasted, with examples/send-mail and the totals table the page names" {
  need_pg
  pg_only "--sql runs in PostgreSQL's transaction"
  examples rb-complete.1 ex
  rb-setup -q -s 'mailer:order.*' -s 'stats:order.*'
  q "CREATE TABLE public.totals (day date PRIMARY KEY, n bigint); INSERT INTO public.totals VALUES (current_date, 0)"
  orders 4 d-
  run -0 --separate-stderr bash ex1
  [ "$(pending mailer)" = 0 ]
  run -0 --separate-stderr bash ex2
  [ "$(pending stats)" = 0 ] || { echo "$stderr"; false; }
  [ "$(q 'SELECT n FROM public.totals WHERE day = current_date')" = 4 ]
}

@test "rb-dispatch(1) EXAMPLES, pasted: send-mail over 4 co-processes, the audit table effectively-once" {
  need_pg
  pg_only "--sql runs in PostgreSQL's transaction"
  examples rb-dispatch.1 ex
  grep -q -- '--pipe \./send-mail' ex1
  rb-setup -q -s 'mailer:order.*' -s 'audit:order.*'
  orders 20 e-
  run -124 --separate-stderr until_stopped 4 ex1
  [ "$(pending mailer)" = 0 ]
  q 'CREATE TABLE public.audit (event_id text PRIMARY KEY, body jsonb)'
  run -124 --separate-stderr until_stopped 4 ex2
  [ "$(pending audit)" = 0 ] || { echo "$stderr"; false; }
  [ "$(q 'SELECT count(*) FROM public.audit')" = 20 ]
  [ "$(q "SELECT body->>'order' FROM public.audit WHERE event_id = 'e-7'")" = e-7 ]
}
