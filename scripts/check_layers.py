#!/usr/bin/env python3
"""The modules' layers: a file of src/<module>/ includes only its own module's headers and those of
the modules below it. Reads every `#include "<module>/..."` under src/ and fails, naming the file,
the line and the include, where a module includes one above it, or where a folder of src/ is not
in the order. The order is the one of docs/ARCHITECTURE.md (Layers) and of the libraries in the
CMake files. Usage: check_layers.py [source root, default: the repository's src/]."""

import os
import re
import sys

# Lowest first. A module may include itself and any module before it.
LAYERS = [
    "core",
    "formats",
    "vision",
    "tokenizer",
    "template",
    "grammar",
    "ops",
    "quant",
    "sampling",
    "backend",
    "model",
    "jobs",
    "engine",
    "server",
    "cli",
]

# Narrower than the order: these modules reach the backends only through ops/ (ops/device.h).
NEVER = {
    "model": {"backend"},
    "engine": {"backend"},
}

INCLUDE = re.compile(r'^\s*#\s*include\s*"([A-Za-z0-9_]+)/[^"]*"')
SOURCES = (".h", ".cc", ".cu", ".cuh")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "src")
    root = os.path.normpath(root)
    rank = {m: i for i, m in enumerate(LAYERS)}
    errors = []
    for module in sorted(os.listdir(root)):
        if not os.path.isdir(os.path.join(root, module)):
            continue
        if module not in rank:
            errors.append(f"src/{module}/: a module not in the order (add it to LAYERS in "
                          f"scripts/check_layers.py and to docs/ARCHITECTURE.md)")
            continue
        for folder, _, files in os.walk(os.path.join(root, module)):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(folder, name)
                shown = "src/" + os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        used = m.group(1)
                        if used not in rank:
                            continue  # not a module of src/ (e.g. tests/golden/...)
                        include = line.strip()
                        if rank[used] > rank[module]:
                            errors.append(f"{shown}:{number}: {include}: {module}/ includes "
                                          f"{used}/, which is above it")
                        elif used in NEVER.get(module, ()):
                            errors.append(f"{shown}:{number}: {include}: {module}/ never "
                                          f"includes {used}/")
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"layers: {len(errors)} include(s) out of order; lowest first: "
              + " ".join(LAYERS), file=sys.stderr)
        return 1
    print("layers: " + " < ".join(LAYERS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
