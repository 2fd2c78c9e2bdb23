"""Shell wrappers around the real git for tests that need git to misbehave at one subcommand.

`SUBCOMMAND` is a wrapper's first lines: it sets `$sub` to the git subcommand being run,
skipping the `-c key=value` options before it."""

SUBCOMMAND = """#!/bin/sh
for a in "$@"; do
  case "$a" in -c) skip=1; continue ;; esac
  if [ "$skip" = 1 ]; then skip=0; continue; fi
  sub="$a"; break
done
"""
