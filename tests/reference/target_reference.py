"""Independent reference for the target decoders (Hugging Face Qwen3 / Llama semantics, float64).

Writes a tiny random model as a Hugging Face folder (config.json + weights, optionally sharded with
model.safetensors.index.json), an ids file, and the expected per-layer outputs and logits:
  usage: target_reference.py OUT_DIR --arch qwen3|llama [--layers 4] [--tied] [--sharded]
                             [--rope-scaling] [--ids-layers 1,3] [--seed 0]
Files: OUT_DIR/model/..., OUT_DIR/ids.safetensors (input_ids [b,S] I64),
       OUT_DIR/ref.safetensors (hidden_states [b,S,n*H] F32 for --ids-layers, logits [b,S,V] F32).
"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dflash_reference import write_safetensors  # noqa: E402


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def inv_freq(cfg):
    hd = cfg["head_dim"]
    inv = cfg["rope_theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    rs = cfg.get("rope_scaling")
    if rs:  # HF _compute_llama3_parameters
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wl, high_wl = old / low, old / high
        wl = 2 * math.pi / inv
        inv_l = torch.where(wl > low_wl, inv / factor, inv)
        smooth = (old / wl - low) / (high - low)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wl < high_wl) * ~(wl > low_wl)
        inv = torch.where(medium, smoothed, inv_l)
    return inv


def forward(cfg, w, ids):
    H, nh, kvh, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, L = cfg["rms_norm_eps"], cfg["num_hidden_layers"]
    b, S = ids.shape
    x = w["model.embed_tokens.weight"][ids]
    f = torch.arange(S, dtype=torch.float64)[:, None] * inv_freq(cfg)[None]
    emb = torch.cat([f, f], -1)
    cos, sin = emb.cos(), emb.sin()

    def rope(t):
        t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
        return t * cos + torch.cat([-t2, t1], -1) * sin

    mask = torch.ones(S, S, dtype=torch.bool).tril()
    hidden = [x]
    for i in range(L):
        p = f"model.layers.{i}."
        xn = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        q = (xn @ w[p + "self_attn.q_proj.weight"].T).view(b, S, nh, hd)
        k = (xn @ w[p + "self_attn.k_proj.weight"].T).view(b, S, kvh, hd)
        v = (xn @ w[p + "self_attn.v_proj.weight"].T).view(b, S, kvh, hd).transpose(1, 2)
        if cfg["model_type"] == "qwen3":
            q = rmsnorm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q.transpose(1, 2)), rope(k.transpose(1, 2))
        k, v = k.repeat_interleave(nh // kvh, 1), v.repeat_interleave(nh // kvh, 1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        a = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v
        x = x + a.transpose(1, 2).reshape(b, S, -1) @ w[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + (torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T) *
                 (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        hidden.append(x)
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
    # As Hugging Face's output_hidden_states: the last entry is after the final norm.
    hidden[-1] = rmsnorm(x, w["model.norm.weight"], eps)
    logits = hidden[-1] @ head.T
    return hidden, logits  # hidden[i + 1] is the output of decoder layer i (the last one normed)


def read_safetensors(path):
    import struct
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        b, e = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[8 + n + b:8 + n + e]), dtype=torch.float32)
        out[name] = t.reshape(info["shape"]).double()
    return out


def reference_for_existing(a):
    """Reference outputs of an existing folder (make-tiny-target's), on random ids."""
    cfg = json.load(open(os.path.join(a.existing, "config.json")))
    w = read_safetensors(os.path.join(a.existing, "model.safetensors"))
    g = torch.Generator().manual_seed(a.seed)
    ids = torch.randint(0, cfg["vocab_size"], (2, 24), generator=g)
    os.makedirs(a.out, exist_ok=True)
    write_ids_and_reference(a, cfg, w, ids)


def write_ids_and_reference(a, cfg, w, ids):
    """OUT/ids.safetensors and OUT/ref.safetensors (features of --ids-layers, logits)."""
    write_safetensors(os.path.join(a.out, "ids.safetensors"), {"input_ids": ids})
    hidden, logits = forward(cfg, w, ids)
    layers = [int(x) for x in a.ids_layers.split(",")]
    feats = torch.cat([hidden[i + 1] for i in layers], -1)
    write_safetensors(os.path.join(a.out, "ref.safetensors"),
                      {"hidden_states": feats.float(), "logits": logits.float()})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--arch", default="qwen3")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--sharded", action="store_true")
    ap.add_argument("--rope-scaling", action="store_true")
    ap.add_argument("--ids-layers", default="1,3")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=101)
    ap.add_argument("--existing", help="instead of a random model: this Hugging Face folder "
                    "(config.json + model.safetensors); writes only ids and ref")
    a = ap.parse_args()
    if a.existing:
        reference_for_existing(a)
        return
    g = torch.Generator().manual_seed(a.seed)
    H, nh, kvh, hd, inter, V = 32, 4, 2, 8, 64, a.vocab
    cfg = {"model_type": a.arch, "architectures": ["Qwen3ForCausalLM" if a.arch == "qwen3" else "LlamaForCausalLM"],
           "hidden_size": H, "intermediate_size": inter, "num_hidden_layers": a.layers,
           "num_attention_heads": nh, "num_key_value_heads": kvh, "head_dim": hd, "vocab_size": V,
           "rms_norm_eps": 1e-6, "rope_theta": 1e6 if a.arch == "qwen3" else 5e5,
           "tie_word_embeddings": a.tied, "max_position_embeddings": 4096}
    if a.rope_scaling:
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}

    def rnd(*shape, scale=0.2):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).float().double()

    w = {"model.embed_tokens.weight": rnd(V, H, scale=1.0), "model.norm.weight": 1 + rnd(H, scale=0.1)}
    if not a.tied:
        w["lm_head.weight"] = rnd(V, H)
    for i in range(a.layers):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": 1 + rnd(H, scale=0.1),
                  p + "post_attention_layernorm.weight": 1 + rnd(H, scale=0.1),
                  p + "self_attn.q_proj.weight": rnd(nh * hd, H), p + "self_attn.k_proj.weight": rnd(kvh * hd, H),
                  p + "self_attn.v_proj.weight": rnd(kvh * hd, H), p + "self_attn.o_proj.weight": rnd(H, nh * hd),
                  p + "mlp.gate_proj.weight": rnd(inter, H), p + "mlp.up_proj.weight": rnd(inter, H),
                  p + "mlp.down_proj.weight": rnd(H, inter)})
        if a.arch == "qwen3":
            w[p + "self_attn.q_norm.weight"] = 1 + rnd(hd, scale=0.1)
            w[p + "self_attn.k_norm.weight"] = 1 + rnd(hd, scale=0.1)
    mdir = os.path.join(a.out, "model")
    os.makedirs(mdir, exist_ok=True)
    json.dump(cfg, open(os.path.join(mdir, "config.json"), "w"), indent=2)
    names = sorted(w)
    if a.sharded:
        half = len(names) // 2
        shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
        for fname, keys in shards.items():
            write_safetensors(os.path.join(mdir, fname), {k: w[k].float() for k in keys})
        json.dump({"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}},
                  open(os.path.join(mdir, "model.safetensors.index.json"), "w"))
    else:
        write_safetensors(os.path.join(mdir, "model.safetensors"), {k: w[k].float() for k in names})
    ids = torch.randint(0, V, (2, 24), generator=g)
    write_ids_and_reference(a, cfg, w, ids)


if __name__ == "__main__":
    main()
