# sqluse.awk: where the bats test named d (its description) uses SQL on the
# store: "line N", or the name of a helper of its file that does; nothing
# when it does not.  Give the .bats file twice (helpers first, then tests).
BEGIN { re = "(^|[^A-Za-z0-9_$-])(q|sql|psql|pg_dir)( |$|\\))" }
FNR == 1 { pass++ }
pass == 1 {
  if ($0 ~ /^[A-Za-z_][A-Za-z0-9_]*\(\) *\{/) { fn = substr($0, 1, index($0, "(") - 1); infn = 1; body = $0 }
  else if (infn) body = body "\n" $0
  if (infn && ($0 ~ /^}/ || ($0 ~ /\}[ \t]*$/ && body == $0))) {
    if (body ~ re && fn !~ /^(setup|setup_file|teardown|teardown_file)$/) sqlfn[fn] = 1
    infn = 0
  }
  next
}
pass == 2 {
  if ($0 ~ /^@test /) { inb = index($0, "\"" d "\"") > 0; next }
  if (inb && $0 ~ /^}/) exit
  if (inb) {
    if ($0 ~ re) { print "line " FNR; exit }
    for (f in sqlfn) if ($0 ~ ("(^|[^A-Za-z0-9_])" f "( |$|\\))")) { print f; exit }
  }
}
