// The official openai npm client sends pictures to `gizllm serve` on a small random Qwen3-VL
// that tests/cli/tiny_vl_folder.cc writes, with the greedy answers of a direct Engine call on the
// same picture and video: an image_url part (a data: URL, or a file under --allowed-media-path)
// and a video_url part (a folder of frames there) get those answers; bad pictures are 400s (BadRequestError) that name the part; the server goes on.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer } from './harness.mjs';

const FOLDER = process.env.TINY_VL_FOLDER;
const PROMPT = 'what is this?';
let dir;
let server;
let client;
let expected;

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gizllm-pictures-'));
  execFileSync(FOLDER, [dir, PROMPT, '8'], { stdio: 'ignore' });
  // tiny_vl_folder ends the answer with the newline `run` prints.
  expected = fs.readFileSync(path.join(dir, 'expected.txt'), 'utf8');
  server = await startServer(['--exact', '--threads', '2', '--slots', '2', '--context', '256',
                              '--allowed-media-path', dir], { model: path.join(dir, 'model') });
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0 });
});

after(async () => {
  assert.equal(await server.stop(), 0, 'the server exits cleanly on SIGTERM');
  fs.rmSync(dir, { recursive: true, force: true });
});

const dataUrl = (file) =>
  `data:image/png;base64,${fs.readFileSync(path.join(dir, file)).toString('base64')}`;

async function ask(url) {
  const r = await client.chat.completions.create({
    model: server.model,
    messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url } },
                                         { type: 'text', text: PROMPT }] }],
    max_tokens: 8,
    temperature: 0,
  });
  return r;
}

function sameAnswer(content) {
  assert.ok(content === expected || content + '\n' === expected,
            `${JSON.stringify(content)} is not ${JSON.stringify(expected)}`);
}

test('a data: URL picture gets the engine\'s answer', async () => {
  const r = await ask(dataUrl('picture.png'));
  sameAnswer(r.choices[0].message.content);
  assert.equal(r.usage.prompt_tokens, 40);
});

test('a file under the allowed folder, by path and file:// URL', async () => {
  sameAnswer((await ask(path.join(dir, 'picture.png'))).choices[0].message.content);
  sameAnswer((await ask(`file://${path.join(dir, 'picture.png')}`)).choices[0].message.content);
});

test('another picture, another answer', async () => {
  const r = await ask(dataUrl('other.png'));
  assert.notEqual(r.choices[0].message.content + '\n', expected);
});

for (const [name, url, words] of [
  ['truncated', () => dataUrl('cut.png'), 'PNG truncated'],
  ['network', () => 'https://example.com/cat.png', 'network'],
  ['outside the folder', () => '/etc/passwd', 'not a file or folder under the allowed media path'],
  ['not base64', () => 'data:image/png;base64,@@@@', 'base64'],
  ['a GIF', () => 'data:image/gif;base64,R0lGODlhAQABAAAAACw=', "'image/gif'"],
]) {
  test(`bad picture: ${name}`, async () => {
    await assert.rejects(ask(url()), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, String(e));
      assert.equal(e.status, 400);
      assert.equal(e.param, 'messages[0].content[0].image_url');
      assert.ok(e.message.includes(words), e.message);
      return true;
    });
  });
}

test('a video_url folder of frames gets the engine\'s answer', async () => {
  const expectedVideo = fs.readFileSync(path.join(dir, 'expected_video.txt'), 'utf8');
  const r = await client.chat.completions.create({
    model: server.model,
    messages: [{ role: 'user', content: [
      { type: 'video_url', video_url: { url: path.join(dir, 'video'), fps: 1 } },
      { type: 'text', text: PROMPT }] }],
    max_tokens: 8,
    temperature: 0,
  });
  const content = r.choices[0].message.content;
  assert.ok(content === expectedVideo || content + '\n' === expectedVideo,
            `${JSON.stringify(content)} is not ${JSON.stringify(expectedVideo)}`);
  assert.equal(r.usage.prompt_tokens, 91);
});

test('the server still answers after the bad pictures', async () => {
  sameAnswer((await ask(dataUrl('picture.png'))).choices[0].message.content);
});
