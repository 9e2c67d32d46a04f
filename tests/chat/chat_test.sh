#!/usr/bin/env bash
# gizllm chat from the outside: through a pseudo-terminal (tmux) as a person types, and with stdin
# from a pipe. Usage: chat_test.sh GIZLLM. Runs from the repository root (models/tiny-chat).
set -u
if ! command -v tmux >/dev/null; then
  echo "tmux not found (scripts/setup.sh installs it)"
  exit 77
fi
gizllm=$(realpath "$1")
tmp=$(mktemp -d)
socket="gizllm-chat-test-$$"  # a tmux server of our own: other sessions are never touched
passed=0
failed=0
cleanup() {
  tmux -L "$socket" kill-server 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }

# tiny-chat's greedy answer to "Recite John 3:16." (gizllm run --greedy on the ChatML prompt).
verse="For God sent not his Son into the world to condemn the world; but that the world"
verse+=" through him might be saved."

screen() { tmux -L "$socket" capture-pane -p -J -S - -t chat 2>/dev/null; }
# wait_for SECONDS COMMAND...: polls every 0.2 s until the command succeeds.
wait_for() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -ge "$deadline" ] && return 1
    sleep 0.2
  done
}
screen_count() { screen | grep -cF -- "$1"; }
# waiting N: N prompts ("> ") shown, the last one still empty: the chat waits for input.
waiting() {
  [ "$(screen | grep -c '^>')" -ge "$1" ] && screen | grep -v '^$' | tail -n 1 | grep -qx '> *'
}
stats() { grep -c '^\[prompt: ' "$tmp/err"; }
stats_at_least() { [ "$(stats)" -ge "$1" ]; }
stat_field() {  # stat_field TURN FIELD: e.g. "tokens", "read", "reused" of the prompt of TURN
  grep '^\[prompt: ' "$tmp/err" | sed -n "$1p" |
    sed -E "s/^\[prompt: ([0-9]+) tokens, ([0-9]+) read, ([0-9]+) reused.*/\1 \2 \3/" |
    awk -v f="$2" '{print (f == "tokens") ? $1 : (f == "read") ? $2 : $3}'
}
type_line() {
  tmux -L "$socket" send-keys -t chat -l -- "$1" && tmux -L "$socket" send-keys -t chat Enter
}

# --- Through a terminal ---
tmux -L "$socket" new-session -d -s chat -x 220 -y 60 \
  "'$gizllm' chat --temperature 0 --threads 1 2>'$tmp/err'; echo \$? >'$tmp/rc'"

if wait_for 60 waiting 1; then
  ok "prompt shown"
else
  fail "no prompt within 60 s"; screen; cat "$tmp/err"
fi

type_line "Recite John 3:16."
if wait_for 60 stats_at_least 1 && [ "$(screen_count "$verse")" -eq 1 ]; then
  ok "first reply: the verse"
else
  fail "first reply: the screen does not show the verse"; screen; cat "$tmp/err"
fi
first_tokens=$(stat_field 1 tokens)
if [ -n "$first_tokens" ] && [ "$(stat_field 1 read)" -eq "$first_tokens" ]; then
  ok "first turn reads its whole prompt ($first_tokens tokens)"
else
  fail "first turn statistics: $(sed -n 1p "$tmp/err" | grep '^\[prompt' || cat "$tmp/err")"
fi

# The second turn starts with the first turn's conversation: most of it comes from the slot.
wait_for 10 waiting 2
type_line "Tell me a fortune."
if wait_for 60 stats_at_least 2; then
  tokens=$(stat_field 2 tokens) read=$(stat_field 2 read) reused=$(stat_field 2 reused)
  if [ "$reused" -ge "$first_tokens" ] && [ "$read" -lt "$tokens" ] &&
     [ $((read + reused)) -eq "$tokens" ]; then
    ok "second turn reuses the slot ($tokens tokens: $read read, $reused reused)"
  else
    fail "second turn: $tokens tokens, $read read, $reused reused (first turn: $first_tokens)"
  fi
else
  fail "second reply did not end within 60 s"; screen; cat "$tmp/err"
fi

# After /reset the same question is the same prompt as the first turn, with the same answer.
wait_for 10 waiting 3
type_line "/reset"
if wait_for 10 grep -q 'conversation cleared' "$tmp/err"; then ok "/reset"; else fail "/reset"; fi
wait_for 10 waiting 4
type_line "Recite John 3:16."
if wait_for 60 stats_at_least 3 && [ "$(screen_count "$verse")" -eq 2 ] &&
   [ "$(stat_field 3 tokens)" -eq "$first_tokens" ]; then
  ok "after /reset: a fresh conversation gives the verse again"
else
  fail "after /reset: verse shown $(screen_count "$verse") times," \
    "prompt $(stat_field 3 tokens) tokens"
  screen; cat "$tmp/err"
fi

wait_for 10 waiting 5
type_line "/exit"
if wait_for 20 test -s "$tmp/rc" && [ "$(cat "$tmp/rc")" = 0 ]; then
  ok "/exit ends the program with status 0"
else
  fail "/exit: status '$(cat "$tmp/rc" 2>/dev/null)'"; screen
fi
if wait_for 10 bash -c "! tmux -L '$socket' has-session -t chat 2>/dev/null"; then
  ok "the session closed"
else
  fail "the session is still open"
fi

# --- From a pipe: no prompt, no ANSI codes, end of input ends the chat ---
printf 'Recite John 3:16.\n' | "$gizllm" chat --temperature 0 --threads 1 >"$tmp/out" 2>"$tmp/err2"
rc=$?
if [ "$rc" -eq 0 ] && [ "$(cat "$tmp/out")" = "$verse" ]; then
  ok "piped: the reply alone on stdout"
else
  fail "piped: status $rc, stdout:"; cat -A "$tmp/out"; cat "$tmp/err2"
fi
if grep -q $'\x1b' "$tmp/out" "$tmp/err2"; then
  fail "piped: ANSI codes in the output"
else
  ok "piped: no ANSI codes"
fi
if grep -q '^\[prompt: [0-9]* tokens, [0-9]* read, 0 reused' "$tmp/err2"; then
  ok "piped: statistics on stderr"
else
  fail "piped: no statistics on stderr"; cat "$tmp/err2"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
