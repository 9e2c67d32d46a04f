# Helpers for the CLI tests: expect_fail runs a command that must fail with one line on stderr
# that contains a given text, and no crash (exit code 1, not a signal).
set -u
passed=0
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

expect_fail() {  # expect_fail NAME TEXT COMMAND...
  local name=$1 text=$2
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$tmp/err")
  if [ "$rc" -ne 1 ]; then
    echo "FAIL $name: exit code $rc, expected 1"; cat "$tmp/err"; failed=$((failed + 1)); return
  fi
  if [ "$lines" -ne 1 ]; then
    echo "FAIL $name: $lines lines on stderr, expected one"; cat "$tmp/err"; failed=$((failed + 1)); return
  fi
  if ! grep -qF -- "$text" "$tmp/err"; then
    echo "FAIL $name: stderr does not name '$text':"; cat "$tmp/err"; failed=$((failed + 1)); return
  fi
  echo "ok   $name: $(cat "$tmp/err")"
  passed=$((passed + 1))
}

# expect_error NAME TEXT COMMAND...: as expect_fail, for commands that print progress on stderr
# before they fail: exit code 1 and the last line (after any \r) contains TEXT.
expect_error() {
  local name=$1 text=$2
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local last
  last=$(tail -n 1 "$tmp/err" | tr '\r' '\n' | tail -n 1)
  if [ "$rc" -ne 1 ]; then
    echo "FAIL $name: exit code $rc, expected 1"; cat "$tmp/err"; failed=$((failed + 1)); return
  fi
  if ! grep -qF -- "$text" <<<"$last"; then
    echo "FAIL $name: the last line on stderr does not name '$text':"; cat "$tmp/err"
    failed=$((failed + 1)); return
  fi
  echo "ok   $name: $last"
  passed=$((passed + 1))
}

expect_ok() {  # expect_ok NAME COMMAND... (stdout in $tmp/out)
  local name=$1
  shift
  if "$@" >"$tmp/out" 2>"$tmp/err"; then
    echo "ok   $name"; passed=$((passed + 1))
  else
    echo "FAIL $name: exit code $?"; cat "$tmp/err"; failed=$((failed + 1))
  fi
}

check() {  # check NAME CONDITION-COMMAND...
  local name=$1
  shift
  if "$@"; then echo "ok   $name"; passed=$((passed + 1)); else echo "FAIL $name"; failed=$((failed + 1)); fi
}

finish() {
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}
