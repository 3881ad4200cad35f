"""One decoder layer's forward + backward peak (bytes beyond its parameters), untiled / tiled MLP /
tiled layer, measured on CPU in bf16 by torch's MemTracker, beside the planner's layer phases for
the same geometry.

    python benchmarks/bench_tiled_layer.py [--tokens 8192] [--tile 512] [--out DIR] [--commit SHA]

What it checks without a GPU: that the planner's per-layer terms (plan/planner.py: hidden_mlp_bwd,
hidden_attn_bwd, qk_norm_saved, the MLP and q/k/v tile terms, ...) follow what the layer really
keeps, lever by lever. The measured peak also holds the layer's input x (the checkpoint, an "all"
term in the planner) and its output: the table adds 2·E (E = T·H·2) to the planner's larger layer
phase. At sp = 1 the planner also counts the q/k/v grads and o_proj's input on both sides of an
all-to-all that does not happen (T·(hq+2·hkv)·d·2 + T·hq·d·2): the column "planner, sp=1 exact"
takes them off. The attention kernel is CPU SDPA's, not FA4's: its workspace differs from the
planner's attn_bwd_workspace term (kept). Geometries: qwen3-tiny, and `8b-shape` (Qwen3-8B's ratios:
I = 3H, hq·d = H, hq / hkv = 4, d = 128; H = 512, 2 layers).

Writes `<out>/tiled_layer_cpu_<date>.json` and `.md`.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from harness import git_commit, raw_dir  # benchmarks/ is sys.path[0] when this file runs

KINDS = ("untiled", "tiled_mlp", "tiled_layer")


def shapes():
    from transformers import Qwen3Config

    from ds_longctx.run.model import load_hf_config

    tiny = load_hf_config("qwen3-tiny")
    tiny._attn_implementation = "sdpa"
    eight_b = Qwen3Config(
        vocab_size=512,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=128,
        max_position_embeddings=65536,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return {"qwen3-tiny": tiny, "8b-shape": eight_b}


def measure(cfg, kind: str, tokens: int, tile: int) -> int:
    """Peak bytes of one layer's forward + backward beyond its parameters (MemTracker, CPU,
    bf16)."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import Qwen3ForCausalLM

    from ds_longctx.levers.tiled_layer import apply_tiled_layer
    from ds_longctx.levers.tiled_mlp import apply_tiled_mlp

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).train()
    if kind == "tiled_mlp":
        apply_tiled_mlp(model, tile)
    if kind == "tiled_layer":
        apply_tiled_layer(model, tile)
    layer, H = model.model.layers[0], cfg.hidden_size
    x = torch.randn(1, tokens, H, dtype=torch.bfloat16, requires_grad=True)
    pos = torch.arange(tokens)[None]
    emb = model.model.rotary_emb(x, pos)
    grad = torch.randn(1, tokens, H, dtype=torch.bfloat16)
    tracker = MemTracker()
    tracker.track_external(layer)
    with tracker:
        layer(x, position_embeddings=emb, position_ids=pos, attention_mask=None).backward(grad)
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    params = sum(v for k, v in peak.items() if getattr(k, "name", "") == "PARAM")
    return peak["Total"] - params


def planned(cfg, kind: str, tokens: int, tile: int) -> tuple:
    """(the planner's larger layer phase, the same less its sp=1 double count), bytes."""
    from ds_longctx.plan.geometry import ModelGeometry
    from ds_longctx.plan.planner import LAYER, Levers, plan_memory

    geom = ModelGeometry.from_config(cfg.to_dict(), name=cfg.model_type)
    lv = Levers(tiled_mlp=kind != "untiled", tiled_layer=kind == "tiled_layer", tile_tokens=tile)
    plan = plan_memory(geom, tokens, 1, 1, lv)
    phase = max(b for p, b in plan.phase_bytes if p in LAYER)
    T, hq, hkv, d = tokens, geom.heads, geom.kv_heads, geom.head_dim
    return phase, phase - T * (hq + 2 * hkv) * d * 2 - T * hq * d * 2


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--tile", type=int, default=512)
    ap.add_argument(
        "--out", default=raw_dir(), help="default: $OUT, else benchmarks/results/sessions/<date>"
    )
    ap.add_argument("--commit", default=None)
    a = ap.parse_args()
    rows = []
    for name, cfg in shapes().items():
        E = a.tokens * cfg.hidden_size * 2
        for kind in KINDS:
            got = measure(cfg, kind, a.tokens, a.tile)
            phase, exact = planned(cfg, kind, a.tokens, a.tile)
            rows.append(
                {
                    "geometry": name,
                    "kind": kind,
                    "tokens": a.tokens,
                    "tile": a.tile,
                    "measured_bytes": got,
                    "planned_layer_phase_bytes": phase,
                    "planned_sp1_exact_bytes": exact,
                    "E": E,
                    "measured_E": round(got / E, 2),
                    "planned_plus_2E": round(phase / E + 2, 2),
                    "planned_sp1_exact_plus_2E": round(exact / E + 2, 2),
                }
            )
            print(json.dumps(rows[-1]))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"tiled_layer_cpu_{datetime.date.today().isoformat()}"
    meta = {
        "date": datetime.date.today().isoformat(),
        "commit": git_commit(a.commit),
        "command": f"python benchmarks/bench_tiled_layer.py --tokens {a.tokens} --tile {a.tile}",
    }
    stem.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    md = [
        "# One layer's forward + backward peak, CPU bf16 (MemTracker), vs the planner "
        f"({meta['date']}, commit {meta['commit']})",
        "",
        f"`{meta['command']}`; units of E = T·H·2 (T = {a.tokens}).",
        "",
        "| geometry | layer | measured | planner + 2E | planner, sp=1 exact, + 2E |",
        "|---|---|---|---|---|",
    ]
    md += [
        f"| {r['geometry']} | {r['kind']} | {r['measured_E']} | {r['planned_plus_2E']} | "
        f"{r['planned_sp1_exact_plus_2E']} |"
        for r in rows
    ]
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
