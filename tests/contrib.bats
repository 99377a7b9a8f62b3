#!/usr/bin/env bats
# contrib/prometheus: the alerting rules load (promtool check rules) and
# do what their unit tests say (promtool test rules); contrib/grafana:
# the dashboard is valid JSON whose every query is valid PromQL; and every
# metric the rules and the dashboard name is one the programs really write
# (rb-admin stats --prometheus, rb-dispatch --metrics-file, run here).

load test_helper

setup() { fresh_schema; }

teardown() { kill_pids_drop_schema; }

need_promtool() { command -v promtool >/dev/null || skip "no promtool (Debian: prometheus)"; }

RULES=$RB_SRCDIR/contrib/prometheus
DASH=$RB_SRCDIR/contrib/grafana/relaybus.json

@test "contrib/prometheus/relaybus.rules.yml: promtool check rules, and promtool test rules on its unit tests" {
  need_promtool
  run promtool check rules "$RULES/relaybus.rules.yml"
  echo "$output"
  [ "$status" -eq 0 ]
  [[ "$output" == *"SUCCESS: 5 rules found"* ]]
  # the five alerts the README names
  local a
  for a in RelaybusDown RelaybusDispatcherDisconnected RelaybusBacklogOld RelaybusDeadLettersGrowing RelaybusDispatcherStuck; do
    grep -q "alert: $a\$" "$RULES/relaybus.rules.yml"
    # each has a unit test that expects it to fire
    grep -q "alertname: $a\$" "$RULES/relaybus.rules.test.yml"
  done
  cd "$RULES"
  run promtool test rules relaybus.rules.test.yml
  echo "$output"
  [ "$status" -eq 0 ]
  [[ "$output" == *SUCCESS* ]]
}

@test "contrib/grafana/relaybus.json: valid JSON, a Prometheus data source input, every query valid PromQL (promtool, as recording rules)" {
  need_promtool
  jq -e '.title == "relaybus" and (.panels | length) >= 10' "$DASH" >/dev/null
  jq -e '[.panels[] | .datasource.uid] | all(. == "${DS_PROMETHEUS}")' "$DASH" >/dev/null
  jq -e '.__inputs[0].pluginId == "prometheus"' "$DASH" >/dev/null
  # the dashboard's variables in their concrete form, each query a recording rule
  local r=$BATS_TEST_TMPDIR/dash.rules.yml i=0 e
  printf 'groups:\n  - name: dashboard\n    rules:\n' >"$r"
  while IFS= read -r e; do
    e=${e//\$__rate_interval/5m}
    e=${e//\$handler/.*}
    printf '      - record: dashboard:q%d\n        expr: %s\n' "$i" "$(jq -Rn --arg e "$e" '$e')" >>"$r"
    i=$((i + 1))
  done < <(jq -r '.panels[].targets[].expr' "$DASH")
  [ "$i" -ge 20 ]
  run promtool check rules "$r"
  echo "$output"
  [ "$status" -eq 0 ]
}

@test "every metric the rules and the dashboard name is in what rb-admin stats --prometheus and rb-dispatch --metrics-file write" {
  pg_only "the deliveries table's statistics (relaybus_deliveries_*) are PostgreSQL's"
  need_pg
  # a bus with something of everything: completions, a dead letter, a due delivery
  rb-setup -s 'ch:c.*'
  printf '{"id":"c1","name":"c.ok","payload":{}}\n{"id":"c2","name":"c.bad","payload":{}}\n' | rb-publish -q
  rb-dispatch -q -H ch --max-attempts 1 --exec 'grep -q c.bad && exit 1; exit 0' --drain \
    --metrics-file "$BATS_TEST_TMPDIR/dispatch.prom"
  echo '{"id":"c3","name":"c.ok","payload":{}}' | rb-publish -q
  rb-admin stats --prometheus --output "$BATS_TEST_TMPDIR/stats.prom"
  # the sample names the programs wrote
  cat "$BATS_TEST_TMPDIR"/*.prom | grep -v '^#' | sed 's/[{ ].*//' | sort -u >"$BATS_TEST_TMPDIR/written"
  [ "$(wc -l <"$BATS_TEST_TMPDIR/written")" -ge 25 ]
  # the names the rules and the dashboard use
  { grep '^ *expr:' "$RULES/relaybus.rules.yml" | grep -o 'relaybus_[a-z_]*'
    jq -r '.panels[].targets[].expr, .templating.list[].definition' "$DASH" | grep -o 'relaybus_[a-z_]*'
  } | sort -u >"$BATS_TEST_TMPDIR/used"
  [ "$(wc -l <"$BATS_TEST_TMPDIR/used")" -ge 15 ]
  run comm -23 "$BATS_TEST_TMPDIR/used" "$BATS_TEST_TMPDIR/written"
  echo "named but never written: $output"
  [ -z "$output" ]
  # and the rules' unit tests feed only such series too
  run comm -23 <(grep -o "series: 'relaybus_[a-z_]*" "$RULES/relaybus.rules.test.yml" | sed "s/series: '//" | sort -u) \
    "$BATS_TEST_TMPDIR/written"
  [ -z "$output" ]
}
