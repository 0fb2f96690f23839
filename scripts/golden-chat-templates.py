#!/usr/bin/env python3
"""golden-chat-templates.py - the golden outputs of tests/data/chat_templates (test_jinja), rendered by Jinja2 itself
(Debian's python3-jinja2, 3.1) in the environment Hugging Face transformers' apply_chat_template renders in: a
sandboxed environment with trim_blocks and lstrip_blocks, loop controls, raise_exception, strftime_now, and
transformers' tojson (json.dumps, non-ASCII kept, keys in their order). Every template (*.jinja, the file's text
as it is) against every case of cases.json, with and without the generation prompt; the context is the case's
messages and vars, bos_token "<s>", eos_token "</s>". Writes golden.json: one entry per render, its output, the
message the template raised (raise_exception), or the error Python met (the engine must fail too). Run it again after changing a template or a case:
    /usr/bin/python3 scripts/golden-chat-templates.py
"""
import glob
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "chat_templates")


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    with open(os.path.join(HERE, "cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    out = []
    for path in sorted(glob.glob(os.path.join(HERE, "*.jinja"))):
        with open(path, encoding="utf-8") as f:
            tmpl = env.from_string(f.read())
        for case in cases:
            for gen in (True, False):
                ctx = dict(case.get("vars", {}), messages=case["messages"], bos_token="<s>", eos_token="</s>",
                           add_generation_prompt=gen)
                entry = {"template": os.path.basename(path), "case": case["name"], "add_generation_prompt": gen}
                try:
                    entry["output"] = tmpl.render(**ctx)
                except TemplateError as e:  # raise_exception's: the engine must say the same
                    entry["raised"] = str(e)
                except Exception as e:  # a type error of the template's (a dict's content added to a string)
                    entry["error"] = f"{type(e).__name__}: {e}"
                out.append(entry)
    with open(os.path.join(HERE, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(out)} renders by Jinja2 {jinja2.__version__} into {os.path.join(HERE, 'golden.json')}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
