"""Peer of target_forward_bench.cc: writes a random Qwen3-shaped HF folder (fp32) and times the same
forward pass (hidden states of the feature layers and, with --logits 1, the logits) in PyTorch eager,
fp32, on the same LibTorch, with the dense [S, S] masked softmax Hugging Face's eager attention uses.
Prints: py tokens_per_s=... best_s=... peak_rss_mib=... (and writes the folder for the C++ side).
usage: target_forward_bench.py DIR [--threads 2] [--batch 4] [--seq 256] [--repeats 5] [--warmup 1]
       [--logits 1] [--hidden 512] [--layers 8] [--heads 8] [--kv-heads 4] [--head-dim 64]
       [--intermediate 1536] [--vocab 32000]
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
from dflash_reference import write_safetensors  # noqa: E402

CFG = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 512,
       "intermediate_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 8,
       "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 32000, "rms_norm_eps": 1e-6,
       "rope_theta": 1e6, "tie_word_embeddings": True, "max_position_embeddings": 4096}


def feature_layers(L):
    """1,3,5 on the default 8 layers, else min(5, L) layers spread evenly (as the C++ side)."""
    if L == 8:
        return [1, 3, 5]
    n = min(5, L)
    ids = [0] if n == 1 else [(i * (L - 1) + (n - 1) // 2) // (n - 1) for i in range(n)]
    return sorted(set(ids))


def rmsnorm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--logits", type=int, default=1)
    for flag, key in [("hidden", "hidden_size"), ("layers", "num_hidden_layers"),
                      ("heads", "num_attention_heads"), ("kv-heads", "num_key_value_heads"),
                      ("head-dim", "head_dim"), ("intermediate", "intermediate_size"),
                      ("vocab", "vocab_size")]:
        ap.add_argument("--" + flag, type=int, default=CFG[key], dest=key)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    c = dict(CFG)
    for key in ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "intermediate_size", "vocab_size"]:
        c[key] = getattr(a, key)
    c["max_position_embeddings"] = max(4096, a.seq)
    LAYERS = feature_layers(c["num_hidden_layers"])
    H, nh, kvh, hd, I, V, L = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
                               c["head_dim"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"])
    w = {"model.embed_tokens.weight": torch.randn(V, H) * 0.5, "model.norm.weight": torch.ones(H)}
    for i in range(L):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": torch.ones(H), p + "post_attention_layernorm.weight": torch.ones(H),
                  p + "self_attn.q_proj.weight": torch.randn(nh * hd, H) * 0.05,
                  p + "self_attn.k_proj.weight": torch.randn(kvh * hd, H) * 0.05,
                  p + "self_attn.v_proj.weight": torch.randn(kvh * hd, H) * 0.05,
                  p + "self_attn.o_proj.weight": torch.randn(H, nh * hd) * 0.05,
                  p + "self_attn.q_norm.weight": torch.ones(hd), p + "self_attn.k_norm.weight": torch.ones(hd),
                  p + "mlp.gate_proj.weight": torch.randn(I, H) * 0.05, p + "mlp.up_proj.weight": torch.randn(I, H) * 0.05,
                  p + "mlp.down_proj.weight": torch.randn(H, I) * 0.05})
    os.makedirs(a.dir, exist_ok=True)
    json.dump(c, open(os.path.join(a.dir, "config.json"), "w"))
    write_safetensors(os.path.join(a.dir, "model.safetensors"), w)

    b, S = a.batch, a.seq
    ids = torch.randint(0, V, (b, S))
    inv = c["rope_theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    f = torch.arange(S, dtype=torch.float64)[:, None] * inv
    emb = torch.cat([f, f], -1)
    cos, sin = emb.cos().float(), emb.sin().float()
    mask = torch.ones(S, S, dtype=torch.bool).tril()

    def rope(t):
        return t * cos + torch.cat([-t[..., hd // 2:], t[..., : hd // 2]], -1) * sin

    @torch.no_grad()
    def forward():
        x = w["model.embed_tokens.weight"][ids]
        outs = []
        for i in range(max(LAYERS) + 1 if not a.logits else L):
            p = f"model.layers.{i}."
            xn = rmsnorm(x, w[p + "input_layernorm.weight"])
            q = rmsnorm((xn @ w[p + "self_attn.q_proj.weight"].T).view(b, S, nh, hd), w[p + "self_attn.q_norm.weight"])
            k = rmsnorm((xn @ w[p + "self_attn.k_proj.weight"].T).view(b, S, kvh, hd), w[p + "self_attn.k_norm.weight"])
            v = (xn @ w[p + "self_attn.v_proj.weight"].T).view(b, S, kvh, hd).transpose(1, 2)
            q, k = rope(q.transpose(1, 2)), rope(k.transpose(1, 2))
            k, v = k.repeat_interleave(nh // kvh, 1), v.repeat_interleave(nh // kvh, 1)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            att = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v
            x = x + att.transpose(1, 2).reshape(b, S, -1) @ w[p + "self_attn.o_proj.weight"].T
            h = rmsnorm(x, w[p + "post_attention_layernorm.weight"])
            x = x + (torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
            outs.append(x)
        feats = torch.cat([outs[i] for i in LAYERS], -1)
        if not a.logits:
            return feats, None
        logits = rmsnorm(x, w["model.norm.weight"]) @ w["model.embed_tokens.weight"].T
        return feats, logits

    for _ in range(a.warmup):
        forward()
    best = 1e9
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        forward()
        best = min(best, time.perf_counter() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"py tokens_per_s={b * S / best:.1f} best_s={best:.3f} peak_rss_mib={rss:.0f}")


if __name__ == "__main__":
    main()
