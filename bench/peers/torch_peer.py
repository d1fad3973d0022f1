#!/usr/bin/env python3
"""PyTorch peer of `moelab bench --device cuda`: the same architectures, shapes and step
(forward + backward + AdamW) in PyTorch with bf16 autocast, eager and torch.compile.

Architecture (as core/model/model.cc): token embedding; per layer pre-RMSNorm, MHA with RoPE and
causal softmax (q, k, v fused in one projection), output projection, pre-RMSNorm, then a SwiGLU
FFN (dense) or an MoE layer (softmax router, top-k, renormalised gates, selection-only bias for
aux-loss-free balancing, routed SwiGLU experts + always-on shared experts); final RMSNorm; untied
LM head; mean next-token cross-entropy. fp32 master weights (autocast computes in bf16).

Shapes (cli/bench_cuda.cc's cases): vocab 32768, sequence 1024, 32 sequences per step;
  gpu-dense: d_model 1024, 16 layers, 16 heads, SwiGLU 2816;
  gpu-moe:   the same attention, first layer dense, then 64 experts of hidden 512, 8 active + 1
             shared.

The MoE has no host synchronisation and static shapes, so torch.compile takes it whole: the
(token, expert) pairs are sorted by expert and the experts run as one grouped GEMM
(torch._grouped_mm, exact) or, where that is missing or fails its check at start-up, as a
capacity-padded torch.bmm (capacity factor 1.25, overflow dropped; the line says which).

Reported per config: ms/step, tokens/s, TFLOP/s from the analytic training FLOPs of
core/flops.cc (3x forward, causal attention halved), utilisation against a bf16 GEMM
8192^3 measured in this process (the yardstick `moelab bench --device cuda` uses), peak memory.
Each config runs in its own try/except: an out-of-memory halves the micro-batch and retries,
any other failure is printed and the next config runs. Lines are printed as results arrive.

Usage: python3 bench/peers/torch_peer.py [--config gpu-dense,gpu-moe] [--mode eager|compile|both]
       [--batch 32] [--micro-batch N] [--steps 5] [--warmup 2] [--json]
"""
import argparse
import gc
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


# micro: the default sequences per forward/backward on an 80 GB GPU (gpu-moe's 1.8 B fp32
# parameters, gradients and AdamW state take 29 GB before any activation).
CONFIGS = {
    "gpu-dense": dict(vocab=32768, seq=1024, batch=32, d=1024, layers=16, heads=16, ffn=2816,
                      experts=0, active=0, shared=0, expert_hidden=0, dense_layers=16, micro=32),
    "gpu-moe": dict(vocab=32768, seq=1024, batch=32, d=1024, layers=16, heads=16, ffn=2816,
                    experts=64, active=8, shared=1, expert_hidden=512, dense_layers=1, micro=16),
}
CAPACITY_FACTOR = 1.25


def training_flops_per_token(c):
    """Analytic training FLOPs per token, core/flops.cc's convention (3x forward, causal half)."""
    d, s = c["d"], c["seq"]
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
            # The fp32 tables promote q and k: back to v's dtype (bf16 under autocast).
            q, k = apply_rope(q, cos, sin).to(v.dtype), apply_rope(k, cos, sin).to(v.dtype)
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

    def grouped_mm(x, w, offs):
        """Rows of x (sorted by expert, groups ending at offs) times w[e] [out, in]: [rows, out]."""
        return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)

    def grouped_mm_works(device):
        """Whether torch._grouped_mm runs forward and backward here and matches a loop of
        matmuls (bf16 tolerance) on uneven groups, an empty one included."""
        if not hasattr(torch, "_grouped_mm"):
            return False, "torch._grouped_mm missing"
        try:
            g = torch.Generator(device=device).manual_seed(3)
            counts = [37, 0, 21, 70]  # uneven, one empty: as routing gives
            x = torch.randn(sum(counts), 64, device=device, generator=g).bfloat16()
            w = torch.randn(4, 32, 64, device=device, generator=g).bfloat16().requires_grad_()
            offs = torch.tensor(counts, device=device).cumsum(0).to(torch.int32)
            y = grouped_mm(x, w, offs)
            y.float().square().sum().backward()
            ref, start = [], 0
            for e, n in enumerate(counts):
                ref.append(x[start:start + n].float() @ w[e].float().t())
                start += n
            ref = torch.cat(ref)
            err = ((y.float() - ref).norm() / ref.norm()).item()
            if not (err < 2e-2) or w.grad is None or not torch.isfinite(w.grad).all():
                return False, f"torch._grouped_mm check failed (rel err {err:.2e})"
            return True, "torch._grouped_mm"
        except Exception as e:  # noqa: BLE001 - any failure means: use the bmm path
            return False, f"torch._grouped_mm unusable: {type(e).__name__}: {e}"[:200]

    class MoE(nn.Module):
        """Routed experts as stacked weights [E, out, in]. The T*k (token, expert) pairs are
        sorted by expert (stable), the experts run as grouped GEMMs over the sorted rows, and
        the outputs are put back in pair order and summed with the gates. No .tolist(), no
        host sync, static shapes: torch.compile keeps it in one graph."""

        def __init__(self, d, experts, active, shared, hidden, grouped):
            super().__init__()
            self.e, self.k, self.grouped = experts, active, grouped
            self.router = nn.Linear(d, experts, bias=False)
            self.register_buffer("bias", torch.zeros(experts))  # selection-only (aux-free)
            std = 0.02
            self.w1 = nn.Parameter(torch.randn(experts, hidden, d) * std)
            self.w3 = nn.Parameter(torch.randn(experts, hidden, d) * std)
            self.w2 = nn.Parameter(torch.randn(experts, d, hidden) * std)
            self.shared = nn.ModuleList(SwiGLU(d, hidden) for _ in range(shared))

        def experts_grouped(self, xs, counts):
            offs = counts.cumsum(0).to(torch.int32)
            w1, w3, w2 = (w.to(torch.bfloat16) for w in (self.w1, self.w3, self.w2))
            xs = xs.to(torch.bfloat16)
            h = F.silu(grouped_mm(xs, w1, offs)) * grouped_mm(xs, w3, offs)
            return grouped_mm(h, w2, offs)

        def experts_bmm(self, xs, flat_sorted, counts):
            n, d = xs.shape
            cap = int(math.ceil(CAPACITY_FACTOR * n / self.e / 8)) * 8
            starts = counts.cumsum(0) - counts
            pos = torch.arange(n, device=xs.device) - starts[flat_sorted]
            slot = torch.where(pos < cap, flat_sorted * cap + pos,
                               torch.full_like(pos, self.e * cap))  # overflow: a dummy row
            buf = xs.new_zeros(self.e * cap + 1, d).index_copy(0, slot, xs)
            xb = buf[:-1].view(self.e, cap, d)
            h = F.silu(torch.bmm(xb, self.w1.transpose(1, 2))) * torch.bmm(
                xb, self.w3.transpose(1, 2))
            yb = torch.bmm(h, self.w2.transpose(1, 2)).reshape(self.e * cap, d)
            return torch.cat([yb, yb.new_zeros(1, d)])[slot]  # dropped pairs give 0

        def forward(self, x):
            b, s, d = x.shape
            t = x.reshape(-1, d)
            scores = F.softmax(self.router(t).float(), dim=-1)
            _, idx = torch.topk(scores + self.bias, self.k, dim=-1)  # bias: selection only
            gates = torch.gather(scores, 1, idx)
            gates = gates / gates.sum(-1, keepdim=True)
            flat = idx.reshape(-1)
            order = torch.argsort(flat, stable=True)
            flat_sorted = flat[order]
            counts = torch.zeros(self.e, dtype=torch.long, device=x.device).scatter_add_(
                0, flat, torch.ones_like(flat))
            xs = t[order // self.k]
            if self.grouped:
                ys = self.experts_grouped(xs, counts)
            else:
                ys = self.experts_bmm(xs, flat_sorted, counts)
            y = ys.new_empty(ys.shape).index_copy(0, order, ys)  # back to pair order
            out = (y.view(-1, self.k, d) * gates.unsqueeze(-1).to(y.dtype)).sum(1).to(t.dtype)
            for sh in self.shared:
                out = out + sh(t)
            return out.view(b, s, d)

    class Block(nn.Module):
        def __init__(self, c, dense, grouped):
            super().__init__()
            self.n1, self.n2 = RMSNorm(c["d"]), RMSNorm(c["d"])
            self.attn = Attention(c["d"], c["heads"])
            self.ffn = (SwiGLU(c["d"], c["ffn"]) if dense else
                        MoE(c["d"], c["experts"], c["active"], c["shared"], c["expert_hidden"],
                            grouped))

        def forward(self, x, cos, sin):
            x = x + self.attn(self.n1(x), cos, sin)
            return x + self.ffn(self.n2(x))

    class Model(nn.Module):
        def __init__(self, c, grouped):
            super().__init__()
            self.emb = nn.Embedding(c["vocab"], c["d"])
            self.blocks = nn.ModuleList(
                Block(c, (not c["experts"]) or layer < c["dense_layers"], grouped)
                for layer in range(c["layers"]))
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

    def bf16_gemm_rate(n=8192, reps=10):
        """Median FLOP/s of an n^3 bf16 matmul on random data (CUDA events, after warm-up)."""
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            a @ b
        times = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            a @ b
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        del a, b
        times.sort()
        return 2.0 * n ** 3 / times[len(times) // 2]


def bench(name, c, mode, batch, micro, steps, warmup, grouped):
    """One config: a fresh model, `warmup` untimed steps (compilation happens there), then
    `steps` timed ones. A step is batch/micro forward+backward passes, then AdamW."""
    dev = torch.device("cuda")
    torch.manual_seed(1)
    with dev:  # initialised on the GPU: 1.8 B parameters take minutes on the host
        model = Model(c, grouped)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    gen = torch.Generator(device=dev)
    gen.manual_seed(1)
    n_micro = batch // micro

    def step():
        tokens = torch.randint(0, c["vocab"], (batch, c["seq"] + 1), device=dev, generator=gen)
        total = 0.0
        for m in range(n_micro):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(tokens[m * micro:(m + 1) * micro]) / n_micro
            loss.backward()
            total = total + loss.detach()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        loss = step()
    end.record()
    end.synchronize()
    dt = start.elapsed_time(end) / 1e3 / steps
    tps = batch * c["seq"] / dt
    return {"config": name, "mode": mode, "batch": batch, "micro_batch": micro,
            "step_ms": 1e3 * dt, "tokens_per_s": tps,
            "tflops": training_flops_per_token(c) * tps / 1e12, "loss": float(loss),
            "warmup_s": warm_s, "peak_gib": torch.cuda.max_memory_allocated() / 2 ** 30}


def free_memory():
    gc.collect()
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="all",
                    help="all, or a comma list of: " + ", ".join(CONFIGS))
    ap.add_argument("--mode", default="both", choices=["eager", "compile", "both"])
    ap.add_argument("--batch", type=int, default=32, help="sequences per step")
    ap.add_argument("--micro-batch", type=int, default=0,
                    help="sequences per forward/backward (gradient accumulation); 0 = the "
                         "config's default (gpu-dense 32, gpu-moe 16), at most the batch")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--gemm-n", type=int, default=8192)
    ap.add_argument("--json", action="store_true", help="also print all results as JSON last")
    a = ap.parse_args()
    names = list(CONFIGS) if a.config == "all" else a.config.split(",")
    for n in names:
        if n not in CONFIGS:
            print(f"torch_peer: --config: no config named {n!r} ({', '.join(CONFIGS)})",
                  file=sys.stderr)
            return 2
    micros = {n: min(a.micro_batch or CONFIGS[n]["micro"], a.batch) for n in names}
    for n, mb in micros.items():
        if a.batch <= 0 or mb <= 0 or a.batch % mb:
            print(f"torch_peer: micro-batch {mb} ({n}) must divide --batch {a.batch}",
                  file=sys.stderr)
            return 2
    if torch is None:
        print("torch_peer: PyTorch is not installed here", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_peer: no CUDA device", file=sys.stderr)
        return 2
    try:
        gemm = bf16_gemm_rate(a.gemm_n)
    except Exception as e:  # noqa: BLE001 - the configs still run; util is then nan
        print(f"torch_peer: bf16 GEMM probe failed: {type(e).__name__}: {e}", flush=True)
        gemm = float("nan")
    grouped, moe_impl = grouped_mm_works(torch.device("cuda"))
    if not grouped:
        moe_impl = f"bmm, capacity {CAPACITY_FACTOR} ({moe_impl})"
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; bf16 GEMM {a.gemm_n}^3: "
          f"{gemm / 1e12:.1f} TFLOP/s; MoE experts: {moe_impl}", flush=True)
    print(f"{'config':<10} {'mode':<8} {'batch':>5} {'micro':>5} {'ms/step':>9} "
          f"{'tokens/s':>10} {'TFLOP/s':>8} {'util':>6} {'peak GiB':>8} {'warm s':>7}  loss",
          flush=True)
    modes = ["eager", "compile"] if a.mode == "both" else [a.mode]
    results, failures = [], 0
    for n in names:
        for m in modes:
            mb = micros[n]
            while True:
                r, error = None, None
                try:
                    r = bench(n, CONFIGS[n], m, a.batch, mb, a.steps, a.warmup,
                              grouped and CONFIGS[n]["experts"] > 0)
                except torch.cuda.OutOfMemoryError:
                    error = "oom"
                except Exception as e:  # noqa: BLE001 - report it, then the next config
                    error = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
                # Out of the except block: its traceback no longer holds the model's frames.
                free_memory()
                if error == "oom" and mb % 2 == 0:
                    print(f"{n:<10} {m:<8} out of memory at micro-batch {mb}: retrying with "
                          f"{mb // 2}", flush=True)
                    mb //= 2
                    continue
                if error:
                    why = f"out of memory at micro-batch {mb}" if error == "oom" else error
                    print(f"{n:<10} {m:<8} FAILED: {why}", flush=True)
                    failures += 1
                    break
                r.update(util=r["tflops"] * 1e12 / gemm, gemm_tflops=gemm / 1e12,
                         moe=moe_impl if CONFIGS[n]["experts"] else "",
                         torch=torch.__version__, device=torch.cuda.get_device_name())
                results.append(r)
                print(f"{n:<10} {m:<8} {r['batch']:>5} {r['micro_batch']:>5} "
                      f"{r['step_ms']:>9.1f} {r['tokens_per_s']:>10.0f} {r['tflops']:>8.1f} "
                      f"{100 * r['util']:>5.1f}% {r['peak_gib']:>8.1f} {r['warmup_s']:>7.1f}  "
                      f"{r['loss']:.3f}", flush=True)
                break
    print("util = analytic training FLOPs/s (3x forward, causal attention halved) / the bf16 "
          "GEMM rate above; warm s = the untimed first steps (torch.compile compiles there)",
          flush=True)
    if a.json:
        print(json.dumps(results, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
