"""The per-layer profiler: every module in the rows, FLOPs and bytes counted exactly from
shapes, times that add up, backward rows, a valid Chrome trace, and the CLI as a real
process on a tiny config.

A fixed Roofline is passed wherever the machine's own is not the point, so these tests
never spend seconds measuring it.
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu import autograd, nn
from minitorch_gpu.nn import GPT, GPTConfig
from minitorch_gpu.profiler import Profile, Roofline, profile, profile_model, register_cost

ROOF = Roofline(peak_flops=1e11, bandwidth=1e10)  # ridge 10 FLOP/byte
ROOT = Path(__file__).resolve().parents[1]


def small_gpt(bias: bool = False, **overrides) -> GPT:
    mt.manual_seed(0)
    shape = dict(block_size=32, vocab_size=50, n_layer=2, n_head=2, n_embd=64, bias=bias)
    shape.update(overrides)
    return GPT(GPTConfig(**shape))


def batch(B: int = 4, T: int = 32, vocab: int = 50):
    mt.manual_seed(1)
    return mt.randint(0, vocab, (B, T)), mt.randint(0, vocab, (B, T))


def forward_rows(prof: Profile) -> dict:
    return {r["module"]: r for r in prof.rows if r["phase"] == "forward" and r["kind"] != "self"}


def test_every_module_appears_in_the_rows_in_tree_order():
    model = small_gpt()
    idx, targets = batch()
    with profile(model, roofline=ROOF) as prof:
        model(idx, targets)
    names = [name for name, _ in model.named_modules()]
    rows = [r["module"] for r in prof.rows if r["kind"] != "self"]
    assert rows == names
    assert {"transformer.h.1.attn.core", "transformer.h.0.mlp.gelu", "loss", "lm_head",
            "transformer.ln_f", "transformer.wte"} <= set(rows)
    # a parent's (self) row follows its children, and shows its own work only
    self_rows = [r["name"] for r in prof.rows if r["kind"] == "self"]
    assert self_rows == ["GPT (self)", "transformer.h.0 (self)", "transformer.h.0.attn (self)",
                         "transformer.h.0.mlp (self)", "transformer.h.1 (self)",
                         "transformer.h.1.attn (self)", "transformer.h.1.mlp (self)"]


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_residual_add_is_counted_once_where_it_runs(dropout):
    """With dropout off the blocks' skip connections run inside c_proj (its row counts
    the add); with it on (training) the block adds them itself (its own row does)."""
    model = small_gpt(dropout=dropout)
    idx, targets = batch()
    with profile(model, roofline=ROOF) as prof:
        model(idx, targets)
    rows = {r["name"]: r for r in prof.rows if r["phase"] == "forward"}
    M, C = 4 * 32, 64
    fused = dropout == 0.0
    assert rows["transformer.h.0 (self)"]["flops"] == (0 if fused else 2 * M * C)
    for proj, k in (("transformer.h.0.attn.c_proj", C), ("transformer.h.0.mlp.c_proj", 4 * C)):
        assert rows[proj]["flops"] == 2 * M * k * C + (M * C if fused else 0)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 4), (6,)])
def test_linear_flops_are_exactly_2_m_n_k(shape, bias):
    mt.manual_seed(0)
    layer = nn.Linear(shape[-1], 11, bias=bias)
    x = mt.randn(*shape)
    with profile(layer, roofline=ROOF) as prof:
        layer(x)
    (row,) = prof.rows
    rows = int(np.prod(shape[:-1]))
    assert row["flops"] == 2 * rows * shape[-1] * 11 + (rows * 11 if bias else 0)
    # inputs and outputs once, weights once (float32: 4 bytes each)
    assert row["bytes"] == 4 * (rows * shape[-1] + rows * 11 + 11 * shape[-1]
                                + (11 if bias else 0))
    assert row["params"] == 11 * shape[-1] + (11 if bias else 0)
    assert row["out_bytes"] == 4 * rows * 11
    assert row["calls"] == 1 and row["leaf"]


B, T, C, H, V = 4, 32, 64, 2, 50


@pytest.mark.parametrize("module, flops, nbytes", [
    # name, counted FLOPs, bytes moved (float32) for the small GPT on (4, 32) tokens
    ("transformer.wte", 0, 8 * B * T + 2 * 4 * B * T * C),  # int64 ids, rows read, out
    ("transformer.wpe", 0, 8 * T + 2 * 4 * T * C),
    ("transformer.h.0.ln_1", 6 * B * T * C, 4 * (2 * B * T * C + C)),  # no bias: gain only
    ("transformer.h.0.attn.c_attn", 2 * B * T * C * 3 * C,
     4 * (B * T * C + B * T * 3 * C + 3 * C * C)),
    ("transformer.h.0.attn.core", 4 * B * H * T * T * (C // H) + 5 * B * H * T * T,
     4 * 4 * B * T * C),  # q, k, v in, y out
    ("transformer.h.0.mlp.gelu", 9 * B * T * 4 * C, 4 * 2 * B * T * 4 * C),
    ("transformer.h.0.mlp.dropout", 0, 0),  # p = 0: the identity moves nothing
    ("loss", 4 * B * T * V, 4 * B * T * V + 8 * B * T + 4),
])
def test_counted_costs_of_each_layer(module, flops, nbytes):
    model = small_gpt()
    idx, targets = batch()
    with profile(model, roofline=ROOF) as prof:
        model(idx, targets)
    row = forward_rows(prof)[module]
    assert (row["flops"], row["bytes"]) == (flops, nbytes)


def test_verdicts_follow_the_ridge_point():
    model = small_gpt()
    idx, targets = batch()
    with profile(model, roofline=ROOF) as prof:
        model(idx, targets)
    rows = forward_rows(prof)
    for row in rows.values():
        if row["intensity"]:
            expected = "compute" if row["intensity"] >= ROOF.ridge else "memory"
            assert row["bound"] == expected, row["name"]
    assert rows["transformer.h.0.mlp.c_fc"]["bound"] == "compute"
    assert rows["transformer.h.0.ln_2"]["bound"] == "memory"
    assert rows["transformer.h.0.mlp.gelu"]["bound"] == "memory"
    c_fc = rows["transformer.h.0.mlp.c_fc"]
    assert c_fc["gflops"] == pytest.approx(c_fc["flops"] / c_fc["time_ms"] / 1e6)
    assert c_fc["roof_pct"] == pytest.approx(100 * c_fc["gflops"] * 1e9 / ROOF.peak_flops)


@pytest.mark.parametrize("make", [lambda: small_gpt(bias=True),
                                  lambda: small_llama(tie_embeddings=False),
                                  lambda: small_llama(tie_embeddings=True)],
                         ids=["gpt", "llama", "llama-tied"])
def test_flop_total_matches_flops_per_token(make):
    # the forward third of the 6N + 12 L d T estimate, within 5%
    model = make()
    idx, targets = batch()
    with profile(model, roofline=ROOF) as prof:
        model(idx, targets)
    summary = prof.summary
    expected = model.flops_per_token(T) * B * T / 3
    assert summary["model_forward_flops"] == pytest.approx(expected, rel=1e-9)
    assert summary["flops_per_pass"] == pytest.approx(expected, rel=0.05)


def small_llama(**overrides) -> nn.Llama:
    mt.manual_seed(0)
    shape = dict(block_size=32, vocab_size=50, n_layer=2, n_head=4, n_kv_head=2, n_embd=64)
    shape.update(overrides)
    return nn.Llama(nn.LlamaConfig(**shape))


def test_every_llama_layer_has_a_row_with_a_counted_cost():
    model = small_llama()
    idx, targets = batch()
    with profile(model, roofline=ROOF, backward=True) as prof:
        _, loss = model(idx, targets)
        loss.backward()
    rows = [r for r in prof.rows if r["phase"] == "forward" and r["kind"] != "self"]
    assert [r["module"] for r in rows] == [name for name, _ in model.named_modules()]
    for row in rows:  # every layer's cost is known: a registered one, none left unknown
        assert row["flops"] is not None and row["bytes"] is not None, row["name"]
        if row["flops"]:
            expected = "compute" if row["intensity"] >= ROOF.ridge else "memory"
            assert row["bound"] == expected, row["name"]
    assert {r["module"] for r in prof.rows if r["phase"] == "backward"} >= {
        "model.layers.0.self_attn.core", "model.layers.0.mlp.act",
        "model.layers.0.self_attn.rotary", "model.layers.1.input_layernorm"}


H_LLAMA, KV_LLAMA, F_LLAMA = 4, 2, 192  # small_llama's heads, key/value heads, ffn_hidden
D_LLAMA = C // H_LLAMA


@pytest.mark.parametrize("module, flops, nbytes", [
    # counted FLOPs, bytes moved (float32) for the small Llama on (4, 32) tokens
    ("model.embed_tokens", 0, 8 * B * T + 2 * 4 * B * T * C),
    ("model.layers.0.input_layernorm", 4 * B * T * C, 4 * (2 * B * T * C + C)),
    ("model.layers.0.self_attn.k_proj", 2 * B * T * C * KV_LLAMA * D_LLAMA,
     4 * (B * T * C + B * T * KV_LLAMA * D_LLAMA + KV_LLAMA * D_LLAMA * C)),
    # q and k rotated: 3 per element; q, k in and out, cos and sin rows (T, D / 2)
    ("model.layers.0.self_attn.rotary", 3 * B * T * (C + KV_LLAMA * D_LLAMA),
     4 * (2 * B * T * (C + KV_LLAMA * D_LLAMA) + 2 * T * D_LLAMA // 2)),
    # n_head query heads' products and softmax; q, k, v (n_kv_head heads) in, y out
    ("model.layers.0.self_attn.core",
     4 * B * H_LLAMA * T * T * D_LLAMA + 5 * B * H_LLAMA * T * T,
     4 * (2 * B * T * C + 2 * B * T * KV_LLAMA * D_LLAMA)),
    ("model.layers.0.mlp.act", 6 * B * T * F_LLAMA, 4 * 3 * B * T * F_LLAMA),
    # the residual add inside o_proj (dropout off): its flops, and the residual read
    ("model.layers.0.self_attn.o_proj", 2 * B * T * C * C + B * T * C,
     4 * (3 * B * T * C + C * C)),
    ("model.layers.0", 0, 0),  # (self): its two residual adds run in o_proj and down_proj
    ("model.layers.0.self_attn", None, None),  # only its children: a sum of them
    ("Llama", 0, 0),  # no position rows
])
def test_counted_costs_of_each_llama_layer(module, flops, nbytes):
    model = small_llama()
    assert model.config.ffn_hidden == F_LLAMA
    idx, targets = batch()
    with profile(model, roofline=ROOF) as prof:
        model(idx, targets)
    if module in ("model.layers.0", "Llama"):
        row = next(r for r in prof.rows if r["name"] == f"{module} (self)")
    else:
        row = forward_rows(prof)[module]
    if flops is None:  # a parent's row sums its children's
        children = [r for r in forward_rows(prof).values()
                    if r["module"].startswith(module + ".")]
        assert row["flops"] == sum(r["flops"] for r in children)
    else:
        assert (row["flops"], row["bytes"]) == (flops, nbytes)


def test_leaf_rows_sum_to_the_forward_pass():
    """The rows that partition a pass (leaves and (self) rows) add up to it. Over one pass
    the sum is exact (each row is that pass's own time, no median between), whatever the
    machine is doing; over several, each row's percent is its median's share of the
    median pass. How much the hooks cost is a timing, measured by bench, not here."""
    model = small_gpt(n_layer=2, n_embd=128, n_head=4, block_size=64, vocab_size=65)
    idx, targets = batch(B=8, T=64, vocab=65)
    prof = profile_model(model, idx, targets, warmup=1, iters=1, roofline=ROOF)
    s = prof.summary
    leaves = [r for r in prof.rows if r["leaf"]]
    assert s["passes"] == 1 and s["reference_ms"]["forward"] > 0
    assert all(r["pass_ms"] >= 0 for r in leaves)
    assert s["leaf_sum_ms"] == pytest.approx(s["forward_ms"], rel=1e-9)
    assert sum(r["percent"] for r in leaves) == pytest.approx(100.0, rel=1e-9)
    # every module that ran without children is a leaf, every parent has its (self) leaf
    parents = {name.rpartition(".")[0] for name, _ in model.named_modules() if name}
    leaf_modules = {r["module"] for r in leaves if r["kind"] == "module"}
    self_rows = {r["module"] for r in leaves if r["kind"] == "self"}
    ran = {r["module"] for r in prof.rows if r["kind"] == "module"}
    assert leaf_modules == ran - parents and self_rows == ran & parents
    # the counted FLOPs of the leaves are the pass's, exactly (one call each per pass)
    assert sum(r["flops"] * r["calls"] for r in leaves) == s["flops_per_pass"]

    prof = profile_model(model, idx, targets, warmup=0, iters=5, roofline=ROOF)
    s = prof.summary
    leaves = [r for r in prof.rows if r["leaf"]]
    assert s["passes"] == 5 and leaves
    for r in leaves:
        assert r["percent"] == pytest.approx(100 * r["pass_ms"] / s["forward_ms"], rel=1e-12)


def test_backward_adds_rows_that_cover_the_backward_pass():
    model = small_gpt().eval()
    idx, targets = batch()
    prof = profile_model(model, idx, targets, warmup=1, iters=1, backward=True,
                         roofline=ROOF)
    backward = [r for r in prof.rows if r["phase"] == "backward"]
    forward = [r for r in prof.rows if r["phase"] == "forward"]
    assert [r["name"] for r in backward[:len(forward)]] == [r["name"] for r in forward]
    assert backward[-1]["name"] == "(autograd engine)"
    by_name = {r["name"]: r for r in backward}
    c_fc = by_name["transformer.h.0.mlp.c_fc"]
    assert c_fc["time_ms"] > 0
    assert c_fc["flops"] == 2 * forward_rows(prof)["transformer.h.0.mlp.c_fc"]["flops"]
    s = prof.summary
    # the node rows and the engine's row partition the backward pass (one pass: exactly)
    assert s["backward_leaf_sum_ms"] == pytest.approx(s["backward_ms"], rel=1e-9)
    assert s["reference_ms"]["backward"] > 0
    # the profile leaves nothing behind: hooks, the observer, the training mode it set
    assert autograd._observer is None and not model.training
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_backward_nodes_count_for_the_module_that_recorded_them():
    layer = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    x = mt.randn(5, 8)
    with profile(layer, backward=True, roofline=ROOF) as prof:
        layer(x).sum().backward()  # the sum is recorded outside every module
    scopes = {(n.scope, n.name) for n in prof.nodes}
    assert ("0", "LinearBackward") in scopes and ("1", "GeluBackward") in scopes
    assert ("2", "AccumulateGrad") in scopes  # a parameter's gradient: its module's
    assert (None, "SumBackward") in scopes
    names = [r["name"] for r in prof.rows if r["phase"] == "backward"]
    assert "(outside the model)" in names
    # nodes recorded after the profile carry no scope
    y = layer(x)
    assert y.grad_fn.scope is None


def test_chrome_trace_is_valid_json_with_nested_spans(tmp_path):
    model = small_gpt()
    idx, targets = batch()
    prof = profile_model(model, idx, targets, warmup=0, iters=2, backward=True,
                         roofline=ROOF)
    path = prof.export_chrome_trace(tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    for e in spans:
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= set(e)
        assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0
    forward = [e for e in spans if e["cat"] == "forward"]
    # one span per module call per pass, with shapes and costs
    assert len(forward) == 2 * len(list(model.modules())) - 2 * 2  # ModuleList/Dict: no call
    c_attn = next(e for e in forward if e["name"] == "transformer.h.0.attn.c_attn")
    assert c_attn["args"]["inputs"] == [[4, 32, 64]] and c_attn["args"]["outputs"] == [[4, 32, 192]]
    assert c_attn["args"]["own_flops"] == 2 * 4 * 32 * 64 * 192
    assert any(e["cat"] == "backward" and e["name"] == "LinearBackward" for e in spans)
    # properly nested: on each track, a span that starts inside another ends inside it
    for tid in {e["tid"] for e in spans}:
        open_spans = []
        for e in sorted((e for e in spans if e["tid"] == tid),
                        key=lambda e: (e["ts"], -e["dur"])):
            end = e["ts"] + e["dur"]
            while open_spans and e["ts"] >= open_spans[-1] - 1e-3:
                open_spans.pop()
            if open_spans:
                assert end <= open_spans[-1] + 1e-3, e
            open_spans.append(end)


def test_table_sorts_and_cuts_at_a_depth():
    model = small_gpt()
    idx, targets = batch()
    with profile(model, roofline=ROOF) as prof:
        model(idx, targets)
    tree = prof.table()
    assert "transformer.h.0.attn.core" in tree and "GFLOP/s" in tree
    cut = prof.table(depth=3)
    assert "transformer.h.1 " in cut and "c_attn" not in cut
    by_time = prof.table(sort="time").splitlines()
    assert not any(line.startswith("  ") for line in by_time)  # a flat list
    # by FLOPs: the leaf and (self) rows, most first, in the table's order
    lines = prof.table(sort="flops").splitlines()
    leaves = [r for r in prof.rows if r["leaf"]]
    shown = [r for line in lines for r in leaves if line.startswith(r["name"] + " ")]
    assert len(shown) == len(leaves)
    assert [r["flops"] for r in shown] == sorted((r["flops"] for r in leaves), reverse=True)
    # cut at depth 1, the flat rows still add up to the pass
    rows = [r for r in prof.rows if r["depth"] == 1 or (r["leaf"] and r["depth"] < 1)]
    assert sum(r["pass_ms"] for r in rows) == pytest.approx(prof.summary["forward_ms"],
                                                            rel=1e-9)  # one pass: exact
    with pytest.raises(ValueError, match="sort must be one of tree, time, flops, name"):
        prof.table(sort="slowest")
    with pytest.raises(ValueError, match="depth must be an int >= 0"):
        prof.table(depth=-1)


def test_csv_has_one_line_per_row(tmp_path):
    model = small_gpt()
    idx, targets = batch()
    with profile(model, roofline=ROOF) as prof:
        model(idx, targets)
    path = prof.export_csv(tmp_path / "rows.csv")
    with open(path, newline="") as f:
        lines = list(csv.DictReader(f))
    assert [line["name"] for line in lines] == [r["name"] for r in prof.rows]
    assert lines[0]["bound"] in ("compute", "memory")


def test_register_cost_teaches_a_new_layer():
    class Square(nn.Module):
        def forward(self, x):
            return x * x

    model = nn.Sequential(nn.Linear(4, 4), Square())
    with profile(model, roofline=ROOF) as prof:
        model(mt.randn(3, 4))
    assert forward_rows(prof)["1"]["flops"] is None  # unknown: shown as ?, not as 0
    assert "?" in prof.table()

    @register_cost(Square)
    def square_cost(module, training, inputs, outputs):
        from minitorch_gpu.profiler import Cost
        n = int(np.prod(inputs[0][0]))
        return Cost(n, 2 * 4 * n)

    with profile(model, roofline=ROOF) as prof:
        model(mt.randn(3, 4))
    assert forward_rows(prof)["1"]["flops"] == 12


def test_the_cli_offers_the_profiler_sort_keys():
    from minitorch_gpu.cli import SORT_CHOICES
    from minitorch_gpu.profiler import SORT_KEYS
    assert SORT_CHOICES == SORT_KEYS


def test_a_pass_that_raises_leaves_the_model_as_it_was():
    model = small_gpt().train()
    too_long = mt.randint(0, 50, (2, 40))  # block size 32
    with pytest.raises(ValueError, match="block size is 32"):
        profile_model(model, too_long, too_long, backward=True, roofline=ROOF)
    assert model.training and autograd._observer is None
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert mt.amp.autocast_dtype() is None


def test_gpt_glue_bytes_follow_the_residual_stream_under_autocast():
    model = small_gpt()
    idx, targets = batch()
    with profile(model, roofline=ROOF) as prof:
        model(idx, targets)
    fp32 = {r["name"]: r["bytes"] for r in prof.rows}
    with profile(model, roofline=ROOF) as prof, mt.autocast("bf16"):
        model(idx, targets)
    mixed = {r["name"]: r["bytes"] for r in prof.rows}
    assert mixed["GPT (self)"] == fp32["GPT (self)"]  # the embeddings' add stays float32
    # c_fc reads layer norm's float32 output (its cast to bf16 is inside the layer), writes
    # a bf16 output, and reads its float32 weight once
    assert fp32["transformer.h.0.mlp.c_fc"] == 4 * (B * T * C + B * T * 4 * C + C * 4 * C)
    assert mixed["transformer.h.0.mlp.c_fc"] == 4 * B * T * C + 2 * B * T * 4 * C + 4 * C * 4 * C


def test_a_profile_refuses_what_it_cannot_profile():
    with pytest.raises(TypeError, match="expected a Module, got function"):
        profile(lambda x: x)
    model = small_gpt()
    with pytest.raises(ValueError, match="backward=True needs targets"):
        profile_model(model, batch()[0], None, backward=True, roofline=ROOF)
    with pytest.raises(ValueError, match="iters >= 1"):
        profile_model(model, *batch(), iters=0, roofline=ROOF)
    prof = profile(model, roofline=ROOF)
    with prof:
        with pytest.raises(RuntimeError, match="already recording"):
            prof.__enter__()
    assert "nothing recorded" in profile(model, roofline=ROOF).table()


def test_plot_needs_matplotlib_and_says_how_to_install_it(tmp_path, monkeypatch):
    model = small_gpt()
    with profile(model, roofline=ROOF) as prof:
        model(*batch())
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(RuntimeError, match=r'pip install "minitorch-gpu\[plot\]"'):
        prof.plot_roofline(tmp_path / "roofline.png")


def test_plot_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra is not installed")
    model = small_gpt()
    with profile(model, roofline=ROOF) as prof:
        model(*batch())
    path = prof.plot_roofline(tmp_path / "roofline.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the CLI, as a real process ----------------------------------------------------------
CONFIG = """\
model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 40}
data: {source: text_files, path: nowhere.txt}
train: {batch_size: 4}
system: {seed: 3}
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One cache for the CLI tests: the roofline is measured once, then read."""
    return tmp_path_factory.mktemp("cache")


def run_cli(*args: str, cwd: Path, cache: Path) -> subprocess.CompletedProcess:
    env = {"MINITORCH_GPU_CACHE": str(cache), "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "minitorch_gpu", "profile", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_cli_profiles_a_tiny_config(tmp_path, cache):
    (tmp_path / "tiny.yaml").write_text(CONFIG)
    done = run_cli("tiny.yaml", "--iters", "3", "--warmup", "1", "--backward",
                   "--trace", "out/trace.json", "--csv", "csv/rows.csv", "--sort", "time",
                   cwd=tmp_path, cache=cache)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "batch 4 x 16 tokens on cpu; forward and backward" in out
    assert "\nforward " in out and "\nbackward " in out and "(autograd engine)" in out
    assert "transformer.h.1.attn.core" in out
    assert "FLOPs counted:" in out and "without hooks" in out
    json.loads((tmp_path / "out" / "trace.json").read_text())
    assert (tmp_path / "csv" / "rows.csv").read_text().startswith("name,")  # folders made


def test_cli_depth_and_shapes(tmp_path, cache):
    (tmp_path / "tiny.yaml").write_text(CONFIG)
    done = run_cli("tiny.yaml", "--iters", "2", "--depth", "3", "--batch-size", "2",
                   "--seq-len", "8", cwd=tmp_path, cache=cache)
    assert done.returncode == 0, done.stderr
    assert "batch 2 x 8 tokens" in done.stdout
    assert "transformer.h.0" in done.stdout and "c_attn" not in done.stdout
    assert "\nbackward " not in done.stdout


@pytest.mark.parametrize("args, message", [
    (["--seq-len", "17"], "--seq-len 17 is longer than the model's block size 16"),
    (["--iters", "0"], "--iters >= 1"),
    (["--set", "model.vocab_size=null"], "--set model.vocab_size=N profiles without it"),
    (["--checkpoint", "missing.ckpt"], "missing.ckpt"),
    (["--sort", "flops", "--depth", "-1"], "--depth must be >= 0"),
    (["--device", "cuda:7"], "system.device: device 'cuda:7' is not available"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, cache, args, message):
    (tmp_path / "tiny.yaml").write_text(CONFIG)
    done = run_cli("tiny.yaml", *args, cwd=tmp_path, cache=cache)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_cli_profiles_in_bf16_against_the_bf16_roofline(tmp_path, cache):
    (tmp_path / "tiny.yaml").write_text(CONFIG)
    done = run_cli("tiny.yaml", "--iters", "2", "--set", "system.dtype=bf16", "--csv",
                   "rows.csv", cwd=tmp_path, cache=cache)
    assert done.returncode == 0, done.stderr
    assert "bf16 autocast" in done.stdout and "in bfloat16:" in done.stdout
    with open(tmp_path / "rows.csv", newline="") as f:
        rows = {r["name"]: r for r in csv.DictReader(f)}
    # bf16 activations: c_attn's output (4, 16, 96) at 2 bytes an element
    c_attn = rows["transformer.h.0.attn.c_attn"]
    assert int(c_attn["out_bytes"]) == 2 * 4 * 16 * 96


def test_cli_profiles_a_llama_config(tmp_path, cache):
    (tmp_path / "tiny.yaml").write_text(CONFIG.replace(
        "model: {", "model: {arch: llama, n_kv_head: 1, ffn_hidden: 48, "))
    done = run_cli("tiny.yaml", "--iters", "2", "--warmup", "1", "--backward", "--csv",
                   "rows.csv", cwd=tmp_path, cache=cache)
    assert done.returncode == 0, done.stderr
    assert "M-parameter Llama (2 layers, 2 heads, 1 key/value heads, 32 wide), batch 4 x " \
           "16 tokens" in done.stdout
    for name in ("model.layers.1.self_attn.core", "model.layers.1.self_attn.rotary",
                 "model.layers.0.mlp.act", "model.norm", "\nbackward "):
        assert name in done.stdout, name
    with open(tmp_path / "rows.csv", newline="") as f:
        rows = {(r["phase"], r["name"]): r for r in csv.DictReader(f)}
    core = rows["forward", "model.layers.0.self_attn.core"]  # 2 query heads of 16 dims
    assert int(core["flops"]) == 4 * 4 * 2 * 16 * 16 * 16 + 5 * 4 * 2 * 16 * 16
    assert core["bound"] in ("compute", "memory")
    assert int(rows["backward", "model.layers.0.self_attn.core"]["flops"]) == \
        2 * int(core["flops"])  # backward: twice the forward


def test_cli_profiles_a_checkpoint(tmp_path, cache):
    from minitorch_gpu.checkpoint import save_checkpoint
    from minitorch_gpu.data import CharTokenizer
    (tmp_path / "tiny.yaml").write_text(CONFIG)
    tokenizer = CharTokenizer.from_text("abcdefgh")
    mt.manual_seed(0)
    shape = GPTConfig(block_size=8, vocab_size=tokenizer.vocab_size, n_layer=1, n_head=2,
                      n_embd=16)
    model = GPT(shape)
    save_checkpoint(tmp_path / "m.ckpt", model.state_dict(),
                    meta={"model_config": vars(shape), "tokenizer": tokenizer.to_json()})
    done = run_cli("tiny.yaml", "--checkpoint", "m.ckpt", "--iters", "2", cwd=tmp_path,
                   cache=cache)
    assert done.returncode == 0, done.stderr
    assert "1 layers, 2 heads, 16 wide), batch 4 x 8 tokens" in done.stdout


def test_profile_on_each_device(device):
    """On a GPU the clock synchronises first, so spans hold their kernels: the matmuls of
    the blocks show time, forward and backward."""
    model = small_gpt().to(device)
    idx, targets = (t.to(device) for t in batch())
    prof = profile_model(model, idx, targets, warmup=1, iters=1, backward=True,
                         roofline=ROOF)
    rows = forward_rows(prof)
    assert rows["transformer.h.0.mlp.c_fc"]["time_ms"] > 0
    assert prof.summary["leaf_sum_ms"] > 0
    assert any(r["phase"] == "backward" and r["time_ms"] > 0 for r in prof.rows)
