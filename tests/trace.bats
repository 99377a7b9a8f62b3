#!/usr/bin/env bats
# Trace context (W3C traceparent, relaybus(7) TRACE CONTEXT): a traceparent
# and tracestate in an event's headers reach the handler, in the delivery
# line and, for an --exec handler, as TRACEPARENT and TRACESTATE in its
# environment; an invalid one, or one rb-dispatch inherited, does not;
# rb-publish --trace gives each event without one a new one, and keeps the
# rest of the line as written.

load test_helper

setup() { fresh_schema; }

teardown() { kill_pids_drop_schema; }

TP=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01

# run every delivery of handler tr through an --exec handler that records
# its id, TRACEPARENT and TRACESTATE: one line each in $OUT
run_exec() {
  OUT=$BATS_TEST_TMPDIR/seen
  : >"$OUT"
  rb-dispatch -q -H tr --concurrency 1 --drain \
    --exec "id=\$(jq -r .event_id); printf '%s|%s|%s|%s\n' \"\$id\" \"\${TRACEPARENT-unset}\" \"\${TRACESTATE-unset}\" >>'$OUT'"
}

seen() { grep "^$1|" "$OUT" | cut -d'|' -f2-3; }

@test "--exec: the event's traceparent and tracestate as TRACEPARENT and TRACESTATE; none for an event without or with an invalid one, even if rb-dispatch has them" {
  need_pg
  rb-setup -s 'tr:t.*'
  {
    printf '{"id":"t1","name":"t.x","headers":{"traceparent":"%s","tracestate":"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"},"payload":{}}\n' "$TP"
    printf '{"id":"t2","name":"t.x","headers":{"Traceparent":"%s"},"payload":{}}\n' "$TP"
    printf '{"id":"t3","name":"t.x","payload":{}}\n'
    # invalid: upper-case hex, an all-zero trace id, too short, version ff, not a string
    printf '{"id":"t4","name":"t.x","headers":{"traceparent":"00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01"},"payload":{}}\n'
    printf '{"id":"t5","name":"t.x","headers":{"traceparent":"00-00000000000000000000000000000000-b7ad6b7169203331-01"},"payload":{}}\n'
    printf '{"id":"t6","name":"t.x","headers":{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b71-01"},"payload":{}}\n'
    printf '{"id":"t7","name":"t.x","headers":{"traceparent":"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},"payload":{}}\n'
    printf '{"id":"t8","name":"t.x","headers":{"traceparent":42,"tracestate":"a=b"},"payload":{}}\n'
  } | rb-publish -q
  # rb-dispatch itself runs inside some other trace: that one is not passed on
  TRACEPARENT=00-11111111111111111111111111111111-2222222222222222-01 TRACESTATE=x=y run_exec
  [ "$(wc -l <"$OUT")" = 8 ]
  [ "$(seen t1)" = "$TP|rojo=00f067aa0ba902b7,congo=t61rcWkgMzE" ]
  [ "$(seen t2)" = "$TP|unset" ]
  local i
  for i in 3 4 5 6 7 8; do
    [ "$(seen t$i)" = "unset|unset" ] || { echo "t$i: $(seen t$i)" >&2; false; }
  done
}

@test "the delivery line carries the headers as published: an rb-claim or --pipe handler reads traceparent there" {
  need_pg
  rb-setup -s 'tr:t.*'
  printf '{"id":"p1","name":"t.x","headers":{"traceparent":"%s","tracestate":"a=b"},"payload":{}}\n' "$TP" | rb-publish -q
  run --separate-stderr rb-claim -H tr
  [ "$status" -eq 0 ]
  [ "$(jq -r '.headers.traceparent, .headers.tracestate' <<<"$output" | paste -sd' ')" = "$TP a=b" ]
}

@test "rb-publish --trace: a new valid traceparent for each event without one, kept where there is one; the rest of the line as written; handlers get it" {
  need_pg
  rb-setup -s 'tr:t.*'
  {
    printf '{"id":"g1","name":"t.x","payload":{"amount":1.50}}\n'
    printf '{"id":"g2","name":"t.x","headers":{"k":"v"},"payload":{}}\n'
    printf '{"id":"g3","name":"t.x","headers":{"traceparent":"%s"},"payload":{}}\n' "$TP"
    printf '{"event_id":"g4","name":"t.x","headers":null,"payload":{}}\n'
  } | rb-publish -q --trace
  run --separate-stderr rb-claim -H tr --batch 10
  [ "$status" -eq 0 ]
  local re='^00-[0-9a-f]{32}-[0-9a-f]{16}-01$' g1 g2 g4
  g1=$(jq -r 'select(.event_id == "g1") | .headers.traceparent' <<<"$output")
  g2=$(jq -r 'select(.event_id == "g2") | .headers.traceparent' <<<"$output")
  g4=$(jq -r 'select(.event_id == "g4") | .headers.traceparent' <<<"$output")
  [[ "$g1" =~ $re ]] && [[ "$g2" =~ $re ]] && [[ "$g4" =~ $re ]]
  # each its own trace
  [ "$(printf '%s\n' "${g1:3:32}" "${g2:3:32}" "${g4:3:32}" | sort -u | wc -l)" = 3 ]
  [ "$(jq -r 'select(.event_id == "g3") | .headers.traceparent' <<<"$output")" = "$TP" ]
  [ "$(jq -r 'select(.event_id == "g2") | .headers.k' <<<"$output")" = v ]
  # the payload's numbers kept their spelling (the line was not printed
  # again; PostgreSQL's jsonb keeps 1.50, MongoDB's BSON double does not)
  on_mongo || grep -q '"payload":{"amount":1.50}' <<<"$output"
  # without --trace: nothing added
  printf '{"id":"n1","name":"t.x","payload":{}}\n' | rb-publish -q
  rb-admin show n1 | jq -e '.headers == {} or .headers == null' >/dev/null
}
