#!/usr/bin/env bash
# run --image on a small random Qwen3-VL (tests/cli/tiny_vl_folder.cc): the greedy answer equals
# a direct Engine call's on the same picture; bad pictures, placeholders and models fail with one
# line that says what is wrong.
source "$(dirname "$0")/lib.sh"
gz=$1
folder=$2

"$folder" "$tmp" "what is this?" 8 || { echo "FAIL tiny_vl_folder"; exit 1; }
m="$tmp/model"
flags=(--device cpu --exact --threads 2 --greedy --max-tokens 8)

expect_ok run-help $gz run --help
check run-help-image grep -q -- "--image" "$tmp/out"

expect_ok run-image $gz run -m "$m" "${flags[@]}" --image "$tmp/picture.png" --prompt "what is this?"
check run-image-equals-engine cmp "$tmp/out" "$tmp/expected.txt"
check run-image-answer-not-empty test "$(wc -c <"$tmp/expected.txt")" -gt 4
# 35 tokens of the template, the placeholder repeated for the 12 x 8 picture's 2 x 3 rows.
check run-image-prompt-tokens grep -q "^prompt: 40 tokens" "$tmp/err"

# Another picture of the same size, or the same picture with another prompt: another answer.
$gz run -m "$m" "${flags[@]}" --image "$tmp/other.png" --prompt "what is this?" >"$tmp/other" 2>/dev/null
check run-image-other-picture bash -c "! cmp -s '$tmp/other' '$tmp/expected.txt'"
$gz run -m "$m" "${flags[@]}" --image "$tmp/picture.png" --prompt "and this one?" >"$tmp/other" 2>/dev/null
check run-image-other-prompt bash -c "! cmp -s '$tmp/other' '$tmp/expected.txt'"

expect_error run-image-truncated "picture 1: PNG truncated" \
  $gz run -m "$m" "${flags[@]}" --image "$tmp/cut.png" --prompt "what is this?"
expect_error run-image-second-truncated "picture 2: PNG truncated" \
  $gz run -m "$m" "${flags[@]}" --image "$tmp/picture.png" --image "$tmp/cut.png" --prompt "what?"
echo "not a picture" >"$tmp/text.png"
expect_error run-image-not-a-picture "picture 1: " \
  $gz run -m "$m" "${flags[@]}" --image "$tmp/text.png" --prompt "what?"
expect_error run-image-missing "$tmp/missing.png" \
  $gz run -m "$m" "${flags[@]}" --image "$tmp/missing.png" --prompt "what?"
# A model without a vision tower.
expect_error run-image-no-tower "no vision tower" \
  $gz run "${flags[@]}" --image "$tmp/picture.png" --prompt "what is this?"

finish
