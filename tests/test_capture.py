"""Capture keeps attention opaque: SDPA and nn.MultiheadAttention stay one attention op with their projections."""

import pytest
import torch
from torch import nn

from fusion_advisor.analyze.capture import _mha_as_sdpa


def test_mha_rewrite_matches_torch():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(64, 4, batch_first=False).eval()
    q, k, v = torch.randn(10, 3, 64), torch.randn(12, 3, 64), torch.randn(12, 3, 64)
    mask = torch.rand(10, 12) > 0.7
    for attn_mask in (None, mask, torch.randn(10, 12)):
        args = (q, k, v, 64, 4, mha.in_proj_weight, mha.in_proj_bias, None, None, False, 0.0,
                mha.out_proj.weight, mha.out_proj.bias)
        with torch.no_grad():
            want, _ = torch.nn.functional.multi_head_attention_forward(*args, training=False, need_weights=False,
                                                                       attn_mask=attn_mask)
            got, weights = _mha_as_sdpa(*args, training=False, need_weights=False, attn_mask=attn_mask)
        assert weights is None
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_mha_analysed_as_one_attention_op(tmp_path):
    from fusion_advisor.analyze.pipeline import analyze

    model = tmp_path / "mha.py"
    model.write_text(
        "import torch, torch.nn as nn\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.a = nn.MultiheadAttention(1024, 16, batch_first=True)\n"
        "    def forward(self, x):\n"
        "        return self.a(x, x, x, need_weights=False)[0]\n"
        "def get_inputs(): return [torch.randn(4, 2048, 1024)]\n"
        "def get_init_inputs(): return []\n"
    )
    a = analyze(model, device="meta", dtype="bf16")
    patterns = [c.pattern for c in a.chains]
    assert patterns.count("attention") == 1
    assert "softmax" not in patterns and "masked_softmax" not in patterns
    assert patterns.count("matmul") >= 2  # the in- and out-projections stay library GEMMs


class _LatentQueries(nn.Module):
    """Perceiver-style learned queries ``[1, H, Lq, E]`` shared over a batch of keys: SDPA broadcasts batch dims."""

    def __init__(self):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(1, 4, 16, 8))

    def forward(self, k, v):
        out = torch.nn.functional.scaled_dot_product_attention(self.latents, k, v)
        return out.transpose(1, 2).reshape(out.shape[0], 16, 32)


def test_opaque_attention_broadcasts_batch_dims_as_sdpa_does():
    from fusion_advisor.analyze.capture import _attention, _attention_fake

    F = torch.nn.functional
    # (q, k, v, mask, enable_gqa): q's batch broadcast over k's, k's heads broadcast, GQA, a broadcast mask
    cases = [
        (torch.randn(1, 4, 16, 8), torch.randn(3, 4, 20, 8), torch.randn(3, 4, 20, 8), None, False),
        (torch.randn(3, 4, 16, 8), torch.randn(3, 1, 20, 8), torch.randn(3, 1, 20, 8), None, False),
        (torch.randn(1, 4, 16, 8), torch.randn(3, 2, 20, 8), torch.randn(3, 2, 20, 8), None, True),
        (torch.randn(1, 4, 16, 8), torch.randn(3, 4, 20, 8), torch.randn(3, 4, 20, 8), torch.randn(16, 20), False),
    ]
    for q, k, v, mask, gqa in cases:
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **({"enable_gqa": True} if gqa else {}))
        real = _attention(q, k, v, mask, 0.0, False, None, gqa)
        with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
            f = [None if t is None else mode.from_tensor(t) for t in (q, k, v, mask)]
            fake = _attention_fake(*f[:3], f[3], 0.0, False, None, gqa)
        assert fake.shape == want.shape == real.shape and fake.stride() == real.stride(), (q.shape, k.shape)
        torch.testing.assert_close(real, want)


def test_latent_query_model_is_captured_by_dynamo_and_matches_eager():
    from torch._dynamo.backends.common import aot_autograd

    from fusion_advisor.analyze.capture import _capture_dynamo, keep_attention_opaque

    torch.manual_seed(0)
    model, k = _LatentQueries().eval(), torch.randn(2, 4, 24, 8)
    # a wrong fake shape failed dynamo here, and capture fell back to export (decomposed attention, no --profile)
    cap = _capture_dynamo(model, (k, k))
    assert cap.method == "dynamo" and len(cap.graphs) == 1
    assert any("attention" in str(n.target) for n in cap.graphs[0].graph.nodes)
    # the captured graph (attention opaque) computes what the model computes
    aot = aot_autograd(fw_compiler=lambda gm, _: gm.forward, bw_compiler=lambda gm, _: gm.forward)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=lambda gm, ex: (keep_attention_opaque(gm), aot(gm, ex))[1],
                             dynamic=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(k, k), model(k, k))
    torch._dynamo.reset()


def test_attention_flops_count_the_broadcast_batch(tmp_path):
    from fusion_advisor.analyze.pipeline import analyze

    model = tmp_path / "latent.py"
    model.write_text(
        "import torch, torch.nn as nn, torch.nn.functional as F\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.q = nn.Parameter(torch.randn(1, 4, 16, 8))\n"
        "    def forward(self, k):\n"
        "        return F.scaled_dot_product_attention(self.q, k, k)\n"
        "def get_inputs(): return [torch.randn(3, 4, 20, 8)]\n"
        "def get_init_inputs(): return []\n"
    )
    a = analyze(model, device="meta")
    att = [o for o in a.ops if o.category == "attention"]
    assert len(att) == 1 and a.capture_method == "dynamo"
    assert att[0].flops == 2 * (3 * 4) * 16 * 20 * (8 + 8)  # QK^T and PV over the output's 3 x 4 batch x heads


def test_gpu_only_view_after_attention_gets_a_hint(tmp_path):
    # `.transpose(1, 2).view(...)` of SDPA's output works on a GPU (token-major output) but not on a CPU or meta
    # device: the refusal says why and what to write instead
    import pytest

    from fusion_advisor.analyze.pipeline import analyze
    from fusion_advisor.errors import ModelRunError

    model = tmp_path / "tview.py"
    model.write_text(
        "import torch, torch.nn as nn, torch.nn.functional as F\n"
        "class Model(nn.Module):\n"
        "    def forward(self, q):\n"
        "        return F.scaled_dot_product_attention(q, q, q).transpose(1, 2).view(2, 16, 32)\n"
        "def get_inputs(): return [torch.randn(2, 4, 16, 8)]\n"
        "def get_init_inputs(): return []\n"
    )
    with pytest.raises(ModelRunError, match=r"tview.py:4: .*use \.reshape\(\.\.\.\)"):
        analyze(model, device="meta")


def test_profiler_noise_on_native_stderr_is_held_back(capfd):
    # libkineto writes "USDT: ... profiler_start" to fd 2 at every torch.profiler session; analyze --profile and
    # bench must not show it, but any other line written there (a real error) must still come through.
    import os

    from fusion_advisor.analyze.capture import quiet_native_stderr

    capfd.readouterr()
    with quiet_native_stderr():
        os.write(2, b"USDT:2026-12-01 11:11:26 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a real native error\n")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            torch.ones(4).add_(1)
    err = capfd.readouterr().err
    assert "USDT" not in err and "profiler_start" not in err
    assert "a real native error" in err


# --- cuDNN recurrent layers -------------------------------------------------------------------------------------

_RNN_MODEL = (
    "import torch, torch.nn as nn\n"
    "class Model(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.lstm = nn.LSTM(16, 32, 2, batch_first=True)\n"
    "        self.gru = nn.GRU(32, 24, 1, bidirectional=True)\n"
    "        self.fc = nn.Linear(48, 4)\n"
    "    def forward(self, x):\n"
    "        out, (h, c) = self.lstm(x)\n"
    "        out2, h2 = self.gru(out.transpose(0, 1))\n"
    "        return self.fc(out2[-1]) + h.sum() + h2.sum()\n"
    "def get_inputs(): return [torch.randn(3, 10, 16)]\n"
    "def get_init_inputs(): return []\n"
)


def test_recurrent_layers_are_one_op_each_with_their_steps_and_flops(tmp_path):
    from fusion_advisor.analyze.pipeline import analyze

    model = tmp_path / "rnn.py"
    model.write_text(_RNN_MODEL)
    a = analyze(model)
    rec = [o for o in a.ops if o.category == "recurrent"]
    assert [(o.variant, o.sequential_steps) for o in rec] == [("lstm", 2 * 10), ("gru", 2 * 10)]
    # LSTM: 4 gates of 32 over inputs 16 (layer 0) and 32 (layer 1) and the hidden 32; 30 tokens, 2 FLOPs per MAC
    assert rec[0].flops == 2 * 30 * 128 * (16 + 32 + 32 + 32)
    assert rec[1].flops == 2 * 30 * 72 * (32 + 24) * 2  # two directions of 3 gates of 24
    assert [tuple(m.shape) for m in rec[0].outputs] == [(3, 10, 32), (2, 3, 32), (2, 3, 32)]
    assert not any(o.category == "matmul" and "lstm" in o.module_path for o in a.ops)  # not unrolled into matmuls
    # cuDNN issues each cell step from the host: launch-bound layers go to a CUDA graph of the whole model (apply's
    # torch.cuda.graph capture), which replays the steps at their device time; torch.compile's reduce-overhead does
    # not reach them, so the whole model's predicted route prices them as written
    recurrent = [c for c in a.chains if c.pattern == "recurrent"]
    assert recurrent and all(a.estimates[c.id].bound == "launch" for c in recurrent)
    assert {a.decisions[c.id].route for c in recurrent} == {"cudagraphs"}
    assert all(a.estimates[c.id].cudagraphs_us < a.estimates[c.id].eager_us / 2 for c in recurrent)
    from fusion_advisor.report import views
    from fusion_advisor.report.write import chains_frame

    frame = chains_frame(a)
    as_written = float(frame.loc[frame["pattern"] == "recurrent", "est_eager_us"].sum())
    assert views.predicted_model_routes(frame)["reduce-overhead"] >= as_written


def test_the_opaque_recurrent_op_computes_what_torch_does():
    from fusion_advisor.analyze.capture import _recurrent_call

    torch.manual_seed(0)
    lstm, gru = nn.LSTM(8, 16, 2, bidirectional=True), nn.GRU(8, 16, 1, batch_first=True)
    x = torch.randn(5, 3, 8)
    h0, c0 = torch.randn(4, 3, 16), torch.randn(4, 3, 16)
    with torch.no_grad():
        want, (h, c) = lstm(x, (h0, c0))
        got = _recurrent_call("lstm")(x, (h0, c0), lstm._flat_weights, True, 2, 0.0, False, True, False)
        torch.testing.assert_close(got[0], want)
        torch.testing.assert_close(got[2], c)
        want_g, hg = gru(x.transpose(0, 1))
        got_g = _recurrent_call("gru")(x.transpose(0, 1), torch.zeros(1, 3, 16), gru._flat_weights, True, 1, 0.0,
                                       False, False, True)
        torch.testing.assert_close(got_g[0], want_g)
        torch.testing.assert_close(got_g[1], hg)


def test_apply_captures_recurrent_layers_as_torch_compile_does(tmp_path):
    from fusion_advisor.analyze.capture import capture
    from fusion_advisor.analyze.load import load_model

    model = tmp_path / "rnn.py"
    model.write_text(_RNN_MODEL)
    loaded = load_model(model)
    kept = capture(loaded)
    broken = capture(loaded, recurrent=False)  # apply's numbering: dynamo leaves the RNNs out, as for torch.compile

    def recurrent_nodes(cap):
        return sum("recurrent" in str(n.target) for g in cap.graphs for n in g.graph.nodes)

    assert kept.method == "dynamo" and recurrent_nodes(kept) == 2
    assert recurrent_nodes(broken) == 0


def test_an_exported_recurrent_layer_is_priced_as_the_opaque_one(tmp_path):
    """apply's capture breaks dynamo's graph at RNNs and may fall back to export, which records ``aten.gru.input``:
    the same cell, steps and FLOPs as analyze's opaque op."""
    from fusion_advisor.analyze.capture import capture
    from fusion_advisor.analyze.load import load_model
    from fusion_advisor.analyze.pipeline import analyze_capture
    from fusion_advisor.analyze.rules import load_rules
    from fusion_advisor.devices import load_spec

    model = tmp_path / "gru.py"
    model.write_text("import torch, torch.nn as nn\n"
                     "class Model(nn.Module):\n"
                     "    def __init__(self):\n"
                     "        super().__init__(); self.gru = nn.GRU(8, 16, 2)\n"
                     "    def forward(self, x):\n"
                     "        return self.gru(x)[0]\n"
                     "def get_inputs(): return [torch.randn(5, 3, 8)]\n"
                     "def get_init_inputs(): return []\n")
    loaded = load_model(model, device="cpu")
    spec, rules = load_spec("h200"), load_rules()
    ops = {}
    for recurrent in (True, False):
        a = analyze_capture(loaded, capture(loaded, recurrent=recurrent), spec, rules)
        ops[recurrent] = [o for o in a.ops if o.category == "recurrent"]
    assert [(o.variant, o.sequential_steps, o.flops) for o in ops[False]] == \
        [(o.variant, o.sequential_steps, o.flops) for o in ops[True]] == [("gru", 10, 2 * 15 * 48 * (8 + 16 + 16 + 16))]


class _DeadWork(nn.Module):
    """A computed, discarded product (line ``dead``) and nn.MultiheadAttention's head-averaged weights, which it
    computes whenever ``need_weights`` is left at its default, here discarded."""

    def __init__(self, need_weights: bool = True):
        super().__init__()
        self.attn, self.need_weights = nn.MultiheadAttention(32, 4, batch_first=True), need_weights

    def forward(self, x):
        _scores = x @ x.transpose(1, 2)  # dead: computed, never used
        out, _ = self.attn(x, x, x, need_weights=self.need_weights)
        return out


def _loaded(model, inputs, device="meta"):
    from fusion_advisor.analyze.load import LoadedModel

    return LoadedModel("m", "<test>", "test", model.to(device).eval(), tuple(x.to(device) for x in inputs), device, "")


def test_unused_nodes_are_the_eager_work_no_output_depends_on():
    from fusion_advisor.analyze.capture import unused_nodes

    x = torch.randn(2, 16, 32)
    dead = {str(n.target) for n in unused_nodes(_loaded(_DeadWork(), (x,)))}
    # the calls as the code makes them (traced before dispatch: matmul, not the bmm it decomposes into)
    assert "aten.matmul.default" in dead and "aten.mean.dim" in dead  # the product, the weights' mean over heads
    # need_weights=False: the fused path, no weights averaged; the product is still dead
    dead = {str(n.target) for n in unused_nodes(_loaded(_DeadWork(need_weights=False), (x,)))}
    assert "aten.matmul.default" in dead and "aten.mean.dim" not in dead
    # SDPA decomposed on the meta device leaves dead intermediates of its own (two casts on the built-in model):
    # not the model's work, and not seen before dispatch
    from fusion_advisor.analyze.load import load_model

    assert unused_nodes(load_model(None, "meta")) == []
    # everything used, and in-place updates of state (BatchNorm's running statistics in training) count as used
    bn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    assert unused_nodes(_loaded(bn.train(), (torch.randn(2, 3, 8, 8),))) == []
    # only on the meta device (a real trace would hold every intermediate tensor; the pipeline builds a meta copy)
    assert unused_nodes(_loaded(_DeadWork(), (x,), device="cpu")) == [] and unused_nodes(None) == []


def test_unused_work_is_priced_named_and_paid_by_the_eager_route_only(tmp_path):
    import pytest

    from fusion_advisor.analyze.pipeline import analyze
    from fusion_advisor.analyze.records import Analysis
    from fusion_advisor.report import views
    from fusion_advisor.report.write import chains_frame

    f = tmp_path / "dead.py"
    f.write_text(
        "import torch\n"
        "class Model(torch.nn.Module):\n"
        "    def forward(self, x, w):\n"
        "        unused = torch.relu(x @ w)\n"
        "        return x * 2\n"
        "def get_inputs():\n"
        "    return [torch.randn(2048, 2048), torch.randn(2048, 2048)]\n"
        "def get_init_inputs():\n"
        "    return []\n")
    a = analyze(f, device="meta", gpu="h200")
    assert a.unused is not None and a.unused.ops == 2 and a.unused.lines == ["dead.py:4"]
    assert a.unused.flops == 2 * 2048 ** 3 + 2048 ** 2 and a.unused.eager_us > 0
    assert any("eager runs 2 op(s)" in w and "dead.py:4" in w for w in a.warnings)
    assert Analysis.from_dict(a.to_dict()).unused == a.unused  # report.json keeps it
    frame = chains_frame(a)
    routes = views.analysis_model_routes(a, frame)
    assert routes["eager"] == pytest.approx(float(frame["est_eager_us"].sum()) + a.unused.eager_us)
    # and torch.compile(model) is priced with the spec's host costs per call, for its one graph
    calls = views.HostCalls.of(a)
    assert calls.compiled_call_us == a.device_spec["compiled_call_us"] > 0 and calls.graphs == 1
    assert routes["torch.compile"] == pytest.approx(views.predicted_model_routes(frame, calls=calls)["torch.compile"])
    # on a cpu device the model is built again on meta and traced there: the same finding
    assert analyze(f, device="cpu", gpu="h200").unused == a.unused
    # work the trace's output does not show but dynamo keeps (a dataclass returned, a tensor kept on the module):
    # the captured graphs hold an op of the same line and shape, so it is not unused
    f.write_text(
        "import dataclasses\nimport torch\n"
        "@dataclasses.dataclass\nclass Out:\n    y: torch.Tensor\n"
        "class Model(torch.nn.Module):\n"
        "    def forward(self, x, w):\n"
        "        self.kept = torch.relu(x @ w)\n"
        "        return Out(y=x * 2)\n"
        "def get_inputs():\n"
        "    return [torch.randn(2048, 2048), torch.randn(2048, 2048)]\n"
        "def get_init_inputs():\n"
        "    return []\n")
    kept = analyze(f, device="meta", gpu="h200")
    assert kept.unused is None and any(c.pattern == "matmul" for c in kept.chains)
    # a model with nothing unused: no record, no warning
    f.write_text(f.read_text().replace("self.kept = torch.relu(x @ w)", "x = torch.relu(x @ w)"))
    a = analyze(f, device="meta", gpu="h200")
    assert a.unused is None and not any("eager runs" in w for w in a.warnings)


def test_unused_nodes_not_looked_for_in_a_model_with_a_recurrent_layer():
    """make_fx would unroll the cuDNN layer step by step (minutes for KernelBench's LSTMs): no claim."""
    from fusion_advisor.analyze.capture import unused_nodes

    class Rnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm, self.fc = nn.LSTM(8, 8, batch_first=True), nn.Linear(8, 4)

        def forward(self, x):
            out, (h, _) = self.lstm(x)
            self.fc(out[:, -1])  # dead, but not looked for
            return h

    assert unused_nodes(_loaded(Rnn(), (torch.randn(2, 5, 8),))) == []


def test_a_capture_failure_names_its_cause_even_past_the_cut():
    from fusion_advisor.analyze.capture import failure_text

    try:
        try:
            raise AssertionError("convert all Tensors to FakeTensors first")
        except AssertionError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as e:
        assert failure_text(e) == ("RuntimeError: wrapped (caused by AssertionError: convert all Tensors to "
                                   "FakeTensors first)")
    # dynamo's fake-tensor errors hold the cause in a long message, past the one-line cut
    long = RuntimeError("Dynamo failed to run FX node with fake tensors: " + "x " * 200
                        + "got AssertionError('Please convert all Tensors to FakeTensors first')\n  Hint: ...")
    assert failure_text(long).endswith("(caused by AssertionError('Please convert all Tensors to FakeTensors first') "
                                       "Hint: ...)")
    assert failure_text(RuntimeError("short: got ValueError('x')")) == "RuntimeError: short: got ValueError('x')"


def test_a_forward_dynamo_skips_names_the_break_and_the_loop(tmp_path):
    """A fresh user's recurrence with `if h.abs().max() > 100:` inside its loop: dynamo skips the whole frame (a
    graph break in a loop), captured nothing, and the error said only "no method could capture the model"."""
    from fusion_advisor.analyze.capture import CaptureError, _capture_dynamo, skipped_frame_reason
    from fusion_advisor.analyze.load import load_model

    path = tmp_path / "loop.py"
    path.write_text("import torch\n\nclass Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                    "        self.cell = torch.nn.Linear(8, 8)\n\n    def forward(self, x):\n"
                    "        for _ in range(3):\n            x = torch.tanh(self.cell(x))\n"
                    "            if x.abs().max() > 100:\n                x = x / 100\n        return x\n\n"
                    "def get_inputs():\n    return [torch.randn(4, 8)]\n\ndef get_init_inputs():\n    return []\n")
    loaded = load_model(path, device="cpu")
    with pytest.raises(CaptureError) as info:
        _capture_dynamo(loaded.module, loaded.inputs)
    said = str(info.value)
    assert f"{path}:11: Data-dependent branching inside a loop" in said, said
    assert "torch.compile(model) runs it eagerly" in said
    assert skipped_frame_reason([]) == ""
    # a break outside any loop: named, with no loop clause
    assert skipped_frame_reason(['Unsupported call\n  # File "m.py", line 4, in forward']) == \
        "m.py:4: Unsupported call"
