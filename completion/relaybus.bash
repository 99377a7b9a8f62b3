# bash completion for the relaybus programs                -*- shell-script -*-
# SPDX-License-Identifier: MIT
#
# Written from the man pages (rb-setup(1) ... rb-pageinspect(1)), not parsed
# from --help at run time; tests/completion.bats keeps the two in step.
# Installed once per program name (bash-completion loads a command's file on
# first use); every name registers them all.

# The options of each program (and of each rb-admin command); those that
# take an argument end in "=" here (the "=" is not completed).
_rb_common='--db= --host= --port= --username= --dbname= --password --schema= --verbose --quiet --log-format= --help --version'
_rb_opts_rb_setup="--subscribe= --unsubscribe= --completion-history --grant= --revoke= --max-delay= --lock-timeout= --print-sql --no-transaction --check $_rb_common"
_rb_opts_rb_publish="--batch= --flush= --output --keep-going --rejects= --max-line= --reconnect= --trace $_rb_common"
_rb_opts_rb_claim="--handler= --batch= --lease= --owner= --wait= --poll= --max-attempts= --follow --max-in-flight= --drain --chain= $_rb_common"
_rb_opts_rb_complete="--max-attempts= --backoff= --sql= --window= --batch= --no-relinquish --output $_rb_common"
_rb_opts_rb_dispatch="--handler= --exec= --pipe= --sql= --concurrency= --batch= --chain= --strict-order --procs=
  --connections= --lease= --timeout= --grace= --max-attempts= --backoff= --poll= --window=
  --stats-every= --metrics-file= --owner= --drain --settle --fail-exit $_rb_common"
_rb_opts_rb_pageinspect="--baseline --side-by-side --json --interval= --count= $_rb_common"
_rb_opts_rb_admin="--json --table $_rb_common"
_rb_admin_commands='stats list show requeue bury cancel purge lanes subscriptions top'
_rb_admin_select='--handler= --all --key= --event= --limit='
_rb_opts_rb_admin_stats='--handler= --prometheus --output='
_rb_opts_rb_admin_list='--status= --handler= --key= --event= --limit='
_rb_opts_rb_admin_show=''
_rb_opts_rb_admin_requeue=$_rb_admin_select
_rb_opts_rb_admin_bury="--reason= $_rb_admin_select"
_rb_opts_rb_admin_cancel=$_rb_admin_select
_rb_opts_rb_admin_purge='--dead-older-than= --completed-older-than= --history-older-than= --keys --batch='
_rb_opts_rb_admin_lanes='--handler= --all'
_rb_opts_rb_admin_subscriptions='--handler='
_rb_opts_rb_admin_top='--handler= --once --interval='
_rb_pageinspect_commands='lifecycle watch'

# short options that take an argument, per program
_rb_short_args_rb_setup='-u -h -p -U -d -s'
_rb_short_args_rb_publish='-u -h -p -U -d -b'
_rb_short_args_rb_claim='-u -h -p -U -d -H -b -l -w'
_rb_short_args_rb_complete='-u -h -p -U -d -m'
_rb_short_args_rb_dispatch='-u -h -p -U -d -H -c -b -l -t -m'
_rb_short_args_rb_pageinspect='-u -h -p -U -d -i -c'
_rb_short_args_rb_admin='-u -h -p -U -d -n'

# _rb_options PROG [COMMAND]: the long options PROG (and its COMMAND) accepts, one line
_rb_options() {
  local v=_rb_opts_${1//-/_}
  local opts=${!v}
  if [[ $1 == rb-admin && -n ${2:-} ]]; then
    v=_rb_opts_rb_admin_$2
    opts="$opts ${!v}"
  fi
  echo $opts
}

_relaybus() {
  local prog=${1##*/} cur=${COMP_WORDS[COMP_CWORD]} prev= cmd= i w v opts
  ((COMP_CWORD > 0)) && prev=${COMP_WORDS[COMP_CWORD - 1]}
  COMPREPLY=()

  # the rb-admin / rb-pageinspect command: the first word that is neither an option nor its argument
  if [[ $prog == rb-admin || $prog == rb-pageinspect ]]; then
    v=_rb_short_args_${prog//-/_}
    for ((i = 1; i < COMP_CWORD; i++)); do
      w=${COMP_WORDS[i]}
      case $w in
        --*=*) ;;
        --*) [[ " $(_rb_options "$prog") " == *" $w= "* ]] && ((i++)) ;;
        -*) [[ " ${!v} " == *" $w "* ]] && ((i++)) ;;
        *) cmd=$w; break ;;
      esac
    done
  fi

  # the argument of an option
  case $prev in
    --log-format) COMPREPLY=($(compgen -W 'text json' -- "$cur")); return 0 ;;
    --status)
      # a comma-separated list: complete the last element
      local pre=${cur%"${cur##*,}"}
      COMPREPLY=($(compgen -P "$pre" -W 'pending processing dead completed' -- "${cur##*,}"))
      return 0 ;;
    --rejects | --metrics-file) COMPREPLY=($(compgen -f -- "$cur")); return 0 ;;
    --exec | --pipe) COMPREPLY=($(compgen -c -- "$cur")); return 0 ;;
  esac
  if [[ $prev == --output && " $(_rb_options "$prog" "$cmd") " == *" --output= "* ]]; then
    COMPREPLY=($(compgen -f -- "$cur")); return 0  # rb-admin stats --output FILE
  fi
  if [[ $prev == --* && $prev != *=* && " $(_rb_options "$prog" "$cmd") " == *" $prev= "* ]]; then
    return 0 # a value of the user's own: a URL, a name, a duration, a number
  fi
  v=_rb_short_args_${prog//-/_}
  if [[ $prev == -[!-]* && " ${!v} " == *" $prev "* ]]; then
    return 0
  fi

  if [[ $cur == -* ]]; then
    opts=$(_rb_options "$prog" "$cmd")
    COMPREPLY=($(compgen -W "${opts//=/}" -- "$cur"))
    return 0
  fi
  if [[ -z $cmd && $prog == rb-admin ]]; then
    COMPREPLY=($(compgen -W "$_rb_admin_commands" -- "$cur"))
  elif [[ -z $cmd && $prog == rb-pageinspect ]]; then
    COMPREPLY=($(compgen -W "$_rb_pageinspect_commands" -- "$cur"))
  fi
  return 0
}

complete -F _relaybus rb-setup rb-publish rb-claim rb-complete rb-dispatch rb-admin rb-pageinspect
