// The official openai npm client against `gizllm serve` with tiny-chat.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, postJson } from './harness.mjs';

const KEY = 'e2e-key';
let server;
let client;

before(async () => {
  server = await startServer(['--slots', '4', '--context', '1024', '--api-key', KEY]);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 120000 });
});

after(async () => {
  assert.equal(await server.stop(), 0, 'the server exits cleanly on SIGTERM');
});

const verse = [{ role: 'user', content: 'Recite John 3:16.' }];
const auth = { authorization: `Bearer ${KEY}` };

async function metric(name) {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
}

test('plain chat', async () => {
  const r = await client.chat.completions.create({
    model: server.model, messages: verse, max_tokens: 48, temperature: 0,
  });
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, server.model);
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.ok(c.message.content.length > 0);
  assert.ok(['stop', 'length'].includes(c.finish_reason));
  // tiny-chat was trained on the Bible: its greedy answer recites a verse.
  assert.match(c.message.content, /God/);
  const u = r.usage;
  assert.ok(u.prompt_tokens > 0 && u.completion_tokens > 0 && u.completion_tokens <= 48);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  assert.equal(typeof u.prompt_tokens_details.cached_tokens, 'number');
  const t = await postJson(server.url, '/tokenize', { messages: verse }, auth);
  assert.equal(t.json.count, u.prompt_tokens);
});

test('streamed chat gives the same text as the plain one', async () => {
  const plain = await client.chat.completions.create({
    model: server.model, messages: verse, max_tokens: 32, temperature: 0,
  });
  const stream = await client.chat.completions.create({
    model: server.model, messages: verse, max_tokens: 32, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let chunks = 0;
  let finish = null;
  let usage = null;
  let role = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    chunks += 1;
    const d = chunk.choices[0].delta;
    if (d.role) role = d.role;
    text += d.content ?? '';
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(role, 'assistant');
  assert.ok(chunks > 2, 'the answer arrives in pieces');
  assert.equal(text, plain.choices[0].message.content);
  assert.equal(finish, plain.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, plain.usage.completion_tokens);
});

test('completion', async () => {
  const r = await client.completions.create({
    model: server.model, prompt: 'In the beginning God created', max_tokens: 8, temperature: 0,
  });
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.object, 'text_completion');
  assert.ok(r.choices[0].text.length > 0);
  assert.equal(r.usage.completion_tokens, 8);
  assert.equal(r.choices[0].finish_reason, 'length');
  // Token ids as the prompt give the same answer.
  const ids = (await postJson(server.url, '/tokenize', { prompt: 'In the beginning God created' },
                              auth)).json.tokens;
  const again = await client.completions.create({
    model: server.model, prompt: ids, max_tokens: 8, temperature: 0,
  });
  assert.equal(again.choices[0].text, r.choices[0].text);
  const back = await postJson(server.url, '/detokenize', { tokens: ids }, auth);
  assert.equal(back.json.prompt, 'In the beginning God created');
});

test('tool call round trip', async () => {
  const tools = [{
    type: 'function',
    function: {
      name: 'get_verse',
      description: 'Look up a Bible verse',
      parameters: { type: 'object', properties: { ref: { type: 'string' } }, required: ['ref'] },
    },
  }];
  const first = await client.chat.completions.create({
    model: server.model, messages: verse, tools,
    tool_choice: { type: 'function', function: { name: 'get_verse' } },
    max_tokens: 24, temperature: 0,
  });
  const c = first.choices[0];
  // tiny-chat never learned tools: the forced call may or may not close; either way the answer
  // is well formed, and a call that closes is parsed.
  if (c.finish_reason === 'tool_calls') {
    assert.equal(c.message.tool_calls[0].function.name, 'get_verse');
    assert.doesNotThrow(() => JSON.parse(c.message.tool_calls[0].function.arguments));
  } else {
    assert.equal(c.finish_reason, 'length');
  }
  // The client runs the tool and sends its result back.
  const messages = [
    ...verse,
    { role: 'assistant', content: null, tool_calls: [{
      id: 'call_1', type: 'function', function: { name: 'get_verse', arguments: '{"ref": "John 3:16"}' },
    }] },
    { role: 'tool', tool_call_id: 'call_1', content: 'For God so loved the world' },
  ];
  const second = await client.chat.completions.create({
    model: server.model, messages, tools, max_tokens: 16, temperature: 0,
  });
  assert.ok(['stop', 'length', 'tool_calls'].includes(second.choices[0].finish_reason));
  // The template rendered the result into the prompt the model read (tiny-chat's ChatML
  // template writes each turn's role and content; it has no place for tools or calls).
  const t = await postJson(server.url, '/tokenize', { messages, tools }, auth);
  assert.equal(t.json.count, second.usage.prompt_tokens);
  const text = (await postJson(server.url, '/detokenize', { tokens: t.json.tokens }, auth)).json
    .prompt;
  assert.match(text, /<\|im_start\|>tool\nFor God so loved the world<\|im_end\|>/);
  assert.match(text, /<\|im_start\|>assistant\n<\|im_end\|>/);
});

test('logprobs', async () => {
  const r = await client.chat.completions.create({
    model: server.model, messages: verse, max_tokens: 8, temperature: 0, logprobs: true,
    top_logprobs: 3,
  });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  for (const lp of content) {
    assert.ok(lp.logprob <= 0);
    assert.equal(lp.top_logprobs.length, 3);
    for (let i = 1; i < 3; i++) assert.ok(lp.top_logprobs[i - 1].logprob >= lp.top_logprobs[i].logprob);
    // Greedy: the chosen token is the most likely one.
    assert.equal(lp.top_logprobs[0].token, lp.token);
    assert.ok(Math.abs(lp.top_logprobs[0].logprob - lp.logprob) < 1e-6);
    assert.deepEqual(lp.bytes, [...Buffer.from(lp.token, 'utf8')]);
  }
  assert.equal(content.map((x) => x.token).join(''), r.choices[0].message.content);
});

test('a seeded sampled request repeats', async () => {
  const ask = (seed) => client.chat.completions.create({
    model: server.model, messages: [{ role: 'user', content: 'Tell me a fortune.' }],
    max_tokens: 32, temperature: 1.0, top_p: 0.95, seed,
  });
  const a = await ask(1234);
  const b = await ask(1234);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  const others = await Promise.all([ask(1), ask(2), ask(3)]);
  const texts = new Set([a, ...others].map((r) => r.choices[0].message.content));
  assert.ok(texts.size > 1, 'different seeds give different answers');
});

test('a request cancelled mid-stream frees its slot', async () => {
  const before = await metric('gizllm_request_finish_total\\{reason="cancelled"\\}');
  const controller = new AbortController();
  const stream = await client.chat.completions.create({
    model: server.model, messages: [{ role: 'user', content: 'Tell me a fortune.' }],
    max_tokens: 900, temperature: 1.0, seed: 5, stream: true,
  }, { signal: controller.signal });
  let chunks = 0;
  try {
    for await (const chunk of stream) {
      chunks += 1;
      if (chunks === 4) controller.abort();
    }
  } catch (e) {
    assert.match(String(e.name), /Abort/);
  }
  assert.ok(chunks >= 4 && chunks < 100, `stopped reading after ${chunks} chunks`);
  // The server sees the socket close and cancels within a step or two.
  const deadline = Date.now() + 5000;
  let running = await metric('gizllm_requests_running');
  while (running > 0 && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 20));
    running = await metric('gizllm_requests_running');
  }
  assert.equal(running, 0);
  const afterCount = await metric('gizllm_request_finish_total\\{reason="cancelled"\\}');
  assert.equal((Number.isNaN(afterCount) ? 0 : afterCount) - (Number.isNaN(before) ? 0 : before), 1);
});

test("a chat's next turn reads only what its slot does not hold", async () => {
  const turn1 = [{ role: 'user', content: 'Recite Psalms 23:1.' }];
  const first = await client.chat.completions.create({
    model: server.model, messages: turn1, max_tokens: 40, temperature: 0,
  });
  const answer = first.choices[0].message.content;
  const turn2 = [...turn1, { role: 'assistant', content: answer },
                 { role: 'user', content: 'Recite Psalms 23:2.' }];
  const second = await client.chat.completions.create({
    model: server.model, messages: turn2, max_tokens: 8, temperature: 0,
  });
  // The slot holds the first prompt and its answer; the second prompt starts with both.
  const p1 = (await postJson(server.url, '/tokenize', { messages: turn1 }, auth)).json.tokens;
  const p2 = (await postJson(server.url, '/tokenize', { messages: turn2 }, auth)).json.tokens;
  const held = p1.length + first.usage.completion_tokens;
  assert.equal(second.usage.prompt_tokens, p2.length);
  assert.equal(second.usage.prompt_tokens_details.cached_tokens, held);
  // What the second turn read: the end of the first answer's turn and the new user turn.
  const read = second.usage.prompt_tokens - second.usage.prompt_tokens_details.cached_tokens;
  assert.equal(read, p2.length - held);
  assert.ok(read < 30, `read ${read} of ${p2.length} tokens`);
});
