#!/usr/bin/env python3
"""Writes tests/grammar/schemas/1NN_*.json: random compositions of the supported keywords (seeded,
so the files are reproducible), beside the hand-written 0NN_*.json. Every string is bounded
(maxLength, enum, format or an anchored pattern) and every array has maxItems, so each schema has a
longest document. Usage: make_schemas.py [count, default 168]."""
import json
import os
import random
import sys

rng = random.Random(24)
NAMES = ["id", "name", "title", "kind", "count", "price", "tags", "items", "user", "meta", "when",
         "email", "code", "active", "score", "note", "parent", "size", "color", "level"]


def leaf(depth):
    k = rng.randrange(14)
    if k == 0:
        return {"type": "string", "maxLength": rng.randint(1, 16)}
    if k == 1:
        lo = rng.randint(0, 4)
        return {"type": "string", "minLength": lo, "maxLength": lo + rng.randint(0, 10)}
    if k == 2:
        lo = rng.randint(-10**rng.randint(0, 6), 10**rng.randint(0, 6))
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 10**rng.randint(0, 7))}
    if k == 3:
        s = {"type": "integer", "exclusiveMinimum": rng.randint(-100, 100)}
        s["exclusiveMaximum"] = s["exclusiveMinimum"] + rng.randint(2, 5000)
        return s
    if k == 4:
        lo = rng.randint(0, 50)
        return {"type": "number", "minimum": lo, "maximum": lo + rng.randint(0, 1000)}
    if k == 5:
        return {"type": "boolean"}
    if k == 6:
        return {"enum": rng.sample(["a", "b", "c", "x y", "Ünï", "日本", 1, 2.5, None, True], rng.randint(1, 5))}
    if k == 7:
        return {"const": rng.choice(["fixed", 7, False, None, {"k": [1, "two"]}])}
    if k == 8:
        return {"type": "string", "format": rng.choice(["date", "time", "date-time", "uuid", "email"])}
    if k == 9:
        return {"type": "string", "pattern": rng.choice(
            ["^[A-Z]{2,3}-[0-9]{1,4}$", "^(red|green|blue)$", "^\\d{3}\\.\\d{2}$", "^[a-f0-9]{8}$",
             "^x[yz]?w{0,3}$", "^\\w{1,6}@\\w{1,6}$"])}
    if k == 10:
        return {"type": ["integer", "null"], "minimum": 0, "maximum": rng.randint(1, 99)}
    if k == 11:
        return {"type": ["string", "null"], "maxLength": rng.randint(1, 8)}
    if k == 12:
        return {"type": "null"}
    return {"type": "integer", "minimum": -5, "maximum": 5}


def node(depth):
    k = rng.randrange(10) if depth < 3 else 0
    if k <= 3:
        return leaf(depth)
    if k <= 5:
        return obj(depth + 1)
    if k == 6:
        return {"type": "array", "items": node(depth + 1), "minItems": rng.randint(0, 2),
                "maxItems": rng.randint(2, 4)}
    if k == 7:
        return {"type": "array", "prefixItems": [node(depth + 1) for _ in range(rng.randint(1, 3))],
                "items": False}
    if k == 8:
        return {"anyOf": [node(depth + 1) for _ in range(rng.randint(2, 3))]}
    return {"oneOf": [{"type": "string", "maxLength": 5}, {"type": "integer", "minimum": 0, "maximum": 9},
                      {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}]}


def obj(depth):
    names = rng.sample(NAMES, rng.randint(1, 5))
    props = {n: node(depth) for n in names}
    req = [n for n in names if rng.random() < 0.6]
    s = {"type": "object", "properties": props, "required": req, "additionalProperties": False}
    if rng.random() < 0.2:
        s["title"] = "t"
        s["description"] = "generated"
    return s


def schema():
    k = rng.randrange(10)
    if k == 0:
        return {"$defs": {"item": obj(1)}, "type": "array", "items": {"$ref": "#/$defs/item"},
                "maxItems": 3}
    if k == 1:
        a, b = obj(1), obj(1)
        a.pop("additionalProperties")
        b.pop("additionalProperties")
        for n in list(b["properties"]):
            if n in a["properties"]:
                del b["properties"][n]
        b["required"] = [n for n in b["required"] if n in b["properties"]]
        return {"allOf": [a, b]}
    if k == 2:
        # A chain of references three deep (bounded, unlike a recursive one).
        v = leaf(1)
        defs = {"n3": {"type": "object", "properties": {"v": v}, "required": ["v"],
                       "additionalProperties": False}}
        for a, b in (("n2", "n3"), ("n1", "n2")):
            defs[a] = {"type": "object", "properties": {"v": v, "next": {
                "anyOf": [{"$ref": "#/$defs/" + b}, {"type": "null"}]}}, "required": ["v"],
                "additionalProperties": False}
        return {"$defs": defs, "$ref": "#/$defs/n1"}
    return obj(0)


count = int(sys.argv[1]) if len(sys.argv) > 1 else 168
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemas")
for i in range(count):
    with open(os.path.join(out, f"{100 + i:03d}_generated.json"), "w") as f:
        f.write(json.dumps(schema(), ensure_ascii=False) + "\n")
