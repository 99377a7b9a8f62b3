#!/usr/bin/env bats
# The README's quickstart, as a newcomer pastes it: every shell block
# between <!-- quickstart --> and <!-- /quickstart --> runs as written, in
# one shell at the top of the tree, against the throwaway PostgreSQL it
# starts itself; every line it shows as "#> ..." must be in the output.
# So a change of a program's output, or of the examples/ handlers it
# uses, cannot leave the README wrong.

load test_helper

setup() {
  pg_only "the quickstart is PostgreSQL's"
  QS_TMP=$(mktemp -d /tmp/rb-readme.XXXXXX)
  chmod 755 "$QS_TMP"
}
teardown() {
  "$RB_SRCDIR/scripts/pg-tmp" stop "$QS_TMP/relaybus-quickstart" >/dev/null 2>&1 || true
  rm -rf "$QS_TMP"
}

# the blocks, in order, as one script
quickstart() {
  awk '/^<!-- quickstart -->$/ { on = 1; next } /^<!-- \/quickstart -->$/ { on = 0 }
       on && /^```sh$/ { code = 1; next } on && /^```$/ { code = 0; next } on && code' "$RB_SRCDIR/README.md"
}

@test "README: the quickstart runs as pasted and prints every line it shows" {
  quickstart >"$QS_TMP/quickstart.sh"
  [ "$(grep -c . "$QS_TMP/quickstart.sh")" -gt 10 ]
  grep '^#> ' "$QS_TMP/quickstart.sh" | sed 's/^#> //' >"$QS_TMP/expected"
  [ "$(wc -l <"$QS_TMP/expected")" -gt 5 ]
  cd "$RB_SRCDIR"
  run env TMPDIR="$QS_TMP" bash -e -o pipefail "$QS_TMP/quickstart.sh"
  echo "$output"
  [ "$status" -eq 0 ]
  while IFS= read -r want; do
    grep -qxF -- "$want" <<<"$output" || { echo "missing: $want"; false; }
  done <"$QS_TMP/expected"
  # it stopped the server it started
  ! "$RB_SRCDIR/scripts/pg-tmp" status "$QS_TMP/relaybus-quickstart"
}

@test "README: under 250 lines, and its two set-up commands are the ones that exist" {
  [ "$(wc -l <"$RB_SRCDIR/README.md")" -lt 250 ]
  grep -q '^    scripts/demo ' "$RB_SRCDIR/README.md"
  grep -q '^    scripts/test ' "$RB_SRCDIR/README.md"
  [ -x "$RB_SRCDIR/scripts/demo" ] && [ -x "$RB_SRCDIR/scripts/test" ]
  grep -q 'scripts/test' "$RB_SRCDIR/.ci/run"
}
