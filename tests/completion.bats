#!/usr/bin/env bats
# The bash completion (completion/relaybus.bash) offers what each program's
# --help lists, no more and no less, and completes commands and the values
# of --status and --log-format.

load test_helper

setup() {
  # shellcheck source=../completion/relaybus.bash
  source "$RB_SRCDIR/completion/relaybus.bash"
}

programs() { echo rb-setup rb-publish rb-claim rb-complete rb-dispatch rb-admin rb-pageinspect; }
help_opts() { "$1" --help | grep -oE -- '--[a-z][a-z-]+' | sort -u; }

# complete WORD...: COMPREPLY, one a line, for the command line WORD... with
# the cursor at the end of the last word (give '' to complete a new word)
complete_line() {
  COMP_WORDS=("$@")
  COMP_CWORD=$(($# - 1))
  COMP_LINE="$*"
  COMP_POINT=${#COMP_LINE}
  COMPREPLY=()
  _relaybus "$1" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
  printf '%s\n' "${COMPREPLY[@]}"
}

@test "every program is registered" {
  for p in $(programs); do
    complete -p "$p" | grep -q -- '-F _relaybus' || { echo "$p has no completion"; false; }
  done
}

@test "the options the completion knows are those of --help, for every program" {
  for p in $(programs); do
    if [ "$p" = rb-admin ]; then
      # the global options and every command's, together
      theirs=$(for c in '' $_rb_admin_commands; do _rb_options rb-admin $c; done | tr ' ' '\n' | tr -d = | sort -u)
    else
      theirs=$(_rb_options "$p" | tr ' ' '\n' | tr -d = | sort -u)
    fi
    diff <(help_opts "$p") <(printf '%s\n' "$theirs" | grep .) ||
      { echo "options of $p differ (< --help, > completion)"; false; }
  done
}

@test "a prefix of each option completes to it (rb-admin: after its command)" {
  for p in $(programs); do
    for o in $(help_opts "$p"); do
      if [ "$p" = rb-admin ]; then
        local found=no c
        for c in '' $_rb_admin_commands; do
          # shellcheck disable=SC2086
          complete_line rb-admin $c "${o:0:5}" | grep -qx -- "$o" && found=yes
        done
        [ $found = yes ] || { echo "rb-admin ${o:0:5} does not offer $o"; false; }
      else
        complete_line "$p" "${o:0:5}" | grep -qx -- "$o" || { echo "$p ${o:0:5} does not offer $o"; false; }
      fi
    done
  done
}

@test "rb-admin: commands first, then that command's options; list --status values, comma-separated" {
  [ "$(complete_line rb-admin l | tr '\n' ' ')" = "list lanes " ]
  [ "$(complete_line rb-admin --db x '' | wc -l)" -eq 10 ]
  [ "$(complete_line rb-admin list --st)" = --status ]
  [ -z "$(complete_line rb-admin stats --st)" ]
  [ "$(complete_line rb-admin purge --d | sort | tr "\n" " ")" = "--db --dbname --dead-older-than " ]
  [ "$(complete_line rb-admin list --status d)" = dead ]
  [ "$(complete_line rb-admin list --status dead,p | tr '\n' ' ')" = "dead,pending dead,processing " ]
  # after --handler comes a name of the user's own: nothing is offered
  [ -z "$(complete_line rb-admin list --handler '')" ]
}

@test "option values: --log-format, --exec commands, nothing for a number or a name" {
  [ "$(complete_line rb-claim --log-format j)" = json ]
  complete_line rb-dispatch --exec bat | grep -qx bats
  [ -z "$(complete_line rb-claim -H '')" ]
  [ -z "$(complete_line rb-claim --batch '')" ]
  [ "$(complete_line rb-pageinspect w)" = watch ]
  [ "$(complete_line rb-pageinspect watch --co)" = --count ]
}
