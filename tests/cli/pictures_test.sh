#!/usr/bin/env bash
# run --image, run --video and chat's /image and /video on a small random Qwen3-VL
# (tests/cli/tiny_vl_folder.cc): the greedy answer equals a direct Engine call's on the same
# picture or frames; bad pictures and models without
# a tower fail with a line that says what is wrong.
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
expect_fail run-image-special "--special: not with --image" \
  $gz run -m "$m" "${flags[@]}" --image "$tmp/picture.png" --special --prompt "what?"
# A converted folder: convert writes the tower, unquantized, to vision.safetensors (with the
# processors' configs) and run --image reads it from there.
expect_ok convert-vl $gz convert --from "$m" --to "$tmp/converted" --bits 8 --threads 2
check convert-vl-tower-file test -f "$tmp/converted/vision.safetensors"
check convert-vl-tower-line grep -q "vision tower: .* tensors as the source holds them" "$tmp/err"
expect_ok run-image-converted $gz run -m "$tmp/converted" "${flags[@]}" --image "$tmp/picture.png" \
  --prompt "what is this?"
check run-image-converted-prompt-tokens grep -q "^prompt: 40 tokens" "$tmp/err"
check run-image-converted-answer-not-empty test "$(wc -c <"$tmp/out")" -gt 4
# bench --image: one request at a time, the first token timed from reading the file; the
# prompt is run's (40 tokens), and each request produces its tokens.
expect_ok bench-image $gz bench -m "$m" --device cpu --exact --threads 2 --image "$tmp/picture.png" \
  --image-prompt "what is this?" -n 3 -o 4 --json
check bench-image-prompt python3 -c "import json,sys; d=json.loads(open('$tmp/out').read().strip().splitlines()[-1]); sys.exit(0 if d['prompt_tokens']==40 and d['generated_tokens']==12 and d['concurrency']==1 and 0<d['picture_ms_p50']<=d['ttft_p50_ms'] else 1)"
expect_fail bench-image-concurrency "one request at a time" \
  $gz bench -m "$m" --device cpu --image "$tmp/picture.png" -c 4
expect_error bench-image-truncated "picture 1: PNG truncated" \
  $gz bench -m "$m" --device cpu --image "$tmp/cut.png"
expect_error bench-image-no-tower "no vision tower" \
  $gz bench --device cpu --image "$tmp/picture.png" -n 1 -o 1
# A model without a vision tower.
expect_error run-image-no-tower "no vision tower" \
  $gz run "${flags[@]}" --image "$tmp/picture.png" --prompt "what is this?"

# run --video: a folder of frames taken at 1 frame a second; the answer equals a direct Engine
# call on the same frames placed as Qwen3VLProcessor writes them (three timestamped pairs).
expect_ok run-help-video $gz run --help
check run-help-video-flag grep -q -- "--video-fps" "$tmp/out"
expect_ok run-video $gz run -m "$m" "${flags[@]}" --video "$tmp/video" --video-fps 1 \
  --prompt "what is this?"
check run-video-equals-engine cmp "$tmp/out" "$tmp/expected_video.txt"
check run-video-answer-not-empty test "$(wc -c <"$tmp/expected_video.txt")" -gt 4
# 35 tokens of the template, its three of the video (vision start, placeholder, vision end)
# replaced per pair by its timestamp ("<0.5 seconds>": 13 characters), vision start, 4 rows,
# vision end: 32 + 3 x 19.
check run-video-prompt-tokens grep -q "^prompt: 91 tokens" "$tmp/err"
# Taken at 10 frames a second: half a second of video, 4 frames sampled (the processor's
# least; frames 0, 1, 3, 4), two pairs: 34 + 2 x 19 tokens.
$gz run -m "$m" "${flags[@]}" --video "$tmp/video" --video-fps 10 --prompt "what is this?" \
  >"$tmp/other" 2>"$tmp/other.err"
check run-video-sampled-at-the-rate grep -q '^prompt: 72 tokens' "$tmp/other.err"
expect_error run-video-mixed-sizes "video 1: video frames differ in size" \
  $gz run -m "$m" "${flags[@]}" --video "$tmp/mixed" --prompt "what?"
expect_error run-video-missing "video 1: " \
  $gz run -m "$m" "${flags[@]}" --video "$tmp/none" --prompt "what?"
expect_fail run-video-fps-alone "--video-fps: give --video too" \
  $gz run -m "$m" "${flags[@]}" --video-fps 2 --prompt "what?"

# serve: the media flags, and an allowed folder that is not one.
expect_ok serve-help $gz serve --help
check serve-help-media grep -q -- "--allowed-media-path" "$tmp/out"
check serve-help-limits grep -q -- "--max-video-frames" "$tmp/out"
expect_fail serve-media-path-not-a-folder "--allowed-media-path $tmp/none: not a folder" \
  $gz serve -m "$m" --device cpu --port 0 --allowed-media-path "$tmp/none"

# chat: /image attaches a picture to the next message; the first reply is run's (the same
# prompt); the next turn reuses the first turn's tokens, picture rows included; a bad picture or
# a model without a tower is refused with a line on stderr and the chat goes on.
chat=(--device cpu --exact --threads 2 --temperature 0 --max-tokens 8)
printf '/image %s\nwhat is this?\n/image %s\n/image %s\nand this?\n' "$tmp/picture.png" \
  "$tmp/cut.png" "$tmp/other.png" | $gz chat -m "$m" "${chat[@]}" >"$tmp/chat" 2>"$tmp/chat.err"
check chat-image-exit-0 test $? -eq 0
check chat-image-equals-run test "$(head -n 1 "$tmp/chat")" = "$(head -n 1 "$tmp/expected.txt")"
check chat-image-two-replies test "$(grep -c "answer: 8 tokens" "$tmp/chat.err")" -eq 2
check chat-image-bad-picture grep -q "cut.png: PNG truncated" "$tmp/chat.err"
reused=$(grep -o "[0-9]* reused" "$tmp/chat.err" | sed -n 2p | cut -d' ' -f1)
check chat-image-reuses-the-first-turn test "${reused:-0}" -ge 40
# chat: /video FOLDER FPS attaches a video; the reply is run --video's (the same prompt); a
# folder of frames of two sizes and a rate that is not one are refused and the chat goes on.
expect_ok chat-help $gz chat --help
check chat-help-video grep -q -- "/video FOLDER" "$tmp/out"
printf '/video %s 1\nwhat is this?\n/video %s\n/video %s fast\nand this?\n' "$tmp/video" \
  "$tmp/mixed" "$tmp/video" | $gz chat -m "$m" "${chat[@]}" >"$tmp/chat" 2>"$tmp/chat.err"
check chat-video-exit-0 test $? -eq 0
check chat-video-equals-run test "$(head -n 1 "$tmp/chat")" = "$(head -n 1 "$tmp/expected_video.txt")"
check chat-video-two-replies test "$(grep -c "| answer: " "$tmp/chat.err")" -eq 2
check chat-video-mixed-sizes grep -q "mixed: video frames differ in size" "$tmp/chat.err"
check chat-video-bad-rate grep -q "the rate fast is not a positive number" "$tmp/chat.err"
reused=$(grep -o "[0-9]* reused" "$tmp/chat.err" | sed -n 2p | cut -d' ' -f1)
check chat-video-reuses-the-first-turn test "${reused:-0}" -ge 91
printf '/image %s\nhello\n' "$tmp/picture.png" | $gz chat "${chat[@]}" >/dev/null 2>"$tmp/chat.err"
check chat-image-no-tower grep -q "pictures need a vision tower" "$tmp/chat.err"

finish
