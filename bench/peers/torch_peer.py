#!/usr/bin/env python3
"""PyTorch peer of `moelab bench --device cuda` (issue 11): the same architectures, shapes and
step (forward + backward + AdamW) in PyTorch with bf16 autocast, eager and torch.compile, tokens/s.

Architecture (as core/model/model.cc): token embedding; per layer pre-RMSNorm, MHA with RoPE and
causal softmax (q, k, v fused in one projection), output projection, pre-RMSNorm, then a SwiGLU
FFN (dense) or an MoE layer (softmax router, top-k, renormalised gates, selection-only bias for
aux-loss-free balancing, routed SwiGLU experts + always-on shared experts); final RMSNorm; untied
LM head; mean next-token cross-entropy. fp32 master weights (autocast computes in bf16).

Shapes (issue 11): vocab 32768, sequence 1024, 32 sequences per step;
  gpu-dense: d_model 1024, 16 layers, 16 heads, FFN 2816;
  gpu-moe:   the same attention, first layer dense, then 64 experts of hidden 512, 8 active + 1
             shared.

Usage: python3 bench/peers/torch_peer.py [--config gpu-dense|gpu-moe|all] [--steps 10]
       [--warmup 3] [--mode eager|compile|both] [--json]
"""
import argparse
import json
import math
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # the peer needs a machine with PyTorch (the GPU image has it)
    torch = None


CONFIGS = {
    "gpu-dense": dict(vocab=32768, seq=1024, batch=32, d=1024, layers=16, heads=16, ffn=2816,
                      experts=0, active=0, shared=0, expert_hidden=0, dense_layers=16),
    "gpu-moe": dict(vocab=32768, seq=1024, batch=32, d=1024, layers=16, heads=16, ffn=2816,
                    experts=64, active=8, shared=1, expert_hidden=512, dense_layers=1),
}


def training_flops_per_token(c):
    """Analytic training FLOPs per token, core/flops.cc's convention (3x forward, causal half)."""
    d, s, h = c["d"], c["seq"], c["heads"]
    attn_proj = 2 * d * (3 * d) + 2 * d * d
    attn_scores = 2 * 2 * d * (s + 1) / 2
    per_layer_attn = attn_proj + attn_scores
    dense_ffn = 2 * 3 * d * c["ffn"]
    fwd = c["layers"] * per_layer_attn + 2 * d * c["vocab"]
    moe_layers = c["layers"] - c["dense_layers"] if c["experts"] else 0
    fwd += (c["layers"] - moe_layers) * dense_ffn
    if moe_layers:
        eh = c["expert_hidden"]
        fwd += moe_layers * (2 * d * c["experts"] + (c["active"] + c["shared"]) * 2 * 3 * d * eh)
    return 3 * fwd


if torch is not None:

    class RMSNorm(nn.Module):
        def __init__(self, d, eps=1e-5):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))
            self.eps = eps

        def forward(self, x):
            xf = x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return (y * self.weight).to(x.dtype)

    def rope_tables(seq, hd, theta=10000.0, device=None):
        inv = 1.0 / theta ** (torch.arange(0, hd, 2, device=device).float() / hd)
        ang = torch.outer(torch.arange(seq, device=device).float(), inv)
        return ang.cos(), ang.sin()

    def apply_rope(x, cos, sin):  # x [B, H, S, hd], interleaved pairs as kernels/cpu/rope.cc
        x1, x2 = x[..., 0::2], x[..., 1::2]
        c, s = cos[None, None], sin[None, None]
        out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
        return out.flatten(-2)

    class Attention(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.h, self.hd = heads, d // heads
            self.wqkv = nn.Linear(d, 3 * d, bias=False)
            self.wo = nn.Linear(d, d, bias=False)

        def forward(self, x, cos, sin):
            b, s, d = x.shape
            q, k, v = self.wqkv(x).view(b, s, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(y.transpose(1, 2).reshape(b, s, d))

    class SwiGLU(nn.Module):
        def __init__(self, d, hidden):
            super().__init__()
            self.w1 = nn.Linear(d, hidden, bias=False)
            self.w3 = nn.Linear(d, hidden, bias=False)
            self.w2 = nn.Linear(hidden, d, bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class MoE(nn.Module):
        """Routed experts as stacked weights [E, H, d], tokens grouped by expert (sorted), one
        matmul per expert, scattered back with index_add_ (the usual eager PyTorch MoE)."""

        def __init__(self, d, experts, active, shared, hidden):
            super().__init__()
            self.e, self.k = experts, active
            self.router = nn.Linear(d, experts, bias=False)
            self.register_buffer("bias", torch.zeros(experts))  # selection-only (aux-free)
            std = 0.02
            self.w1 = nn.Parameter(torch.randn(experts, hidden, d) * std)
            self.w3 = nn.Parameter(torch.randn(experts, hidden, d) * std)
            self.w2 = nn.Parameter(torch.randn(experts, d, hidden) * std)
            self.shared = nn.ModuleList(SwiGLU(d, hidden) for _ in range(shared))

        def forward(self, x):
            b, s, d = x.shape
            t = x.reshape(-1, d)
            scores = F.softmax(self.router(t).float(), dim=-1)
            _, idx = torch.topk(scores + self.bias, self.k, dim=-1)  # bias: selection only
            gates = torch.gather(scores, 1, idx)
            gates = gates / gates.sum(-1, keepdim=True)
            flat = idx.reshape(-1)
            order = torch.argsort(flat)
            token = order // self.k
            counts = torch.bincount(flat, minlength=self.e).tolist()
            xs = t[token]
            out = torch.zeros_like(t)
            start = 0
            for e, n in enumerate(counts):
                if n == 0:
                    continue
                seg = xs[start:start + n]
                h = F.silu(seg @ self.w1[e].t()) * (seg @ self.w3[e].t())
                y = (h @ self.w2[e].t()) * gates.reshape(-1)[order[start:start + n]][:, None].to(h.dtype)
                out.index_add_(0, token[start:start + n], y.to(out.dtype))
                start += n
            for sh in self.shared:
                out = out + sh(t)
            return out.view(b, s, d)

    class Block(nn.Module):
        def __init__(self, c, dense):
            super().__init__()
            self.n1, self.n2 = RMSNorm(c["d"]), RMSNorm(c["d"])
            self.attn = Attention(c["d"], c["heads"])
            self.ffn = (SwiGLU(c["d"], c["ffn"]) if dense else
                        MoE(c["d"], c["experts"], c["active"], c["shared"], c["expert_hidden"]))

        def forward(self, x, cos, sin):
            x = x + self.attn(self.n1(x), cos, sin)
            return x + self.ffn(self.n2(x))

    class Model(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.emb = nn.Embedding(c["vocab"], c["d"])
            self.blocks = nn.ModuleList(
                Block(c, dense=(not c["experts"]) or l < c["dense_layers"])
                for l in range(c["layers"]))
            self.norm = RMSNorm(c["d"])
            self.head = nn.Linear(c["d"], c["vocab"], bias=False)
            hd = c["d"] // c["heads"]
            cos, sin = rope_tables(c["seq"], hd)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02)

        def forward(self, tokens):
            x = self.emb(tokens[:, :-1])
            for blk in self.blocks:
                x = blk(x, self.cos, self.sin)
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                   tokens[:, 1:].reshape(-1))


def bench(name, c, mode, steps, warmup):
    dev = torch.device("cuda")
    torch.manual_seed(1)
    model = Model(c).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    gen = torch.Generator(device=dev)
    gen.manual_seed(1)

    def step():
        tokens = torch.randint(0, c["vocab"], (c["batch"], c["seq"] + 1), device=dev, generator=gen)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(tokens)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    tps = c["batch"] * c["seq"] / dt
    return {"config": name, "mode": mode, "step_ms": 1e3 * dt, "tokens_per_s": tps,
            "tflops": training_flops_per_token(c) * tps / 1e12, "loss": float(loss),
            "torch": torch.__version__, "device": torch.cuda.get_device_name()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="all", choices=["all", *CONFIGS])
    ap.add_argument("--mode", default="both", choices=["eager", "compile", "both"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if torch is None:
        print("torch_peer: PyTorch is not installed here", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_peer: no CUDA device", file=sys.stderr)
        return 2
    names = list(CONFIGS) if a.config == "all" else [a.config]
    modes = ["eager", "compile"] if a.mode == "both" else [a.mode]
    results = []
    for n in names:
        for m in modes:
            r = bench(n, CONFIGS[n], m, a.steps, a.warmup)
            results.append(r)
            if not a.json:
                print(f"{r['config']:<10} {r['mode']:<8} {r['step_ms']:9.1f} ms/step "
                      f"{r['tokens_per_s']:11.0f} tokens/s {r['tflops']:7.1f} TFLOP/s "
                      f"(loss {r['loss']:.3f}; torch {r['torch']}, {r['device']})", flush=True)
    if a.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
