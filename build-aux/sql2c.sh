#!/bin/sh
# sql2c.sh NAME FILE.sql > FILE.c: embed a SQL script as a C string.
name=$1
file=$2
printf '/* generated from %s by sql2c.sh: do not edit */\n' "$(basename "$file")"
printf 'extern const char %s[];\n' "$name"
printf 'const char %s[] =\n' "$name"
sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$/\\n"/' "$file"
printf ';\n'
