#!/usr/bin/env bats
# Another role's code never runs as the relaybus owner: a role with CREATE
# on public and no relaybus grant plants operators and functions there
# with exact types (bigint * interval, text[] && text[], bigint[] @>
# bigint[], ...), which would win over pg_catalog's inexact or polymorphic
# matches in any statement that resolves names through public.  Publish,
# claim, failure, completion, extend and a set-up run, by a non-superuser
# owner and by a superuser, on public and on a schema of its own, leave
# the attacker with nothing.  A database of its own per install: the
# planted operators would reach every other file's statements in the
# shared test database.

load test_helper

R_OWN=${RB_SCHEMA}_own     # the relaybus owner, not a superuser
R_EVIL=${RB_SCHEMA}_evil   # LOGIN and CREATE on public, no relaybus grant
R_PUB=${RB_SCHEMA}_pub     # publisher
R_WA=${RB_SCHEMA}_wa       # worker of handler A
ROLES="$R_OWN $R_EVIL $R_PUB $R_WA"
DB1=${RB_SCHEMA}_db        # owned by R_OWN: relaybus in public and in bus
DB2=${RB_SCHEMA}_su        # relaybus in public, set up by the superuser

# a URL of the test server for role $1 and database $2
url_of() {
  local base=${_test_pg_url%%\?*} rest=
  [[ $_test_pg_url == *\?* ]] && rest="&${_test_pg_url#*\?}"
  echo "${base%/*}/$2?user=$1$rest"
}
psql_as() {  # role db [psql args]
  local r=$1 d=$2
  shift 2
  PGOPTIONS="-c client_min_messages=warning" psql "$(url_of "$r" "$d")" -X -A -t -q -v ON_ERROR_STOP=1 "$@"
}

drop_all() {
  local r
  for d in "$DB1" "$DB2"; do
    psql "$_test_pg_url" -X -q -c "DROP DATABASE IF EXISTS \"$d\" WITH (FORCE)" >/dev/null 2>&1 || true
  done
  for r in $ROLES; do
    psql "$_test_pg_url" -X -q -c "DO \$\$ BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$r') THEN
      EXECUTE 'DROP OWNED BY \"$r\"'; EXECUTE 'DROP ROLE \"$r\"'; END IF; END \$\$" >/dev/null 2>&1 || true
  done
}

# The attacker's kit, planted in public of database $1 as R_EVIL: each
# operator records who ran it (current_user, session_user) in public.loot
# and returns what pg_catalog's would; $2 is what it tries once it runs as
# someone else (a statement for EXECUTE).  The && answers true whatever
# its arguments: bound into the worker view, it shows every handler's rows.
plant() {  # db escalation
  psql_as "$R_EVIL" "$1" <<SQL
CREATE TABLE public.loot (cu text, su text, op text);
GRANT INSERT ON public.loot TO PUBLIC;
CREATE FUNCTION public.took(op text) RETURNS void LANGUAGE plpgsql AS \$f\$
BEGIN
  INSERT INTO public.loot VALUES (current_user, session_user, op);
  IF current_user <> '$R_EVIL' THEN
    BEGIN EXECUTE \$e\$$2\$e\$; EXCEPTION WHEN OTHERS THEN NULL; END;
  END IF;
END \$f\$;
CREATE FUNCTION public.mul(bigint, interval) RETURNS interval LANGUAGE plpgsql AS
  \$f\$ BEGIN PERFORM public.took('*'); RETURN \$1::float8 * \$2; END \$f\$;
CREATE OPERATOR public.* (LEFTARG = bigint, RIGHTARG = interval, FUNCTION = public.mul);
CREATE FUNCTION public.ovl(text[], text[]) RETURNS boolean LANGUAGE plpgsql AS
  \$f\$ BEGIN PERFORM public.took('&&'); RETURN true; END \$f\$;
CREATE OPERATOR public.&& (LEFTARG = text[], RIGHTARG = text[], FUNCTION = public.ovl);
CREATE FUNCTION public.has(bigint[], bigint[]) RETURNS boolean LANGUAGE plpgsql AS
  \$f\$ BEGIN PERFORM public.took('@>'); RETURN \$1 OPERATOR(pg_catalog.@>) \$2; END \$f\$;
CREATE OPERATOR public.@> (LEFTARG = bigint[], RIGHTARG = bigint[], FUNCTION = public.has);
CREATE FUNCTION public.cat(text[], text[]) RETURNS text[] LANGUAGE plpgsql AS
  \$f\$ BEGIN PERFORM public.took('||'); RETURN \$1 OPERATOR(pg_catalog.||) \$2; END \$f\$;
CREATE OPERATOR public.|| (LEFTARG = text[], RIGHTARG = text[], FUNCTION = public.cat);
CREATE FUNCTION public.unnest(bigint[]) RETURNS SETOF bigint LANGUAGE plpgsql AS
  \$f\$ BEGIN PERFORM public.took('unnest'); RETURN QUERY SELECT pg_catalog.unnest(\$1); END \$f\$;
SQL
}
loot_by_others() {  # db
  psql_as postgres "$1" -c "SELECT coalesce(string_agg(DISTINCT cu || ':' || op, ' '), '-') FROM public.loot WHERE cu <> '$R_EVIL'"
}

setup_file() {
  on_mongo && return 0
  have_pg || return 0
  drop_all
  psql "$_test_pg_url" -X -q -v ON_ERROR_STOP=1 \
    -c "CREATE ROLE \"$R_OWN\" LOGIN" -c "CREATE ROLE \"$R_EVIL\" LOGIN" \
    -c "CREATE ROLE \"$R_PUB\" LOGIN" -c "CREATE ROLE \"$R_WA\" LOGIN" \
    -c "CREATE DATABASE \"$DB1\" OWNER \"$R_OWN\"" -c "CREATE DATABASE \"$DB2\"" >/dev/null
  # what PostgreSQL 14 and older give every role, and the review gave its attacker
  psql_as postgres "$DB1" -c "GRANT CREATE ON SCHEMA public TO \"$R_EVIL\""
  psql_as postgres "$DB2" -c "GRANT CREATE ON SCHEMA public TO \"$R_EVIL\""
  plant "$DB1" "GRANT SELECT ON public.relaybus_events, bus.relaybus_events TO \"$R_EVIL\""
  plant "$DB2" "ALTER ROLE \"$R_EVIL\" SUPERUSER"
  # the kit is live: in a session that resolves through public, it is what runs
  [ "$(psql_as "$R_EVIL" "$DB1" -c "SELECT (2::bigint * interval '1 s') = interval '2 s', ARRAY['a']::text[] && ARRAY['b']::text[]")" = "t|t" ]
  [ "$(psql_as postgres "$DB1" -c "SELECT string_agg(DISTINCT op, ' ' ORDER BY op) FROM public.loot")" = "&& *" ]
  psql_as postgres "$DB1" -c "DELETE FROM public.loot"
}
teardown_file() {
  [ -n "${_test_pg_url:-}" ] && ! on_mongo && drop_all || true
}
setup() {
  pg_only "PostgreSQL's roles and search_path"
  need_pg
  unset RELAYBUS_SCHEMA
}

# a pipeline on database $3, schema $4: role $1 publishes (a batch and a
# single event), role $2 claims, fails one attempt of each (a retry due at
# once), claims again and completes
pipeline() {  # publisher worker db schema handler name
  local p w
  p=$(url_of "$1" "$3")
  w=$(url_of "$2" "$3")
  printf '{"id":"%s-1","name":"%s","key":"k1","payload":{"card":"4111"}}\n{"id":"%s-2","name":"%s","payload":{}}\n' \
    "$2" "$6" "$2" "$6" | rb-publish -q --db "$p" --schema "$4"
  printf '{"id":"%s-3","name":"%s","key":"k2","payload":{}}\n' "$2" "$6" | rb-publish -q --db "$p" --schema "$4"
  rb-claim --db "$w" --schema "$4" -H "$5" --batch 10 --lease 30s >"$BATS_TEST_TMPDIR/c1"
  [ "$(wc -l <"$BATS_TEST_TMPDIR/c1")" = 3 ]
  jq -c '. + {ok: false, error: "down", retry_ms: 0}' "$BATS_TEST_TMPDIR/c1" | rb-complete -q --db "$w" --schema "$4"
  rb-claim --db "$w" --schema "$4" -H "$5" --batch 10 --lease 30s >"$BATS_TEST_TMPDIR/c2"
  [ "$(wc -l <"$BATS_TEST_TMPDIR/c2")" = 3 ]
  jq -c '. + {ok: true}' "$BATS_TEST_TMPDIR/c2" | rb-complete -q --db "$w" --schema "$4"
  [ "$(psql_as postgres "$3" -c "SELECT count(*) FROM \"$4\".relaybus_deliveries WHERE handler = '$5'")" = 0 ]
}

@test "public, owner not a superuser: another role's operators in public never run as the owner (publish, claim, fail, complete)" {
  rb-setup -q --db "$(url_of "$R_OWN" "$DB1")" --schema public -s 'A:a.*' -s 'B:b.*' \
    --grant "publisher=$R_PUB" --grant "worker=$R_WA:A" 2>/dev/null
  # the publisher's and the worker's doors (SECURITY DEFINER), then the owner's own sessions
  pipeline "$R_PUB" "$R_WA" "$DB1" public A a.x
  pipeline "$R_OWN" "$R_OWN" "$DB1" public B b.x
  [ "$(loot_by_others "$DB1")" = - ]
  run -1 psql_as "$R_EVIL" "$DB1" -c "SELECT payload FROM public.relaybus_events"
  [[ $output == *"permission denied"* ]]
}

@test "public, set up by a superuser: a publish does not make the planter a superuser" {
  rb-setup -q --db "$(url_of postgres "$DB2")" --schema public -s 'A:a.*' --grant "publisher=$R_PUB" 2>/dev/null
  printf '{"name":"a.x","key":"k","payload":{"card":"4111-1111"}}\n{"name":"a.x","payload":{},"delay_ms":5}\n' |
    rb-publish -q --db "$(url_of "$R_PUB" "$DB2")" --schema public
  printf '{"name":"a.x","payload":{}}\n' | rb-publish -q --db "$(url_of postgres "$DB2")" --schema public
  rb-claim --db "$(url_of postgres "$DB2")" --schema public -H A --batch 10 | jq -c '. + {ok: true}' |
    rb-complete -q --db "$(url_of postgres "$DB2")" --schema public
  [ "$(loot_by_others "$DB2")" = - ]
  [ "$(psql_as postgres "$DB2" -c "SELECT rolsuper FROM pg_roles WHERE rolname = '$R_EVIL'")" = f ]
}

@test "a schema of its own: the owner's programs and a set-up run bind pg_catalog's operators, not public's" {
  local own
  own=$(url_of "$R_OWN" "$DB1")
  rb-setup -q --db "$own" --schema bus -s 'A:a.*' -s 'B:b.*' --grant "worker=$R_WA:A"
  psql_as postgres "$DB1" -c "GRANT USAGE ON SCHEMA bus TO \"$R_EVIL\""
  pipeline "$R_OWN" "$R_OWN" "$DB1" bus B b.x
  # a routine set-up run (a new subscription) re-creates the worker view
  rb-setup -q --db "$own" --schema bus -s 'A:a2.*'
  [[ $(psql_as postgres "$DB1" -c "SELECT pg_get_viewdef('bus.relaybus_worker_events'::regclass)") == *"OPERATOR(pg_catalog.&&)"* ]]
  printf '{"id":"v-a","name":"a.v","payload":{}}\n{"id":"v-b","name":"b.v","payload":{"secret":"B-only"}}\n' |
    rb-publish -q --db "$own" --schema bus
  [ "$(psql_as "$R_WA" "$DB1" -c "SELECT string_agg(id, ' ' ORDER BY id) FROM bus.relaybus_worker_events")" = v-a ]
  rb-admin -q --db "$own" --schema bus stats >/dev/null
  [ "$(loot_by_others "$DB1")" = - ]
  run -1 psql_as "$R_EVIL" "$DB1" -c "SELECT payload FROM bus.relaybus_events"
  [[ $output == *"permission denied"* ]]
}

@test "the lane hash, which has no search_path of its own, binds pg_catalog's names whatever its caller's: exact-type operators and functions in public never run" {
  local own
  own=$(url_of "$R_OWN" "$DB1")
  rb-setup -q --db "$own" --schema bus -s 'A:a.*'
  # what relaybus_lane calls, planted with pg_catalog's own signatures: they
  # win in a session whose search_path puts public before pg_catalog
  psql_as "$R_EVIL" "$DB1" <<'SQL'
CREATE FUNCTION public.x4(integer, integer) RETURNS integer LANGUAGE plpgsql AS
  $f$ BEGIN PERFORM public.took('#'); RETURN $1 OPERATOR(pg_catalog.#) $2; END $f$;
CREATE OPERATOR public.# (LEFTARG = integer, RIGHTARG = integer, FUNCTION = public.x4);
CREATE FUNCTION public.m4(integer, integer) RETURNS integer LANGUAGE plpgsql AS
  $f$ BEGIN PERFORM public.took('*4'); RETURN $1 OPERATOR(pg_catalog.*) $2; END $f$;
CREATE OPERATOR public.* (LEFTARG = integer, RIGHTARG = integer, FUNCTION = public.m4);
CREATE FUNCTION public.get_byte(bytea, integer) RETURNS integer LANGUAGE plpgsql AS
  $f$ BEGIN PERFORM public.took('get_byte'); RETURN pg_catalog.get_byte($1, $2); END $f$;
CREATE FUNCTION public.length(bytea) RETURNS integer LANGUAGE plpgsql AS
  $f$ BEGIN PERFORM public.took('length'); RETURN pg_catalog.length($1); END $f$;
CREATE FUNCTION public.sr8(bigint, integer) RETURNS bigint LANGUAGE plpgsql AS
  $f$ BEGIN PERFORM public.took('>>'); RETURN $1 OPERATOR(pg_catalog.>>) $2; END $f$;
CREATE OPERATOR public.>> (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = public.sr8);
CREATE FUNCTION public.a8(bigint, bigint) RETURNS bigint LANGUAGE plpgsql AS
  $f$ BEGIN PERFORM public.took('&8'); RETURN $1 OPERATOR(pg_catalog.&) $2; END $f$;
CREATE OPERATOR public.& (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = public.a8);
SQL
  # live: the planter's own session binds them
  [ "$(psql_as "$R_EVIL" "$DB1" -c "SET search_path = public, pg_catalog" -c "SELECT 3 # 5, length('ab'::bytea), (23::bigint >> 1) & 7::bigint")" = "6|2|3" ]
  [ "$(psql_as postgres "$DB1" -c "SELECT string_agg(DISTINCT op, ' ' ORDER BY op) FROM public.loot WHERE op IN ('#', 'length', '>>', '&8')")" = "# &8 >> length" ]
  # the owner's session that puts public first: the lanes of the C code
  # (rb_lane: publish.bats), and a publish by it
  [ "$(psql_as "$R_OWN" "$DB1" -c "SET search_path = public, pg_catalog" \
        -c "SELECT bus.relaybus_lane('foobar'), bus.relaybus_lane('a')")" = "104|44" ]
  # the tail of the hash that the publish of ids it makes inlines (lane_pg.sql): the
  # lane of 'foo' and the six hex digits of 0xba12ef is that of 'foo' || 'ba12ef'
  [ "$(psql_as "$R_OWN" "$DB1" -c "SET search_path = public, pg_catalog" \
        -c "SELECT bus.relaybus_lane_tail(bus.relaybus_lane('foo'), 12194543) = bus.relaybus_lane('fooba12ef')")" = t ]
  printf '{"name":"a.x","payload":{"t":"tail"}}\n{"name":"a.x","payload":{"t":"tail"}}\n' |
    PGOPTIONS="-c search_path=public,pg_catalog" rb-publish -q --db "$own" --schema bus --batch 2
  [ "$(psql_as postgres "$DB1" -c "SELECT count(*) FILTER (WHERE d.lane = bus.relaybus_lane(d.event_id)) || '/' || count(*)
        FROM bus.relaybus_deliveries d JOIN bus.relaybus_events e ON e.id = d.event_id WHERE e.payload = '{\"t\": \"tail\"}'")" = 2/2 ]
  printf '{"id":"foobar","name":"a.x","payload":{}}\n' |
    PGOPTIONS="-c search_path=public,pg_catalog" rb-publish -q --db "$own" --schema bus
  [ "$(psql_as postgres "$DB1" -c "SELECT lane FROM bus.relaybus_deliveries WHERE event_id = 'foobar'")" = 104 ]
  [ "$(loot_by_others "$DB1")" = - ]
  psql_as postgres "$DB1" -c "DROP OPERATOR public.# (integer, integer); DROP OPERATOR public.* (integer, integer);
    DROP OPERATOR public.>> (bigint, integer); DROP OPERATOR public.& (bigint, bigint);
    DROP FUNCTION public.x4, public.m4, public.sr8, public.a8, public.get_byte(bytea, integer), public.length(bytea); DELETE FROM public.loot"
}

@test "--sql still resolves the caller's own names through the session's search_path" {
  local own
  own=$(url_of "$R_OWN" "$DB1")
  rb-setup -q --db "$own" --schema bus -s 'S:s.*'
  psql_as "$R_OWN" "$DB1" -c "CREATE SCHEMA IF NOT EXISTS app" -c "CREATE TABLE app.sink (id text)" \
    -c "ALTER ROLE \"$R_OWN\" IN DATABASE \"$DB1\" SET search_path = app, public"
  printf '{"id":"s-1","name":"s.x","payload":{}}\n' | rb-publish -q --db "$own" --schema bus
  rb-dispatch --db "$own" --schema bus -H S --sql 'INSERT INTO sink VALUES ($1::json->>$$event_id$$)' --drain
  [ "$(psql_as postgres "$DB1" -c "SELECT string_agg(id, ' ') FROM app.sink")" = s-1 ]
  [ "$(psql_as postgres "$DB1" -c "SELECT count(*) FROM bus.relaybus_deliveries WHERE handler = 'S'")" = 0 ]
  psql_as "$R_OWN" "$DB1" -c "ALTER ROLE \"$R_OWN\" IN DATABASE \"$DB1\" RESET search_path"
}

@test "rb-setup warns when roles other than the owner can create objects in its schema, naming them and the fix" {
  run -0 --separate-stderr rb-setup --db "$(url_of "$R_OWN" "$DB1")" --schema public -s 'A:a.*'
  echo "$stderr"
  [[ $stderr == *"rb-setup: schema public: roles other than the owner can create objects in it ($R_EVIL): "* ]]
  [[ $stderr == *"REVOKE CREATE ON SCHEMA public FROM $R_EVIL" ]]
  run -0 --separate-stderr rb-setup --db "$(url_of "$R_OWN" "$DB1")" --schema bus -s 'A:a.*'
  [ -z "$stderr" ]
}
