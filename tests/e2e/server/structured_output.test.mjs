// Structured output through the server: every schema of tests/grammar/schemas as
// response_format json_schema (strict), sent at once beside free requests (mixed batches) at
// temperature 1; each answer parses and passes ajv (draft 2020-12, formats). Also json_object,
// the fields of other servers (guided_json, json_schema, grammar, guided_grammar, guided_regex,
// guided_choice, structured_outputs), and streams.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import OpenAI from 'openai';
import { startServer, postJson } from './harness.mjs';

const dir = 'tests/grammar/schemas';
const unbounded = new Set(['016_recursive_tree.json', '018_map_counts.json',
                            '031_linked_list.json']);  // no longest document: a cut may happen
let server;
let client;
const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);

before(async () => {
  server = await startServer(['--slots', '8', '--context', '2048', '--kv-mib', '64']);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0,
                        timeout: 600000 });
});

after(async () => {
  assert.equal(await server.stop(), 0);
});

function ask(extra, seed) {
  return client.chat.completions.create({
    model: server.model, messages: [{ role: 'user', content: 'Answer with one JSON document.' }],
    max_tokens: 1900, temperature: 1, seed, ...extra,
  });
}

test('every schema, at once beside free requests, gives valid documents', async () => {
  const files = readdirSync(dir).filter((f) => f.endsWith('.json')).sort();
  const jobs = [];
  files.forEach((file, i) => {
    const schema = JSON.parse(readFileSync(join(dir, file), 'utf8'));
    jobs.push(ask({ response_format: { type: 'json_schema',
      json_schema: { name: 'doc', strict: true, schema } } }, 100 + i)
      .then((r) => ({ file, schema, r })));
    if (i % 4 === 0) jobs.push(ask({ max_tokens: 24 }, i).then((r) => ({ file: null, r })));
  });
  for (const { file, schema, r } of await Promise.all(jobs)) {
    const choice = r.choices[0];
    if (file === null) continue;
    if (unbounded.has(file) && choice.finish_reason === 'length') continue;
    assert.equal(choice.finish_reason, 'stop', `${file}: ${choice.message.content}`);
    let doc;
    try {
      doc = JSON.parse(choice.message.content);
    } catch {
      assert.fail(`${file}: not JSON: ${choice.message.content}`);
    }
    const validate = ajv.compile(schema);
    assert.ok(validate(doc), `${file}: ${choice.message.content}: ${JSON.stringify(validate.errors)}`);
  }
});

test('requests of one schema share their masks', async () => {
  const metric = async () => {
    const text = await (await fetch(`${server.url}/metrics`)).text();
    return Number(/^gizllm_grammar_masks_shared_total (\S+)$/m.exec(text)[1]);
  };
  const before = await metric();
  const schema = JSON.parse(readFileSync(join(dir, '001_person.json'), 'utf8'));
  const answers = await Promise.all([0, 1, 2, 3].map((i) => ask({ temperature: 0,
    response_format: { type: 'json_schema', json_schema: { name: 'p', strict: true, schema } } },
  i)));
  for (const r of answers) JSON.parse(r.choices[0].message.content);
  // Greedy answers of one prompt walk the same states: the first request's masks serve the rest.
  assert.ok(await metric() > before, 'no mask was shared');
});

test('json_object and the other servers\' fields', async () => {
  const schema = { type: 'object', properties: { n: { type: 'integer', minimum: 1, maximum: 9 } },
                   required: ['n'], additionalProperties: false };
  const cases = [
    { response_format: { type: 'json_object' } },
    { guided_json: schema },
    { json_schema: schema },
    { grammar: 'root ::= "{\\"n\\":" [1-9] "}"' },
    { guided_grammar: 'root ::= "{\\"n\\":" [1-9] "}"' },
    { guided_regex: '\\{"n":[1-9]\\}' },
    { structured_outputs: { json: schema } },
    { structured_outputs: { regex: '^\\{"n": ?[1-9]\\}$' } },
  ];
  for (const [i, extra] of cases.entries()) {
    const r = await postJson(server.url, '/v1/chat/completions', {
      model: server.model, messages: [{ role: 'user', content: 'JSON please.' }],
      max_tokens: 1900, temperature: 1, seed: i, ...extra });
    assert.equal(r.status, 200, r.text);
    const content = r.json.choices[0].message.content;
    const doc = JSON.parse(content);
    assert.equal(typeof doc, 'object', content);
    if (i > 0) assert.ok(ajv.validate(schema, doc), content);
  }
});

test('a regex matches the whole answer; a choice is one of its strings', async () => {
  const phone = /^\(\d{3}\) \d{3}-\d{4}$/;
  const choices = ['red', 'green', 'blue or "teal"'];
  const cases = [
    [{ guided_regex: phone.source }, (t) => phone.test(t)],
    [{ structured_outputs: { regex: phone.source } }, (t) => phone.test(t)],
    [{ guided_choice: choices }, (t) => choices.includes(t)],
    [{ structured_outputs: { choice: choices } }, (t) => choices.includes(t)],
  ];
  for (const [i, [extra, ok]] of cases.entries()) {
    const r = await postJson(server.url, '/v1/chat/completions', {
      model: server.model, messages: [{ role: 'user', content: 'Answer.' }],
      max_tokens: 64, temperature: 1, seed: i, ...extra });
    assert.equal(r.status, 200, r.text);
    const content = r.json.choices[0].message.content;
    assert.equal(r.json.choices[0].finish_reason, 'stop', content);
    assert.ok(ok(content), `${JSON.stringify(extra)}: ${content}`);
  }
  const bad = await postJson(server.url, '/v1/chat/completions', {
    model: server.model, messages: [{ role: 'user', content: 'Answer.' }],
    guided_regex: 'a(?=b)' });
  assert.equal(bad.status, 400, bad.text);
  assert.equal(bad.json.error.param, 'guided_regex');
  assert.match(bad.json.error.message, /position 1: a lookaround/);
});

test('a streamed answer under a schema is valid', async () => {
  const schema = JSON.parse(readFileSync(join(dir, '030_tool_call.json'), 'utf8'));
  const stream = await client.chat.completions.create({
    model: server.model, messages: [{ role: 'user', content: 'Call a tool.' }], max_tokens: 1900,
    temperature: 1, seed: 5, stream: true,
    response_format: { type: 'json_schema', json_schema: { name: 't', strict: true, schema } },
  });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  assert.ok(ajv.validate(schema, JSON.parse(text)), text);
});

test('a schema without strict that does not compile runs unconstrained and warns', async () => {
  const schema = { type: 'object', properties: { ip: { type: 'string', format: 'ipv4' } } };
  const body = (strict, stream) => ({
    model: server.model, messages: [{ role: 'user', content: 'Answer.' }], max_tokens: 8,
    temperature: 0, stream,
    response_format: { type: 'json_schema',
                       json_schema: { name: 'x', schema, ...(strict === undefined ? {} : { strict }) } },
  });
  for (const strict of [undefined, false]) {
    const r = await postJson(server.url, '/v1/chat/completions', body(strict, false));
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.warnings.length, 1, r.text);
    assert.match(r.json.warnings[0], /#\/properties\/ip\/format/);
    assert.match(r.json.warnings[0], /not constrained/);
    assert.equal(typeof r.json.choices[0].message.content, 'string');
  }
  // Streamed: the warning rides on the first chunk.
  const s = await postJson(server.url, '/v1/chat/completions', body(undefined, true));
  assert.equal(s.status, 200, s.text);
  const chunks = s.text.split('\n\n').filter((e) => e.startsWith('data: {'))
    .map((e) => JSON.parse(e.slice(6)));
  assert.match(chunks[0].warnings[0], /#\/properties\/ip\/format/);
  assert.ok(chunks.slice(1).every((c) => c.warnings === undefined));
  const strict = await postJson(server.url, '/v1/chat/completions', body(true, false));
  assert.equal(strict.status, 400, strict.text);
  assert.equal(strict.json.error.param, 'response_format.json_schema.schema');
});

test('a forced call is one call, or several with parallel_tool_calls', async () => {
  const parameters = { type: 'object', properties: { n: { type: 'integer', minimum: 1, maximum: 9 } },
                       required: ['n'], additionalProperties: false };
  const tools = ['first', 'second'].map((name) => ({ type: 'function', function: { name, parameters } }));
  const counts = { true: [], false: [] };
  for (const parallel of [true, false]) {
    for (let seed = 0; seed < 8; ++seed) {
      const r = await client.chat.completions.create({
        model: server.model, messages: [{ role: 'user', content: 'Call the tools.' }], tools,
        tool_choice: 'required', parallel_tool_calls: parallel, max_tokens: 1900, temperature: 1,
        seed });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c));
      for (const call of c.message.tool_calls) {
        assert.ok(['first', 'second'].includes(call.function.name));
        assert.ok(ajv.validate(parameters, JSON.parse(call.function.arguments)),
                  call.function.arguments);
      }
      counts[parallel].push(c.message.tool_calls.length);
    }
  }
  assert.ok(counts.false.every((n) => n === 1), JSON.stringify(counts));
  assert.ok(counts.true.every((n) => n >= 1), JSON.stringify(counts));
});
