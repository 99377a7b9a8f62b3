#!/usr/bin/env bats
# rb-admin --table measures cells in terminal columns, not bytes: keys and
# errors in Cyrillic, with accents or CJK (two columns a character) keep
# every column in line; a long cell is cut to its width, not mid-character.

load test_helper

setup_file() {
  have_pg || return 0
  rb-setup -s 'wide:*'
}

teardown_file() { drop_schema; }

# The terminal column where each field of each line starts (fields are
# separated by two or more spaces), as "line: col col ...".
columns() {
  python3 -c '
import re, sys, unicodedata
def width(s):
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in s)
for n, line in enumerate(sys.stdin.read().splitlines()):
    print(n, *[width(line[:m.start()]) for m in re.finditer(r"(?:^|(?<=  ))\S", line)])
'
}

@test "list --table: OWNER and LAST_ERROR start in the same column on every line, whatever the key's script" {
  need_pg
  printf '%s\n' '{"id":"t1","name":"n","key":"ключ-é","payload":{}}' \
    '{"id":"t2","name":"n","key":"注文-1","payload":{}}' \
    '{"id":"t3","name":"n","key":"plain","payload":{}}' | rb-publish -q
  rb-claim -q -H wide | jq -c '. + {ok: false, error: "ошибка: 注文が失敗しました, a long reason that is cut to its column"}' |
    rb-complete -q >/dev/null
  run --separate-stderr rb-admin --table list --handler wide
  [ "$status" -eq 0 ]
  [ "${#lines[@]}" -eq 4 ]
  [[ "${lines[0]}" == EVENT_ID*OWNER*LAST_ERROR ]]
  # KEY, OWNER and LAST_ERROR (left-aligned, the last three) start where the header's do
  printf '%s\n' "$output" | columns >"$BATS_TEST_TMPDIR/cols"
  cat "$BATS_TEST_TMPDIR/cols"
  [ "$(awk '{ print $(NF-2), $(NF-1), $NF }' "$BATS_TEST_TMPDIR/cols" | sort -u | wc -l)" -eq 1 ]
  # the error was cut to the column's width with "...", on a character boundary
  [[ "${lines[1]}" == *"ошибка: 注文が失敗しました, a"*"..." ]]
  printf '%s\n' "$output" | iconv -f UTF-8 -t UTF-8 >/dev/null
}
