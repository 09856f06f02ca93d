"""The peer of drafter_step_bench.cc: the same drafter, config and step in PyTorch eager (fp32),
written the way the public Python trainers write it (dense [N·B, S+N·B] attention mask, one SDPA-style
masked softmax per layer). Run with /usr/bin/python3 (Debian python3-torch: the same LibTorch 1.13).
Prints one line: py median_step_s=... min_step_s=... peak_rss_mib=...
"""
import argparse
import math
import resource
import time

import torch


def rmsnorm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(pos, hd, theta=10000.0):
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    f = pos.double()[..., None] * inv
    emb = torch.cat([f, f], -1)
    return emb.cos().float(), emb.sin().float()


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


class Layer(torch.nn.Module):
    def __init__(self, H, nh, kvh, hd, inter):
        super().__init__()
        self.nh, self.kvh, self.hd = nh, kvh, hd
        L = lambda i, o: torch.nn.Linear(i, o, bias=False)
        self.q, self.k, self.v, self.o = L(H, nh * hd), L(H, kvh * hd), L(H, kvh * hd), L(nh * hd, H)
        self.gate, self.up, self.down = L(H, inter), L(H, inter), L(inter, H)
        self.ln1, self.ln2 = torch.nn.Parameter(torch.ones(H)), torch.nn.Parameter(torch.ones(H))
        self.qn, self.kn = torch.nn.Parameter(torch.ones(hd)), torch.nn.Parameter(torch.ones(hd))


class Drafter(torch.nn.Module):
    def __init__(self, H, n_feat, layers, nh, kvh, hd, inter):
        super().__init__()
        self.fc = torch.nn.Linear(n_feat * H, H, bias=False)
        self.hn, self.norm = torch.nn.Parameter(torch.ones(H)), torch.nn.Parameter(torch.ones(H))
        self.layers = torch.nn.ModuleList([Layer(H, nh, kvh, hd, inter) for _ in range(layers)])

    def forward(self, feats, x, allow, cos_q, sin_q, cos_c, sin_c):
        b, S, _ = feats.shape
        NB = x.shape[1]
        ctx = rmsnorm(self.fc(feats), self.hn)
        for l in self.layers:
            xn = rmsnorm(x, l.ln1)
            q = rmsnorm(l.q(xn).view(b, NB, l.nh, l.hd), l.qn).transpose(1, 2)
            kin = torch.cat([ctx, xn], 1)
            k = rmsnorm(l.k(kin).view(b, S + NB, l.kvh, l.hd), l.kn).transpose(1, 2)
            v = l.v(kin).view(b, S + NB, l.kvh, l.hd).transpose(1, 2)
            q = rope(q, cos_q, sin_q)
            k = rope(k, torch.cat([cos_c.expand(b, 1, S, l.hd), cos_q], 2),
                     torch.cat([sin_c.expand(b, 1, S, l.hd), sin_q], 2))
            rep = l.nh // l.kvh
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(l.hd)
            p = torch.softmax(s.masked_fill(~allow, float("-inf")), -1).nan_to_num(0.0)
            x = x + l.o((p @ v).transpose(1, 2).reshape(b, NB, -1))
            h = rmsnorm(x, l.ln2)
            x = x + l.down(torch.nn.functional.silu(l.gate(h)) * l.up(h))
        return rmsnorm(x, self.norm)


def main():
    ap = argparse.ArgumentParser()
    for name, default in [("threads", 2), ("steps", 10), ("warmup", 2), ("hidden", 256), ("layers", 2),
                          ("heads", 0), ("kv-heads", 0), ("head-dim", 64), ("intermediate", 0),
                          ("features", 2), ("block", 16), ("seq", 512), ("anchors", 64), ("batch", 2),
                          ("vocab", 8192)]:
        ap.add_argument("--" + name, type=int, default=default)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    H, B, S, N, b, V = a.hidden, a.block, a.seq, a.anchors, a.batch, a.vocab
    hd = a.head_dim
    nh = a.heads or H // 64
    kvh = a.kv_heads or max(1, nh // 2)
    model = Drafter(H, a.features, a.layers, nh, kvh, hd, a.intermediate or 3 * H)
    embed, head = torch.randn(V, H) * 0.2, torch.randn(V, H) * 0.2
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    ids = torch.randint(0, V - 1, (b, S))
    feats = torch.randn(b, S, a.features * H)
    anchors = torch.stack([torch.randperm(S - 1)[:N].sort().values for _ in range(b)])
    gamma = {16: 7.0, 10: 5.0, 8: 4.0}[B]
    blk = torch.full((b, N, B), V - 1)
    blk[:, :, 0] = ids.gather(1, anchors)
    pos_q = (anchors[..., None] + torch.arange(B)).view(b, N * B)
    cos_q, sin_q = rope_tables(pos_q, hd)
    cos_c, sin_c = rope_tables(torch.arange(S), hd)
    cos_q, sin_q = cos_q[:, None], sin_q[:, None]
    j = torch.arange(N * B) // B
    kv = torch.arange(S + N * B)
    a_j = anchors[:, j]
    allow = (((kv < S)[None, None] & (kv[None, None] < a_j[..., None])) |
             ((kv >= S)[None, None] & (((kv - S) // B)[None, None] == j[None, :, None])))[:, None]
    tgt = anchors[..., None] + torch.arange(1, B)
    valid = tgt < S
    labels = ids.gather(1, tgt.clamp(max=S - 1).view(b, -1)).view(b, N, B - 1)
    w = valid.float() * torch.exp(-(torch.arange(1, B).float() - 1) / gamma)
    times = []
    for step in range(a.steps + a.warmup):
        t0 = time.perf_counter()
        x = embed[blk.view(b, -1)]
        h = model(feats, x, allow, cos_q, sin_q, cos_c, sin_c).view(b, N, B, H)[:, :, 1:]
        logits = h.reshape(-1, H) @ head.T
        ce = torch.nn.functional.cross_entropy(logits, labels.reshape(-1), reduction="none")
        loss = (ce * w.reshape(-1)).sum() / w.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"py median_step_s={times[len(times) // 2]:.4f} min_step_s={times[0]:.4f} peak_rss_mib={rss:.0f}")


if __name__ == "__main__":
    main()
