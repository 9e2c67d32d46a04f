// Structured output end to end: `gizllm run --json-schema` on tiny-chat at temperature 1, every
// schema of tests/grammar/schemas under GIZLLM_SEEDS seeds (1 by default); each answer must parse as JSON and pass
// ajv's draft 2020-12 validator (with its formats). An answer cut by --max-tokens fails too,
// except under the schemas whose documents have no longest one (`unbounded`: a map's keys are
// strings of any length, recursion of any depth); the limit leaves room for the longest document
// of every other schema.
//   GIZLLM=build/gizllm node --test tests/grammar/structured_output.test.mjs
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const gizllm = process.env.GIZLLM ?? "build/gizllm";
const model = process.env.GIZLLM_MODEL ?? "models/tiny-chat";
const dir = "tests/grammar/schemas";
const seeds = Number(process.env.GIZLLM_SEEDS ?? 1);
const maxTokens = 2048;
const unbounded = new Set(["016_recursive_tree.json", "018_map_counts.json", "031_linked_list.json"]);

const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);

const prompt = "<|im_start|>user\nAnswer with one JSON document.<|im_end|>\n<|im_start|>assistant\n";

for (const file of readdirSync(dir).filter((f) => f.endsWith(".json")).sort()) {
  test(file, () => {
    const path = join(dir, file);
    const validate = ajv.compile(JSON.parse(readFileSync(path, "utf8")));
    for (let seed = 1; seed <= seeds; ++seed) {
      const run = spawnSync(gizllm, ["run", "--model", model, "--json-schema", path,
        "--temperature", "1", "--top-p", "1", "--seed", String(seed), "-n", String(maxTokens),
        "--prompt", prompt], { encoding: "utf8" });
      assert.equal(run.status, 0, `${file} seed ${seed}: ${run.stderr}`);
      if (unbounded.has(file) && /ended: length/.test(run.stderr)) continue;
      assert.match(run.stderr, /ended: stop/, `${file} seed ${seed}: cut, ${run.stdout}`);
      let doc;
      try {
        doc = JSON.parse(run.stdout);
      } catch (e) {
        assert.fail(`${file} seed ${seed}: not JSON: ${run.stdout}`);
      }
      assert.ok(validate(doc), `${file} seed ${seed}: ${run.stdout.trim()}: ` +
        JSON.stringify(validate.errors));
    }
  });
}

test("unsupported schemas are refused with the path", () => {
  const run = spawnSync(gizllm, ["run", "--model", model, "--json-schema",
    "tests/grammar/refused/pattern_properties.json", "-n", "8", "--prompt", "x"],
    { encoding: "utf8" });
  assert.notEqual(run.status, 0);
  assert.match(run.stderr, /#\/properties\/tags\/patternProperties: unsupported keyword/);
});
