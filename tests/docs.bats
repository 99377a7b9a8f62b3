#!/usr/bin/env bats
# The documentation stays honest: every long option of a program's --help is
# in its man page and every option in the page is in --help; pages lint clean.

load test_helper

programs() {
  for p in "$RB_BINDIR"/rb-*; do
    [ -x "$p" ] && [ "${p%.c}" = "$p" ] && [ "${p%.o}" = "$p" ] && basename "$p"
  done
}

help_opts() { "$1" --help | grep -oE -- '--[a-z][a-z-]+' | sort -u; }
# options in the page: "Fl -name" anywhere (SYNOPSIS and OPTIONS)
man_opts() { grep -oE 'Fl -[a-z][a-z-]+' "$RB_SRCDIR/man/$1.1" | sed 's/^Fl /-/' | sort -u; }

@test "every program has a man page" {
  [ -n "$(programs)" ]
  for p in $(programs); do
    [ -f "$RB_SRCDIR/man/$p.1" ] || { echo "no man page for $p"; false; }
  done
}

@test "every long option in --help is in the man page, and the other way round" {
  for p in $(programs); do
    diff <(help_opts "$p") <(man_opts "$p") || { echo "options of $p differ (< --help, > man page)"; false; }
  done
}

@test "--help goes to stdout with exit 0 and starts with the usage line" {
  for p in $(programs); do
    run "$p" --help
    [ "$status" -eq 0 ]
    [[ "${lines[0]}" == "usage: $p"* ]]
  done
}

@test "the man pages lint clean" {
  command -v mandoc >/dev/null || skip "mandoc not installed"
  for f in "$RB_SRCDIR"/man/*.[17]; do
    out=$(mandoc -Tlint -W warning "$f" 2>&1 | grep -v 'referenced manual not found' || true)
    [ -z "$out" ] || { echo "$out"; false; }
  done
}

@test "groff renders every page without a warning (what man and lintian run)" {
  command -v groff >/dev/null || skip "groff not installed"
  for f in "$RB_SRCDIR"/man/*.[17]; do
    out=$(LC_ALL=C.UTF-8 groff -mandoc -Tutf8 -ww -z "$f" 2>&1 || true)
    [ -z "$out" ] || { echo "$f: $out"; false; }
  done
}

@test "relaybus(7) lists every exit code of rb_exit.h" {
  for code in $(grep -oE '= [0-9]+,' "$RB_SRCDIR/libcommon/rb_exit.h" | tr -dc '0-9\n'); do
    grep -qE "^\.It $code\$" "$RB_SRCDIR/man/relaybus.7" || { echo "exit code $code missing"; false; }
  done
}

@test "every page has an ENVIRONMENT section, and section-1 pages EXIT STATUS and EXAMPLES" {
  for f in "$RB_SRCDIR"/man/*.[17]; do
    grep -qx '.Sh ENVIRONMENT' "$f" || { echo "no ENVIRONMENT in $f"; false; }
  done
  for f in "$RB_SRCDIR"/man/*.1; do
    grep -qx '.Sh EXIT STATUS' "$f" && grep -qx '.Sh EXAMPLES' "$f" || { echo "$f lacks EXIT STATUS or EXAMPLES"; false; }
  done
}
