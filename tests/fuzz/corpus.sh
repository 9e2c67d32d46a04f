#!/usr/bin/env bash
# The fuzz corpora: tests/fuzz/corpus/NAME.tar.gz, one archive a harness (a folder of hundreds of
# small files would take far more room in a checkout than its bytes).
#
#   tests/fuzz/corpus.sh unpack NAME DIR [--seeds]   # the files into DIR (kept where present);
#                                                    # --seeds: without the reproducers of open
#                                                    # bugs (crash-*, timeout-*, oom-*, slow-unit-*)
#   tests/fuzz/corpus.sh add NAME FILE...            # adds files (an existing name is kept)
#   tests/fuzz/corpus.sh list NAME                   # the file names
#
# Archives are written alike from alike files (sorted names, no times or owners).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
archive() { echo "$here/corpus/$1.tar.gz"; }

pack() {  # pack DIR ARCHIVE
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu -C "$1" -cf - . |
    gzip -n -9 > "$2.tmp"
  mv "$2.tmp" "$2"
}

case "${1:-}" in
  unpack)
    mkdir -p "$3"
    if [ "${4:-}" = --seeds ]; then
      tar -xzf "$(archive "$2")" -C "$3" --skip-old-files \
        --exclude='./crash-*' --exclude='./timeout-*' --exclude='./oom-*' --exclude='./slow-unit-*'
    else
      tar -xzf "$(archive "$2")" -C "$3" --skip-old-files
    fi
    ;;
  add)
    name=$2
    shift 2
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    [ -f "$(archive "$name")" ] && tar -xzf "$(archive "$name")" -C "$work"
    cp -n "$@" "$work/"
    pack "$work" "$(archive "$name")"
    ;;
  list) tar -tzf "$(archive "$2")" | sed -n 's|^\./||p' | grep -v '^$' ;;
  pack) pack "$3" "$(archive "$2")" ;;  # pack NAME DIR: the archive becomes DIR's files
  *)
    echo "usage: tests/fuzz/corpus.sh unpack NAME DIR [--seeds] | add NAME FILE... | list NAME" >&2
    exit 2
    ;;
esac
