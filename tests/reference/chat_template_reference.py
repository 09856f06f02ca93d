"""Renders chat templates the way Hugging Face transformers' apply_chat_template does (Jinja2
sandbox, trim_blocks, lstrip_blocks, loop controls), as the reference for flashdraft's C++ Qwen3
template. Run with /usr/bin/python3 (Debian's python3-jinja2).

  chat_template_reference.py tokenizer_config.json convs.json out.json
convs: [{"messages": [...], "add_generation_prompt": bool, "enable_thinking": bool}] -> [text]
"""
import json
import sys

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise ValueError(message)


def main():
    config_path, convs_path, out_path = sys.argv[1:4]
    with open(config_path, encoding="utf-8") as f:
        template_text = json.load(f)["chat_template"]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(template_text)
    with open(convs_path, encoding="utf-8") as f:
        convs = json.load(f)
    out = []
    for conv in convs:
        kwargs = {"messages": conv["messages"],
                  "add_generation_prompt": conv.get("add_generation_prompt", False)}
        if "enable_thinking" in conv:
            kwargs["enable_thinking"] = conv["enable_thinking"]
        out.append(template.render(**kwargs))
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
