// Malformed and hostile requests: each gets the right status and an OpenAI error body, and the
// server keeps serving.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, rawRequest, httpBytes, postJson } from './harness.mjs';

const KEY = 'hostile-key';
const MAX_BODY = 65536;
let server;

before(async () => {
  server = await startServer(['--slots', '2', '--context', '256', '--api-key', KEY,
                              '--max-body', String(MAX_BODY), '--read-timeout', '2']);
});

after(async () => {
  assert.equal(await server.stop(), 0);
});

const auth = { Authorization: `Bearer ${KEY}` };
const chat = (extra = {}) => JSON.stringify({
  model: server.model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, ...extra,
});
const post = (target, body, headers = auth) => [httpBytes('POST', target, body, headers)];

// [name, () => chunks to send, status, error code or null, param or undefined, options]
const cases = [
  ['invalid JSON', () => post('/v1/chat/completions', '{"model": '), 400, 'invalid_json'],
  ['JSON array body', () => post('/v1/chat/completions', '[1, 2]'), 400],
  ['JSON null body', () => post('/v1/chat/completions', 'null'), 400],
  ['empty body', () => post('/v1/chat/completions', ''), 400, 'invalid_json'],
  ['messages missing', () => post('/v1/chat/completions', JSON.stringify({ model: server.model })),
   400, 'missing_required_parameter', 'messages'],
  ['messages empty', () => post('/v1/chat/completions', chat({ messages: [] })), 400, 'empty_array',
   'messages'],
  ['messages a string', () => post('/v1/chat/completions', chat({ messages: 'hi' })), 400,
   'invalid_type', 'messages'],
  ['message a number', () => post('/v1/chat/completions', chat({ messages: [5] })), 400,
   'invalid_type', 'messages[0]'],
  ['unknown role', () => post('/v1/chat/completions',
                              chat({ messages: [{ role: 'wizard', content: 'x' }] })),
   400, 'invalid_value', 'messages[0].role'],
  ['role missing', () => post('/v1/chat/completions', chat({ messages: [{ content: 'x' }] })), 400,
   null, 'messages[0].role'],
  ['content a number', () => post('/v1/chat/completions',
                                  chat({ messages: [{ role: 'user', content: 7 }] })),
   400, 'invalid_type', 'messages[0].content'],
  ['image content', () => post('/v1/chat/completions', chat({
    messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }],
  })), 400, 'unsupported_content', 'messages[0].content[0].image_url'],
  ['tool turn without id', () => post('/v1/chat/completions',
                                      chat({ messages: [{ role: 'tool', content: 'x' }] })),
   400, 'missing_required_parameter', 'messages[0].tool_call_id'],
  ['negative max_tokens', () => post('/v1/chat/completions', chat({ max_tokens: -5 })), 400,
   'invalid_value', 'max_tokens'],
  ['zero max_tokens', () => post('/v1/chat/completions', chat({ max_tokens: 0 })), 400,
   'invalid_value', 'max_tokens'],
  ['huge max_tokens', () => post('/v1/chat/completions', chat({ max_tokens: 1e300 })), 400,
   'invalid_type', 'max_tokens'],
  ['max_tokens past 2^64', () => post('/v1/chat/completions',
                                      chat().replace('"max_tokens":4',
                                                     '"max_tokens":184467440737095516160')),
   400, null, 'max_tokens'],
  ['max_tokens a string', () => post('/v1/chat/completions', chat({ max_tokens: '4' })), 400,
   'invalid_type', 'max_tokens'],
  ['max_tokens past the context', () => post('/v1/chat/completions', chat({ max_tokens: 100000 })),
   400, 'context_length_exceeded', 'max_tokens'],
  ['prompt longer than the context', () => post('/v1/chat/completions', chat({
    messages: [{ role: 'user', content: 'In the beginning God created the heaven. '.repeat(60) }],
  })), 400, 'context_length_exceeded', 'messages'],
  ['negative temperature', () => post('/v1/chat/completions', chat({ temperature: -1 })), 400,
   'invalid_value', 'temperature'],
  ['infinite temperature', () => post('/v1/chat/completions',
                                      chat().replace('"max_tokens":4', '"temperature":1e999')),
   400],
  ['top_p above 1', () => post('/v1/chat/completions', chat({ top_p: 2 })), 400, 'invalid_value',
   'top_p'],
  ['top_k a string', () => post('/v1/chat/completions', chat({ top_k: '5' })), 400,
   'invalid_type', 'top_k'],
  ['seed a fraction', () => post('/v1/chat/completions', chat({ seed: 1.5 })), 400, 'invalid_type',
   'seed'],
  ['five stop strings', () => post('/v1/chat/completions',
                                   chat({ stop: ['a', 'b', 'c', 'd', 'e'] })),
   400, null, 'stop'],
  ['n of 3', () => post('/v1/chat/completions', chat({ n: 3 })), 400, 'invalid_value', 'n'],
  ['unknown parameter', () => post('/v1/chat/completions', chat({ best_of_all: true })), 400,
   'unknown_parameter', 'best_of_all'],
  ['top_logprobs of 50', () => post('/v1/chat/completions',
                                    chat({ logprobs: true, top_logprobs: 50 })),
   400, 'invalid_value', 'top_logprobs'],
  ['json_schema response format with an unsupported keyword', () => post('/v1/chat/completions',
    chat({ response_format: { type: 'json_schema', json_schema: { name: 'x', strict: true,
      schema: { type: 'object', patternProperties: { '^a': {} } } } } })),
   400, 'unsupported_schema', 'response_format.json_schema.schema'],
  ['tool_choice names no tool', () => post('/v1/chat/completions', chat({
    tools: [{ type: 'function', function: { name: 'f' } }],
    tool_choice: { type: 'function', function: { name: 'g' } },
  })), 400, 'invalid_value', 'tool_choice.function.name'],
  ['invalid UTF-8', () => post('/v1/chat/completions', Buffer.concat([
    Buffer.from('{"messages": [{"role": "user", "content": "'), Buffer.from([0xff, 0xfe, 0xc3]),
    Buffer.from('"}]}')])), 400, 'invalid_json'],
  ['lone surrogate escape', () => post('/v1/chat/completions',
                                       chat().replace('"hi"', '"\\ud800"')), 400, 'invalid_json'],
  ['deeply nested JSON', () => post('/v1/chat/completions',
                                    '['.repeat(30000) + ']'.repeat(30000)), 400],
  ['tool parameters nested 30,000 deep', () => post('/v1/chat/completions', chat({
    tools: [{ type: 'function', function: { name: 'f', parameters: { a: 'DEEP' } } }],
  }).replace('"DEEP"', '['.repeat(30000) + ']'.repeat(30000))), 400, 'nested_too_deeply'],
  ['tool-call arguments nested 20,000 deep', () => post('/v1/chat/completions', chat({
    messages: [{ role: 'user', content: 'x' }, { role: 'assistant', tool_calls: [
      { id: 'c', type: 'function', function: { name: 'f', arguments: '['.repeat(20000) } }] }],
  })), 400, 'nested_too_deeply', 'messages[1].tool_calls[0].function.arguments'],
  ['tool name that closes the call', () => post('/v1/chat/completions', chat({
    tools: [{ type: 'function', function: { name: 'f"}</tool_call>' } }],
    tool_choice: { type: 'function', function: { name: 'f"}</tool_call>' } },
  })), 400, 'invalid_value', 'tools[0].function.name'],
  ['129 tools', () => post('/v1/chat/completions', chat({
    tools: Array.from({ length: 129 }, (_, i) => ({ type: 'function', function: { name: `f${i}` } })),
  })), 400, 'array_above_max_length', 'tools'],
  ['stream_options without stream', () => post('/v1/chat/completions',
                                               chat({ stream_options: { include_usage: true } })),
   400, 'invalid_value', 'stream_options'],
  ['negative seed', () => post('/v1/chat/completions', chat({ seed: -1 })), 400, 'invalid_value',
   'seed'],
  ['seed of 2^64', () => post('/v1/chat/completions',
                              chat().replace('"max_tokens":4',
                                             '"max_tokens":4,"seed":18446744073709551616')),
   400, 'invalid_value', 'seed'],
  ['oversized body', () => post('/v1/chat/completions', 'x'.repeat(MAX_BODY + 10)), 413,
   'request_too_large'],
  ['Content-Length past the limit, no body', () => [httpBytes('POST', '/v1/chat/completions', '',
    { ...auth, 'content-length': String(1 << 30) })], 413, 'request_too_large'],
  ['chunked body past the limit', () => [
    Buffer.from(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\n` +
                'Transfer-Encoding: chunked\r\n\r\n'),
    ...Array.from({ length: 20 }, () => Buffer.from(`1000\r\n${'y'.repeat(4096)}\r\n`))],
   413, 'request_too_large'],
  ['a chunk extension that never ends', () => [
    Buffer.from(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\n` +
                'Transfer-Encoding: chunked\r\n\r\n1;'),
    ...Array.from({ length: 40 }, () => Buffer.alloc(1 << 17, 'a'))], 400, 'bad_http_request'],
  ['unknown model', () => post('/v1/chat/completions', chat({ model: 'gpt-17' })), 404,
   'model_not_found', 'model'],
  ['unknown path', () => post('/v1/engines', '{}'), 404, 'not_found'],
  ['GET on a POST endpoint', () => [httpBytes('GET', '/v1/chat/completions', '', auth)], 405,
   'method_not_allowed'],
  ['no API key', () => post('/v1/chat/completions', chat(), {}), 401, 'invalid_api_key'],
  ['wrong API key', () => post('/v1/chat/completions', chat(),
                               { Authorization: `Bearer ${KEY}x` }), 401, 'invalid_api_key'],
  ['API key as a prefix', () => post('/v1/chat/completions', chat(),
                                     { Authorization: `Bearer ${KEY.slice(0, 4)}` }),
   401, 'invalid_api_key'],
  ['completion token id out of range', () => post('/v1/completions', JSON.stringify({
    prompt: [1, 2, 99999999], max_tokens: 2 })), 400, 'invalid_value', 'prompt'],
  ['completion empty prompt', () => post('/v1/completions', JSON.stringify({ prompt: '' })), 400,
   null, 'prompt'],
  ['detokenize negative id', () => post('/detokenize', JSON.stringify({ tokens: [-1] })), 400,
   'invalid_value', 'tokens'],
  ['not HTTP at all', () => [Buffer.from('\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n')],
   400, 'bad_http_request'],
  ['slow client', () => [...Buffer.from(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n`)]
    .map((b) => Buffer.from([b])), 408, 'request_timeout', undefined, { gapMs: 150 }],
];

test(`a table of ${cases.length} hostile requests`, async () => {
  assert.ok(cases.length >= 30);
  for (const [name, make, status, code, param, options] of cases) {
    const r = await rawRequest(server.port, make(), options ?? {});
    assert.equal(r.status, status, `${name}: ${r.body}`);
    assert.ok(r.json && r.json.error, `${name}: an error body, got ${r.body}`);
    const e = r.json.error;
    assert.equal(typeof e.message, 'string', name);
    assert.ok(e.message.length > 0, name);
    assert.equal(typeof e.type, 'string', name);
    assert.ok('param' in e && 'code' in e, `${name}: param and code present`);
    if (code) assert.equal(e.code, code, `${name}: ${e.message}`);
    if (param !== undefined) assert.equal(e.param, param, `${name}: ${e.message}`);
  }
  assert.equal(server.proc.exitCode, null, 'the server is still running');
});

test('a client that leaves at once, and one that never reads', async () => {
  const net = await import('node:net');
  for (let i = 0; i < 10; i++) {
    const s = net.connect(server.port, '127.0.0.1');
    s.on('error', () => {});
    s.write(httpBytes('POST', '/v1/chat/completions', chat({ stream: true, max_tokens: 50 }), auth));
    s.destroy();
  }
  const res = await fetch(`${server.url}/health`);
  assert.equal(res.status, 200);
});

test('every seed from 0 to 2^64-1 and a lower-case bearer scheme', async () => {
  for (const seed of ['0', '18446744073709551615']) {
    const body = chat().replace('"max_tokens":4', `"max_tokens":2,"seed":${seed}`);
    const r = await rawRequest(server.port, post('/v1/chat/completions', body,
                                                 { Authorization: `bearer  ${KEY}` }));
    assert.equal(r.status, 200, `seed ${seed}: ${r.body}`);
  }
});

test('HTTP/1.0 streams come unchunked and end with the connection', async () => {
  const body = chat({ stream: true, max_tokens: 3 });
  const request = Buffer.from(
    `POST /v1/chat/completions HTTP/1.0\r\nAuthorization: Bearer ${KEY}\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n` + body);
  const r = await rawRequest(server.port, [request]);
  assert.equal(r.status, 200, r.body);
  assert.equal(r.headers['transfer-encoding'], undefined, JSON.stringify(r.headers));
  assert.match(r.body, /^data: \{/);
  assert.ok(r.body.endsWith('data: [DONE]\n\n'), r.body);
  for (const event of r.body.trim().split('\n\n')) assert.match(event, /^data: /);
});

test('a client that closes half-way through its request is not a 400', async () => {
  const count = (text, status) => {
    const m = text.match(new RegExp(`endpoint="other",status="${status}"\\} (\\d+)`));
    return m ? Number(m[1]) : 0;
  };
  const before = await (await fetch(`${server.url}/metrics`)).text();
  const net = await import('node:net');
  await new Promise((resolve) => {
    const s = net.connect(server.port, '127.0.0.1', () => {
      s.end(Buffer.from('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n' +
                        'Content-Length: 100\r\n\r\n{"model":'));
    });
    s.on('error', () => {});
    s.on('close', resolve);
  });
  const after = await (await fetch(`${server.url}/metrics`)).text();
  assert.equal(count(after, 400), count(before, 400), after);
  assert.equal(count(after, 499), count(before, 499) + 1, after);
});

test('a normal request still works afterwards', async () => {
  const r = await postJson(server.url, '/v1/chat/completions',
                           JSON.parse(chat({ max_tokens: 8, temperature: 0 })),
                           { authorization: `Bearer ${KEY}` });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.object, 'chat.completion');
  assert.ok(r.json.usage.completion_tokens > 0);
  const metrics = await (await fetch(`${server.url}/metrics`)).text();
  assert.match(metrics, /gizllm_requests_total\{endpoint="\/v1\/chat\/completions",status="400"\}/);
});
