// 64 and 256 concurrent streamed requests (16 slots) all complete, each with the text the same
// greedy request gets alone. With --exact: a row's float32 logits do not depend on the rows
// beside it; in the fast mode (bf16 activations, the CPU's default where it has AVX-512 BF16)
// a step of many rows rounds differently from a step of one, so near-ties may go either way.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer } from './harness.mjs';

let server;
let client;

before(async () => {
  server = await startServer(['--slots', '16', '--context', '512', '--kv-mib', '64', '--exact']);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0,
                        timeout: 300000 });
});

after(async () => {
  assert.equal(await server.stop(), 0);
});

const prompts = [
  'Recite John 3:16.', 'Recite Psalms 23:1.', 'Tell me a fortune.', 'Recite Genesis 1:1.',
  'Recite Matthew 5:9.', 'Recite Romans 8:28.', 'Recite Proverbs 3:5.', 'Recite Exodus 20:3.',
];

async function streamed(content, maxTokens) {
  const stream = await client.chat.completions.create({
    model: server.model, messages: [{ role: 'user', content }], max_tokens: maxTokens,
    temperature: 0, stream: true,
  });
  let text = '';
  let finish = null;
  for await (const chunk of stream) {
    if (!chunk.choices.length) continue;
    text += chunk.choices[0].delta.content ?? '';
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  return { text, finish };
}

test('64 concurrent streams give the text of each request alone', async () => {
  const alone = [];
  for (let i = 0; i < prompts.length; i++) {
    // Varied limits, so requests end at different steps.
    alone.push(await streamed(prompts[i], 8 + 2 * i));
  }
  const jobs = [];
  for (let j = 0; j < 64; j++) {
    const i = j % prompts.length;
    jobs.push(streamed(prompts[i], 8 + 2 * i).then((r) => ({ i, r })));
  }
  const results = await Promise.all(jobs);
  assert.equal(results.length, 64);
  for (const { i, r } of results) {
    assert.equal(r.text, alone[i].text, `prompt ${i}`);
    assert.equal(r.finish, alone[i].finish, `prompt ${i}`);
  }
  const metrics = await (await fetch(`${server.url}/metrics`)).text();
  const ok = /gizllm_requests_total\{endpoint="\/v1\/chat\/completions",status="200"\} (\d+)/
    .exec(metrics);
  assert.equal(Number(ok[1]), 64 + prompts.length);
});

test('256 concurrent streams, 16 times the slots, wait their turn and all complete', async () => {
  const before = await (await fetch(`${server.url}/metrics`)).text();
  const count = (text) => Number(
    /gizllm_requests_total\{endpoint="\/v1\/chat\/completions",status="200"\} (\d+)/
      .exec(text)?.[1] ?? 0);
  const alone = [];
  for (let i = 0; i < prompts.length; i++) alone.push(await streamed(prompts[i], 4 + (i % 3)));
  const jobs = [];
  for (let j = 0; j < 256; j++) {
    const i = j % prompts.length;
    jobs.push(streamed(prompts[i], 4 + (i % 3)).then((r) => ({ i, r })));
  }
  const results = await Promise.all(jobs);
  assert.equal(results.length, 256);
  for (const { i, r } of results) {
    assert.equal(r.text, alone[i].text, `prompt ${i}`);
    assert.equal(r.finish, alone[i].finish, `prompt ${i}`);
  }
  // Every stream counted once, nothing waits or runs once they have ended (the figures follow
  // the last bytes of a stream within a moment).
  const expected = count(before) + 256 + prompts.length;
  const settled = (m) => count(m) === expected && /^gizllm_queue_length 0$/m.test(m) &&
    /^gizllm_requests_running 0$/m.test(m);
  let metrics = await (await fetch(`${server.url}/metrics`)).text();
  for (let tries = 0; tries < 50 && !settled(metrics); tries++) {
    await new Promise((resolve) => setTimeout(resolve, 20));
    metrics = await (await fetch(`${server.url}/metrics`)).text();
  }
  assert.equal(count(metrics), expected);
  assert.match(metrics, /^gizllm_queue_length 0$/m);
  assert.match(metrics, /^gizllm_requests_running 0$/m);
});
