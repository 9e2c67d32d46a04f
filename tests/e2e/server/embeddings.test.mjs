// The official openai npm client's embeddings call, and the rerank and score routes, against
// `gizllm serve` on random tiny encoders (tests/cli/tiny_encoder.py).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, postJson } from './harness.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gizllm-encoders-'));
let embed;
let rerank;
let prompted;

before(async () => {
  execFileSync('python3', ['tests/cli/tiny_encoder.py', path.join(dir, 'st'), '--st']);
  execFileSync('python3', ['tests/cli/tiny_encoder.py', path.join(dir, 'ce'), '--family',
                           'roberta', '--head']);
  embed = await startServer(['--exact'], { model: path.join(dir, 'st') });
  rerank = await startServer(['--exact'], { model: path.join(dir, 'ce') });
  execFileSync('python3', ['tests/cli/tiny_encoder.py', path.join(dir, 'pm'), '--st', '--prompts',
                           '--matryoshka']);
  prompted = await startServer(['--exact'], { model: path.join(dir, 'pm') });
});

after(async () => {
  // Both stopped before either is judged, so that a failure leaves no server running.
  const codes = [await embed.stop(), await rerank.stop(), await prompted.stop()];
  fs.rmSync(dir, { recursive: true, force: true });
  assert.deepEqual(codes, [0, 0, 0], 'the servers exit cleanly on SIGTERM');
});

test('openai client embeddings: floats and base64 agree, unit vectors, usage', async () => {
  const client = new OpenAI({ baseURL: `${embed.url}/v1`, apiKey: 'none', maxRetries: 0 });
  const input = ['hello world', 'The quick brown fox'];
  // The client asks for base64 by default and decodes it into floats.
  const b = await client.embeddings.create({ model: embed.model, input });
  const f = await client.embeddings.create({ model: embed.model, input, encoding_format: 'float' });
  assert.equal(b.object, 'list');
  assert.equal(b.data.length, 2);
  for (let i = 0; i < 2; i++) {
    assert.equal(b.data[i].index, i);
    assert.equal(b.data[i].embedding.length, 16);
    assert.deepEqual(Array.from(b.data[i].embedding), f.data[i].embedding.map(Math.fround));
    const norm = f.data[i].embedding.reduce((s, x) => s + x * x, 0);
    assert.ok(Math.abs(norm - 1) < 1e-5, `unit length (${norm})`);
  }
  assert.ok(b.usage.prompt_tokens > 4);
  assert.equal(b.usage.total_tokens, b.usage.prompt_tokens);
  const one = await client.embeddings.create({ model: embed.model, input: 'hello world',
                                               encoding_format: 'float' });
  assert.deepEqual(one.data[0].embedding, f.data[0].embedding);
});

test('the embed server refuses rerank naming its task', async () => {
  const r = await postJson(embed.url, '/v1/rerank', { query: 'q', documents: ['a'] });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.code, 'wrong_task');
  assert.match(r.json.error.message, /task is embed/);
});

test('rerank and score', async () => {
  const docs = ['the fox', 'hello world', 'a dog sleeps'];
  const r = await postJson(rerank.url, '/v1/rerank', { query: 'where is the fox', documents: docs });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  assert.equal(r.json.results.length, 3);
  const scores = r.json.results.map((x) => x.relevance_score);
  assert.deepEqual(scores, [...scores].sort((a, b) => b - a));
  assert.deepEqual(r.json.results.map((x) => x.index).sort(), [0, 1, 2]);
  const s = await postJson(rerank.url, '/v1/score', { text_1: 'where is the fox', text_2: docs });
  assert.equal(s.status, 200);
  for (const x of r.json.results) {
    assert.ok(Math.abs(s.json.data[x.index].score - x.relevance_score) < 1e-6);
  }
  const bad = await postJson(rerank.url, '/v1/embeddings', { input: 'x' });
  assert.equal(bad.status, 400);
  assert.match(bad.json.error.message, /task is rerank/);
});

test('concurrent embeddings and scores, batched together, equal the answers alone', async () => {
  const texts = Array.from({ length: 24 }, (_, i) => `text number ${i} about ${'fox '.repeat(i % 5)}`);
  const alone = [];
  for (const t of texts) {
    const r = await postJson(embed.url, '/v1/embeddings', { input: [t, 'hello'] });
    assert.equal(r.status, 200);
    alone.push(r.json.data);
  }
  const together = await Promise.all(
    texts.map((t) => postJson(embed.url, '/v1/embeddings', { input: [t, 'hello'] })));
  together.forEach((r, i) => assert.deepEqual(r.json.data, alone[i], `request ${i}`));
  const docs = texts.slice(0, 8);
  const scoresAlone = [];
  for (const d of docs) {
    scoresAlone.push((await postJson(rerank.url, '/v1/score', { text_1: 'fox', text_2: d })).json.data);
  }
  const scores = await Promise.all(
    docs.map((d) => postJson(rerank.url, '/v1/score', { text_1: 'fox', text_2: d })));
  scores.forEach((r, i) => assert.deepEqual(r.json.data, scoresAlone[i], `score ${i}`));
  const metrics = await (await fetch(`${embed.url}/metrics`)).text();
  assert.match(metrics, /gizllm_encoder_batches_total \d+/);
});

test('prompt_name and Matryoshka dimensions from the model folder', async () => {
  const embedding = async (body) => {
    const r = await postJson(prompted.url, '/v1/embeddings', body);
    assert.equal(r.status, 200, JSON.stringify(r.json));
    return r.json.data[0].embedding;
  };
  // The default prompt "query: " is the text written out with the empty prompt "none".
  const byDefault = await embedding({ input: 'the fox' });
  assert.deepEqual(await embedding({ input: 'query: the fox', prompt_name: 'none' }), byDefault);
  assert.notDeepEqual(await embedding({ input: 'the fox', prompt_name: 'none' }), byDefault);
  const unknown = await postJson(prompted.url, '/v1/embeddings', { input: 'x', prompt_name: 'p' });
  assert.equal(unknown.status, 400);
  assert.equal(unknown.json.error.param, 'prompt_name');
  // matryoshka_dimensions [16, 8, 4]: the first 8 floats, normalized again.
  const cut = await embedding({ input: 'the fox', dimensions: 8 });
  assert.equal(cut.length, 8);
  const norm = Math.sqrt(byDefault.slice(0, 8).reduce((s, x) => s + x * x, 0));
  cut.forEach((x, i) => assert.ok(Math.abs(x - byDefault[i] / norm) < 1e-6, `${i}: ${x}`));
  const odd = await postJson(prompted.url, '/v1/embeddings', { input: 'x', dimensions: 5 });
  assert.equal(odd.status, 400);
  assert.equal(odd.json.error.param, 'dimensions');
  const plain = await postJson(embed.url, '/v1/embeddings', { input: 'x', dimensions: 8 });
  assert.equal(plain.status, 400);
  assert.match(plain.json.error.message, /dimensions/);
});

test('a decoder whose config names its yes/no tokens serves the rerank task', async () => {
  const yesNo = path.join(dir, 'yes-no');
  fs.mkdirSync(yesNo);
  for (const f of ['model.safetensors', 'tokenizer.json', 'tokenizer_config.json']) {
    fs.symlinkSync(path.resolve('models/tiny-chat', f), path.join(yesNo, f));
  }
  const config = JSON.parse(fs.readFileSync('models/tiny-chat/config.json', 'utf8'));
  config.classifier_from_token = ['no', 'Yes'];
  fs.writeFileSync(path.join(yesNo, 'config.json'), JSON.stringify(config));
  const server = await startServer(['--exact'], { model: yesNo });
  try {
    const models = await (await fetch(`${server.url}/v1/models`)).json();
    assert.equal(models.data[0].task, 'rerank');
    const docs = ['In the beginning God created the heaven and the earth.', 'import os'];
    const r = await postJson(server.url, '/v1/rerank', { query: 'Recite Genesis 1:1.', documents: docs });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    assert.equal(r.json.results.length, 2);
    for (const x of r.json.results) assert.ok(x.relevance_score > 0 && x.relevance_score < 1);
    const s = await postJson(server.url, '/v1/score', { text_1: 'Recite Genesis 1:1.', text_2: docs });
    for (const x of r.json.results) {
      assert.ok(Math.abs(s.json.data[x.index].score - x.relevance_score) < 1e-6);
    }
  } finally {
    assert.equal(await server.stop(), 0);
  }
});
