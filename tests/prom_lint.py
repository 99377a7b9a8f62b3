#!/usr/bin/env python3
"""prom_lint.py: a strict checker of the Prometheus text exposition format
(version 0.0.4), for the tests of `rb-admin stats --prometheus`.

Reads stdin; prints one "line N: what" per problem on stderr and exits 1 on
any, else prints "ok FAMILIES SAMPLES" and exits 0.  Checks: every line is
"# HELP name text", "# TYPE name type" or a sample; metric names match
[a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]* (not __*);
label values are quoted with only \\\\, \\" and \\n escapes; no duplicate
label names; values parse as Go floats (NaN, +Inf, -Inf allowed); an
optional integer timestamp; HELP and TYPE at most once per family and
before its samples; a family's samples are contiguous; no series twice;
no blank lines; the input ends with a newline.
"""
import re
import sys

NAME = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*')
LABEL = re.compile(r'[a-zA-Z_][a-zA-Z0-9_]*')
FLOAT = re.compile(r'^[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|Inf|inf|NaN)$')
TYPES = {'counter', 'gauge', 'histogram', 'summary', 'untyped'}


def family_of(name, types):
    for suffix in ('_bucket', '_count', '_sum'):
        base = name[:-len(suffix)] if name.endswith(suffix) else None
        if base and types.get(base) in ('histogram', 'summary'):
            return base
    return name


def parse_labels(s, i, lineno, errors):
    """s[i] == '{'; returns (labels, index after '}')."""
    labels = {}
    i += 1
    while True:
        if i < len(s) and s[i] == '}':
            return labels, i + 1
        m = LABEL.match(s, i)
        if not m:
            errors.append(f'line {lineno}: bad label name at column {i + 1}')
            return None, i
        lname = m.group(0)
        if lname.startswith('__'):
            errors.append(f'line {lineno}: reserved label name {lname}')
        i = m.end()
        if s[i:i + 2] != '="':
            errors.append(f'line {lineno}: expected =" after label {lname}')
            return None, i
        i += 2
        val = []
        while True:
            if i >= len(s):
                errors.append(f'line {lineno}: unterminated label value')
                return None, i
            c = s[i]
            if c == '\\':
                nxt = s[i + 1:i + 2]
                if nxt not in ('\\', '"', 'n'):
                    errors.append(f'line {lineno}: bad escape \\{nxt} in label value')
                    return None, i
                val.append({'n': '\n'}.get(nxt, nxt))
                i += 2
            elif c == '"':
                i += 1
                break
            elif c == '\n':
                errors.append(f'line {lineno}: newline in label value')
                return None, i
            else:
                val.append(c)
                i += 1
        if lname in labels:
            errors.append(f'line {lineno}: duplicate label {lname}')
        labels[lname] = ''.join(val)
        if i < len(s) and s[i] == ',':
            i += 1
        elif i < len(s) and s[i] == '}':
            continue
        else:
            errors.append(f'line {lineno}: expected , or }} after label value')
            return None, i


def main():
    data = sys.stdin.read()
    errors = []
    if not data:
        errors.append('empty input')
    elif not data.endswith('\n'):
        errors.append('no final newline')
    types, helps, seen_series, done_families, sampled = {}, set(), set(), set(), set()
    current = None
    samples = 0
    for lineno, line in enumerate(data.split('\n')[:-1] if data.endswith('\n') else data.split('\n'), 1):
        if line == '':
            errors.append(f'line {lineno}: blank line')
            continue
        if line.startswith('#'):
            parts = line.split(' ', 3)
            if len(parts) >= 2 and parts[1] in ('HELP', 'TYPE'):
                if len(parts) < 3 or not NAME.fullmatch(parts[2]):
                    errors.append(f'line {lineno}: bad metric name in {parts[1]}')
                    continue
                name = parts[2]
                if name in done_families or name in sampled:
                    errors.append(f'line {lineno}: {parts[1]} for {name} after its samples')
                if parts[1] == 'HELP':
                    if name in helps:
                        errors.append(f'line {lineno}: second HELP for {name}')
                    if len(parts) < 4 or parts[3] == '':
                        errors.append(f'line {lineno}: HELP without text')
                    helps.add(name)
                else:
                    if name in types:
                        errors.append(f'line {lineno}: second TYPE for {name}')
                    if len(parts) != 4 or parts[3] not in TYPES:
                        errors.append(f'line {lineno}: bad TYPE')
                    types[name] = parts[3] if len(parts) == 4 else None
                if current is not None and current != name:
                    done_families.add(current)
                current = name
            continue
        m = NAME.match(line)
        if not m:
            errors.append(f'line {lineno}: bad metric name')
            continue
        name = m.group(0)
        i = m.end()
        labels = {}
        if i < len(line) and line[i] == '{':
            labels, i = parse_labels(line, i, lineno, errors)
            if labels is None:
                continue
        rest = line[i:]
        if not rest.startswith(' '):
            errors.append(f'line {lineno}: expected a space before the value')
            continue
        fields = rest[1:].split(' ')
        if len(fields) not in (1, 2) or not FLOAT.match(fields[0]):
            errors.append(f'line {lineno}: bad value {rest[1:]!r}')
            continue
        if len(fields) == 2 and not re.fullmatch(r'-?\d+', fields[1]):
            errors.append(f'line {lineno}: bad timestamp')
        fam = family_of(name, types)
        if fam in done_families:
            errors.append(f'line {lineno}: samples of {fam} are not contiguous')
        if current is not None and current != fam:
            done_families.add(current)
        current = fam
        sampled.add(fam)
        key = (name, tuple(sorted(labels.items())))
        if key in seen_series:
            errors.append(f'line {lineno}: series {name}{labels} twice')
        seen_series.add(key)
        samples += 1
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        return 1
    print(f'ok {len(types)} {samples}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
