"""The tiled MLP (trainer/worker/kernels/tiled_mlp.py) is exact: the loss and every gradient (every weight for a full
fine-tune, the adapters for LoRA) equal the untiled model's within fp32 rounding, for the shipped families (tiny
models of their real configs), with and without gradient checkpointing, on packed (position_ids) and padded batches;
its tiles really run (one call per tile) and really save less; dropout is replayed, whatever forward the block has at
call time is tiled, and what cannot be tiled exactly is refused naming speed.tiled_mlp."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from helpers_arch import tiny_config  # noqa: E402
from helpers_kernels import SEQ, assert_equal, loss_and_grads, tiny_batch, tiny_model  # noqa: E402

from trainer.core.errors import UserError  # noqa: E402
from trainer.worker.kernels import tiled_mlp  # noqa: E402

# (family, LoRA): each shipped family once, full or LoRA (Llama both); a model takes seconds to build and warm up
CASES = [("llama", False), ("llama", True), ("qwen2", False), ("qwen3", True), ("mistral", True), ("gemma2", False),
         ("gemma3_text", True), ("phi3", False), ("smollm3", True), ("qwen3_moe", False), ("granite", True),
         ("olmo2", False), ("lfm2", True)]
@pytest.mark.slow
@pytest.mark.parametrize("family,lora", CASES, ids=[f"{f}-{'lora' if lo else 'full'}" for f, lo in CASES])
def test_tiled_loss_and_gradients_equal_the_untiled_ones(family, lora):
    model = tiny_model(family, lora)
    batches = [tiny_batch("padding"), tiny_batch("packing")]
    ref = [loss_and_grads(model, b) for b in batches]
    assert tiled_mlp.install(model) > 0
    for b, r in zip(batches, ref):
        assert_equal(r, loss_and_grads(model, b))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        model.enable_input_require_grads()
    for b, r in zip(batches, ref):
        assert_equal(r, loss_and_grads(model, b))


@pytest.mark.slow
def test_the_tiles_really_run_and_the_block_saves_only_its_input():
    """One call of the MLP's projection per tile (5 tiles of 60 of the 300 tokens; a batch of at most ``hidden``
    tokens runs untiled), and the forward saves less for backward: each layer's MLP intermediates (gate, up,
    activation, product: 4 × intermediate values per token) and its norms' fp32 copies are gone."""
    from trainer.worker.probes.memory_probe import saved_storages

    model = tiny_model("llama")
    layer = model.model.layers[0]
    calls = []
    layer.mlp.gate_proj.register_forward_hook(lambda m, i, o: calls.append(i[0].shape))
    batch = tiny_batch("packing")
    with saved_storages(model) as before:
        model(**batch).loss.backward()
    tiled_mlp.install(model)
    calls.clear()
    with saved_storages(model) as after:
        model(**batch).loss.backward()
    assert [tuple(s) for s in calls] == [(1, 60, 64)] * 5 * 2  # forward, then the recompute in backward
    c = model.config
    mlp_bytes = c.num_hidden_layers * 2 * SEQ * 4 * c.intermediate_size * 4  # fp32 gate, up, act, product
    assert sum(before.values()) - sum(after.values()) >= mlp_bytes
    calls.clear()
    short = {k: v[:, :32] for k, v in batch.items()}  # 64 tokens = hidden: one tile, the block as it was
    model(**short)
    assert [tuple(s) for s in calls] == [(2, 32, 64)]


def test_tile_rows_split_evenly_and_never_exceed_the_hidden_size():
    assert tiled_mlp.tile_rows(300, 64) == 60
    assert tiled_mlp.tile_rows(64, 64) == 64
    assert tiled_mlp.tile_rows(49_152, 4096) == 4096
    assert tiled_mlp.tile_rows(49_153, 4096) == 3781  # 13 tiles of 3,781
    assert all(tiled_mlp.tile_rows(n, 896) <= 896 for n in range(1, 5000, 37))


@pytest.mark.slow
def test_lora_dropout_is_replayed_in_the_tiles_recompute():
    """With dropout the tiles draw other masks than one untiled call (so the losses differ), but backward must
    recompute each tile with the masks its forward drew: the gradients equal autograd's through the same tiles
    run with grad (the reference: each tile's graph kept, same seed)."""
    model = tiny_model("llama", lora=True, lora_dropout=0.3)
    batch = tiny_batch("padding")
    tiled_mlp.install(model)
    torch.manual_seed(5)
    got = loss_and_grads(model, batch)
    plain = tiled_mlp._TiledCall.apply

    def with_grad(tiling, x, *params):  # the same tiles, autograd through each (no recompute)
        return tiling.forward(x, for_backward=False)

    tiled_mlp._TiledCall.apply = with_grad
    try:
        torch.manual_seed(5)
        ref = loss_and_grads(model, batch)
    finally:
        tiled_mlp._TiledCall.apply = plain
    assert_equal(ref, got)
    torch.manual_seed(5)
    again = loss_and_grads(model, batch)  # and the caller's RNG is left as forward left it
    assert_equal(got, again, tol=0.0)


@pytest.mark.slow
def test_the_forward_the_block_has_at_call_time_is_tiled():
    """Liger binds its SwiGLU/RMSNorm forward on the module instance after the model is built (HF's Trainer applies
    it at train()): the tiled call runs whatever forward the instance has then."""
    model = tiny_model("llama")
    tiled_mlp.install(model)
    mlp = model.model.layers[1].mlp
    seen = []

    def forward(self, x):  # a fused kernel's stand-in: same maths, its own code path
        seen.append(x.shape[1])
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    ref = loss_and_grads(model, tiny_batch("padding"))
    mlp.__dict__["forward"] = forward.__get__(mlp, type(mlp))
    assert_equal(ref, loss_and_grads(model, tiny_batch("padding")))
    assert seen == [60] * 10


@pytest.mark.slow
def test_evaluation_without_grad_tiles_and_matches():
    model = tiny_model("qwen3")
    batch = tiny_batch("padding")
    with torch.no_grad():
        ref = model(**batch).logits
        tiled_mlp.install(model)
        got = model(**batch).logits
    assert torch.allclose(ref, got, atol=1e-5)


@pytest.mark.slow
def test_an_encoder_decoder_tiles_both_stacks():
    import json

    from trainer.core.paths import MODELS_DIR

    d = {k: v for k, v in json.loads((MODELS_DIR / "tiny-t5.json").read_text()).items() if not k.startswith("_")}
    conf = transformers.AutoConfig.for_model(**dict(d, dropout_rate=0.0))
    torch.manual_seed(0)
    model = transformers.AutoModelForSeq2SeqLM.from_config(conf, dtype=torch.float32).train()
    g = torch.Generator().manual_seed(2)
    batch = {"input_ids": torch.randint(3, 100, (2, 150), generator=g),
             "labels": torch.randint(3, 100, (2, 90), generator=g)}
    ref = loss_and_grads(model, batch)
    assert tiled_mlp.install(model) == 2 * 3 + 2 * 4  # per block: its MLP and layer norms
    assert_equal(ref, loss_and_grads(model, batch))


@pytest.mark.parametrize("family,needle", [("qwen3_moe", "output_router_logits"), ("gpt_oss", "router's scores")])
def test_what_cannot_be_tiled_exactly_is_refused_naming_the_field(family, needle):
    conf = transformers.AutoConfig.for_model(**tiny_config(family))
    if family == "qwen3_moe":
        conf.output_router_logits = True
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(conf, attn_implementation="eager")
    with pytest.raises(UserError) as err:
        tiled_mlp.install(model)
    assert err.value.field == "speed.tiled_mlp" and needle in str(err.value)


def test_a_layer_without_a_known_mlp_is_refused():
    model = tiny_model("llama")
    for layer in model.model.layers:
        layer.ffn_custom = layer.mlp
        del layer.mlp
    with pytest.raises(UserError, match="no MLP named mlp"):
        tiled_mlp.install(model)


@pytest.mark.slow
def test_torch_compile_runs_the_tiled_blocks_eagerly_and_stays_exact():
    """speed.torch_compile compiles the model; dynamo breaks the graph at each tiled block (it cannot trace autograd
    inside a backward) and compiles the rest. aot_eager: dynamo and AOTAutograd without a C++ toolchain."""
    model = tiny_model("llama", lora=True)
    batch = tiny_batch("padding")
    ref = loss_and_grads(model, batch)
    tiled_mlp.install(model)
    compiled = torch.compile(model, backend="aot_eager")
    for _ in range(2):  # the compiling call, then the compiled one
        model.zero_grad(set_to_none=True)
        out = compiled(**batch)
        out.loss.backward()
        assert_equal(ref, (out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                               if p.grad is not None}))


@pytest.mark.slow
def test_a_4bit_base_with_lora_tiles_within_bf16_rounding():
    """QLoRA's base: bitsandbytes' 4-bit Linears (its CPU backend) under bf16 autocast, the adapters fp32; the tiled
    path's adapter gradients equal the untiled ones within bf16 rounding (2^-8 relative per product)."""
    from peft import LoraConfig, get_peft_model

    from trainer.worker.loading import kbit

    conf = transformers.AutoConfig.for_model(**tiny_config("llama"))
    torch.manual_seed(0)
    model = kbit.random_4bit_model(transformers.AutoModelForCausalLM, conf, torch.bfloat16, "cpu",
                                   {"attn_implementation": "sdpa"}, "bf16")
    model.config.use_cache = False
    kbit.prepare_kbit_model(model, checkpointing=True)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear",
                                             task_type="CAUSAL_LM")).train()
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    batch = tiny_batch("padding")

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return loss_and_grads(model, batch)

    (l0, g0) = run()
    assert type(model.base_model.model.model.layers[0].mlp.gate_proj.base_layer).__name__ == "Linear4bit"
    tiled_mlp.install(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    (l1, g1) = run()
    assert l1.item() == pytest.approx(l0.item(), rel=1e-3) and g0.keys() == g1.keys()
    worst = max(((g0[k] - g1[k]).abs().max() / g0[k].abs().max().clamp_min(1e-12)).item() for k in g0)
    assert worst <= 2e-2, worst
