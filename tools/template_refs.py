#!/usr/bin/env python3
"""Reference chat-template renderings from transformers, for tests/golden/template.

For each template folder (chat_template.jinja plus a tokenizer_config.json with the special
tokens) and each case of cases.jsonl, renders the chat with transformers' own chat-template
function (transformers.utils.chat_template_utils.render_jinja_template, what
apply_chat_template(tokenize=False) calls) and writes one JSON line:
  {"template": NAME, "case": CASE, "prompt": TEXT}   or   {"template": ..., "case": ..., "error": MESSAGE}

Runs where transformers is installed (no network needed):
  python3 tools/template_refs.py --out tests/golden/template/refs.jsonl
--jinja2 renders with plain jinja2 set up as transformers sets it, for development only.
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden", "template")
TEMPLATES = {
    "qwen3": os.path.join(GOLDEN, "qwen3"),
    "llama3": os.path.join(GOLDEN, "llama3"),
    "gemma3": os.path.join(GOLDEN, "gemma3"),
    "tiny-chat": os.path.join(ROOT, "models", "tiny-chat"),
    # Written for the tests: many of the Jinja features real templates use, in one template.
    "coverage": os.path.join(GOLDEN, "coverage"),
}
CASE_KEYS = ("name", "messages", "tools", "add_generation_prompt")


def load_template(folder):
    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    jinja_path = os.path.join(folder, "chat_template.jinja")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            source = f.read()
    else:
        source = config["chat_template"]
    tokens = {}
    for key in ("bos_token", "eos_token"):
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if value is not None:
            tokens[key] = value
    return source, tokens


def transformers_renderer():
    import transformers
    from transformers.utils.chat_template_utils import render_jinja_template

    def render(source, messages, tools, add_generation_prompt, kwargs):
        out = render_jinja_template(conversations=[messages], tools=tools, chat_template=source,
                                    add_generation_prompt=add_generation_prompt, **kwargs)
        if isinstance(out, tuple):
            out = out[0]
        return out[0]

    return render, "transformers " + transformers.__version__


def jinja2_renderer():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception

    def render(source, messages, tools, add_generation_prompt, kwargs):
        return env.from_string(source).render(messages=messages, tools=tools, documents=None,
                                              add_generation_prompt=add_generation_prompt,
                                              **kwargs)

    return render, "jinja2 " + jinja2.__version__ + " (development only)"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default=os.path.join(GOLDEN, "cases.jsonl"))
    parser.add_argument("--jinja2", action="store_true", help="plain jinja2 (development)")
    args = parser.parse_args()
    render, renderer = jinja2_renderer() if args.jinja2 else transformers_renderer()
    with open(args.cases, encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    count = 0
    with open(args.out, "w", encoding="utf-8") as out:
        for name, folder in TEMPLATES.items():
            source, tokens = load_template(folder)
            for case in cases:
                kwargs = dict(tokens)
                kwargs.update({k: v for k, v in case.items() if k not in CASE_KEYS})
                row = {"template": name, "case": case["name"], "renderer": renderer}
                try:
                    row["prompt"] = render(source, case["messages"], case.get("tools"),
                                           case.get("add_generation_prompt", False), kwargs)
                except Exception as e:  # the template's own error, e.g. raise_exception
                    row["error"] = type(e).__name__ + ": " + str(e)
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
                count += 1
    print(f"{renderer}: wrote {count} renderings to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
