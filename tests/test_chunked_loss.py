"""The chunked loss (trainer/worker/kernels/chunked_loss.py) equals HF's causal-LM loss: same loss, same
gradients (fp32 on the CPU, max abs diff ≤ 1e-5), for every family the loss-kernel rule calls exact
(``loss_kernel.CHUNKED_FAMILIES``: Llama- and Qwen2-shaped ones with Qwen's 151,936-token vocabulary, Gemma 2's
soft-capped logits), full and LoRA, with the Trainer's token normalisation and without; the worker installs
exactly the resolved kernel or refuses in the rule's words."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trainer import config as C  # noqa: E402
from trainer.core.errors import UserError  # noqa: E402
from trainer.planning import loss_kernel  # noqa: E402
from trainer.worker.kernels import chunked_loss  # noqa: E402

VOCAB = 151_936
CHUNK = 64  # tokens per chunk in these tests: every batch spans several chunks
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
SHAPES = {
    "llama": dict(model_type="llama", tie_word_embeddings=False, **SMALL),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True, **SMALL),
    "gemma2": dict(model_type="gemma2", head_dim=8, tie_word_embeddings=True, final_logit_softcapping=30.0, **SMALL),
}
# Every family the rule calls exact, as a tiny model (the family's own config class fills the rest)
FAMILY_SHAPES = {f: dict(model_type=f, **SMALL) for f in loss_kernel.CHUNKED_FAMILIES}
FAMILY_SHAPES["gemma2"] = SHAPES["gemma2"]
FAMILY_SHAPES["gemma3_text"] = dict(model_type="gemma3_text", head_dim=8, final_logit_softcapping=20.0, **SMALL)
FAMILY_SHAPES["phi"] = dict(model_type="phi", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4)  # a biased lm_head


def _model(kind: str, lora: bool = False, vocab: int = VOCAB, shapes: dict = SHAPES):
    conf = transformers.AutoConfig.for_model(**dict(shapes[kind], vocab_size=vocab, max_position_embeddings=512,
                                                    pad_token_id=0, bos_token_id=1, eos_token_id=2))
    torch.manual_seed(0)
    attn = "eager" if kind.startswith("gemma") else "sdpa"
    model = transformers.AutoModelForCausalLM.from_config(conf, dtype=torch.float32, attn_implementation=attn)
    if getattr(conf, "final_logit_softcapping", None):  # logits of tens: the soft-cap bends them (at init they are ~0.1)
        with torch.no_grad():
            model.lm_head.weight.mul_(300.0)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
        for name, p in model.named_parameters():  # non-zero B: the adapters' gradients are not trivially equal
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
    return model


def _batch(seq: int = 150, vocab: int = VOCAB):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (2, seq), generator=g)
    labels = ids.clone()
    labels[0, :seq // 4] = -100  # a prompt that is not trained
    labels[1, -7:] = -100  # padding
    return ids, labels


def _loss_and_grads(model, ids, labels, num_items):
    model.zero_grad(set_to_none=True)
    kwargs = {"num_items_in_batch": num_items} if num_items is not None else {}
    loss = model(input_ids=ids, labels=labels, **kwargs).loss
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


def _assert_same(model, ids, labels, tol: float = 1e-5, chunk: int = CHUNK, normalised: tuple = (None, 1000)):
    """Loss and every gradient equal HF's, with the Trainer's token normalisation (``num_items_in_batch``: the
    labelled tokens of all accumulated micro-batches) and without (None)."""
    assert (labels[:, 1:] != -100).sum() > 2 * chunk, "the batch spans several chunks"
    want = {n: _loss_and_grads(model, ids, labels, None if n is None else torch.tensor(n)) for n in normalised}
    assert chunked_loss.install(model, chunk_tokens=chunk)
    for n, (loss, grads) in want.items():
        got_loss, got_grads = _loss_and_grads(model, ids, labels, None if n is None else torch.tensor(n))
        assert abs(float(got_loss - loss)) <= tol, (n, float(got_loss), float(loss))
        assert got_grads.keys() == grads.keys()
        worst = max(float((got_grads[k] - grads[k]).abs().max()) for k in grads)
        assert worst <= tol, (n, worst)


def _case(lora: bool, kind: str, vocab: int, slow: bool = True):
    """One case of the test below; the 151,936-token vocabularies and LoRA measured >= 3.5 s on the 2-core machine."""
    return pytest.param(kind, vocab, lora, id=f"{'lora' if lora else 'full'}-{kind}-{vocab}",
                        marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("kind, vocab, lora", [_case(False, "llama", VOCAB), _case(False, "qwen2", VOCAB),
                                               _case(False, "gemma2", 32_000, slow=False), _case(True, "llama", VOCAB),
                                               _case(True, "qwen2", VOCAB), _case(True, "gemma2", 32_000)])
def test_chunked_loss_and_gradients_equal_hf(kind, vocab, lora):
    model = _model(kind, lora, vocab=vocab)
    _assert_same(model, *_batch(vocab=vocab))


@pytest.mark.parametrize("family", sorted(loss_kernel.CHUNKED_FAMILIES))
def test_every_family_the_rule_calls_exact_is_exact(family):
    """The rule's list is what the loss computes: a family added to CHUNKED_FAMILIES must pass this."""
    model = _model(family, vocab=512, shapes=FAMILY_SHAPES)
    assert chunked_loss.supported(model)
    _assert_same(model, *_batch(seq=64, vocab=512), chunk=8, normalised=(None,))


def test_gemma2_soft_capping_is_applied_as_liger_does():
    """``tanh(logits / cap) * cap`` in fp32 before the cross-entropy: without it the loss would differ."""
    model = _model("gemma2", vocab=32_000)
    ids, labels = _batch(vocab=32_000)
    with torch.no_grad():
        hf = float(model(input_ids=ids, labels=labels).loss)
        hidden = model.model(input_ids=ids).last_hidden_state
        uncapped = float(chunked_loss.chunked_causal_lm_loss(hidden, model.lm_head, labels, vocab=32_000,
                                                             chunk_tokens=CHUNK))
        capped = float(chunked_loss.chunked_causal_lm_loss(hidden, model.lm_head, labels, vocab=32_000,
                                                           chunk_tokens=CHUNK, softcap=30.0))
    assert capped == pytest.approx(hf, abs=1e-5) and abs(uncapped - hf) > 1e-3


@pytest.mark.slow  # measured >= 3.5 s on the 2-core machine
def test_a_lora_d_lm_head_goes_through_the_head_module_and_stays_exact():
    """PEFT wraps a targeted lm_head: the fused path cannot read its weight, the checkpointed chunks call it."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_model("llama", vocab=32_000), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                                      task_type="CAUSAL_LM",
                                                                      target_modules=["q_proj", "lm_head"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    assert not chunked_loss._plain_linear(model.get_base_model().lm_head)
    _assert_same(model, *_batch(vocab=32_000))


def test_bf16_autocast_over_fp32_weights_matches_hf_within_bf16_noise():
    """Mixed precision as the Trainer runs it (fp32 master weights, bf16 autocast): the head's matmuls in bf16."""
    model = _model("llama", vocab=4096)
    ids, labels = _batch(vocab=4096)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = _loss_and_grads(model, ids, labels, None)
        chunked_loss.install(model, chunk_tokens=CHUNK)
        got = _loss_and_grads(model, ids, labels, None)
    assert float(got[0]) == pytest.approx(float(want[0]), rel=1e-2)
    for k, g in want[1].items():
        assert got[1][k].dtype == g.dtype == torch.float32
        assert float((got[1][k] - g).norm() / g.norm()) < 0.02, k


def test_without_labels_the_logits_come_back_unchanged():
    model = _model("llama")
    ids, _ = _batch(seq=16)
    before = model(input_ids=ids).logits
    chunked_loss.install(model)
    after = model(input_ids=ids).logits
    assert torch.equal(before, after)
    assert model(input_ids=ids, labels=ids).logits is None  # the full logits never exist on the loss path


def test_evaluation_under_no_grad_computes_no_gradients():
    model = _model("llama", vocab=4096)
    ids, labels = _batch(vocab=4096)
    with torch.no_grad():
        want = float(model(input_ids=ids, labels=labels).loss)
        chunked_loss.install(model, chunk_tokens=CHUNK)
        loss = model(input_ids=ids, labels=labels).loss
    assert float(loss) == pytest.approx(want, abs=1e-5) and not loss.requires_grad
    assert all(p.grad is None for p in model.parameters())


def test_families_the_rule_calls_inexact_keep_hf_loss():
    conf = transformers.AutoConfig.for_model(model_type="gpt2", n_embd=32, n_layer=1, n_head=2, vocab_size=256)
    model = transformers.AutoModelForCausalLM.from_config(conf)
    assert not chunked_loss.install(model)


def _cfg(kernel: str, objective: str = "sft"):
    return C.validate({"device": "cpu", "model": {"architecture": "tiny-llama"}, "speed": {"loss_kernel": kernel},
                       "training": {"objective": objective}})


def test_the_worker_installs_the_resolved_kernel_or_refuses_in_the_rules_words():
    model = _model("llama", vocab=512)
    assert chunked_loss.install_kernel(model, _cfg("chunked"), "cpu") == "chunked"
    assert model.tp_loss_kernel == "chunked" and model(input_ids=_batch(vocab=512)[0], labels=_batch(vocab=512)[1]).logits is None
    plain = _model("llama", vocab=512)
    assert chunked_loss.install_kernel(plain, _cfg("hf"), "cpu") == "hf" and plain.tp_loss_kernel == "hf"
    with pytest.raises(UserError, match="liger needs an NVIDIA GPU") as err:  # never a silent switch to another loss
        chunked_loss.install_kernel(_model("llama", vocab=512), _cfg("liger"), "cpu")
    assert err.value.field == "speed.loss_kernel"
    gpt2 = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(model_type="gpt2", n_embd=32, n_layer=1, n_head=2, vocab_size=256))
    with pytest.raises(UserError, match="the chunked loss is not exact for gpt2 models; use hf"):
        chunked_loss.install_kernel(gpt2, _cfg("chunked"), "cpu")


@pytest.mark.slow  # compiles the per-chunk kernel with inductor's C++ backend (seconds to a minute on 2 cores)
def test_the_compiled_chunk_kernel_is_exact_and_runs_under_an_outer_compile(monkeypatch):
    """On CUDA each chunk's cross-entropy and gradient is one compiled kernel; compiled here on the CPU too (the
    same graph), it is exact, and a model compiled as speed.torch_compile compiles it (HF's Trainer wraps the
    model in torch.compile) still trains with it: the loss graph-breaks out of the outer graph."""
    monkeypatch.setattr(chunked_loss, "_ce_kernel", lambda device: torch.compile(chunked_loss._ce_and_grad, dynamic=True))
    for kind in ("llama", "gemma2"):
        _assert_same(_model(kind, vocab=4096), *_batch(vocab=4096))
    model = _model("llama", vocab=4096)
    ids, labels = _batch(vocab=4096)
    want = _loss_and_grads(model, ids, labels, None)
    chunked_loss.install(model, chunk_tokens=CHUNK)
    compiled = torch.compile(model)
    compiled.zero_grad(set_to_none=True)
    loss = compiled(input_ids=ids, labels=labels).loss
    loss.backward()
    assert float(loss) == pytest.approx(float(want[0]), abs=1e-5)
    worst = max(float((p.grad - want[1][n]).abs().max()) for n, p in model.named_parameters())
    assert worst <= 1e-5


@pytest.mark.slow
def test_cli_run_with_chunked_loss_gives_the_same_losses(tmp_path):
    from helpers_train import cli, events, losses, tiny_config, write_config

    runs = {}
    for kernel in ("hf", "chunked"):
        cfg = write_config(tmp_path / f"{kernel}.yaml", tiny_config(training={"max_steps": 4}, data={"packing": False},
                                                                    speed={"loss_kernel": kernel}))
        run = tmp_path / f"run-{kernel}"
        proc = cli("run", cfg, "--run-dir", run, "--quiet")
        assert proc.returncode == 0, proc.stderr
        runs[kernel] = run
        assert events(run, "run_started")[0]["loss_kernel"] == kernel
    a, b = losses(runs["hf"]), losses(runs["chunked"])
    assert a.keys() == b.keys() and len(a) == 4
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=1e-5), step


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_t5_chunked_loss_and_gradients_equal_hf(lora):
    conf = transformers.AutoConfig.for_model(model_type="t5", d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2,
                                             num_decoder_layers=2, vocab_size=32128, dropout_rate=0.0,
                                             feed_forward_proj="gated-gelu", tie_word_embeddings=True,
                                             decoder_start_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.AutoModelForSeq2SeqLM.from_config(conf, dtype=torch.float32)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear",
                                                 task_type="SEQ_2_SEQ_LM"))
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 32128, (2, 40), generator=g)
    labels = torch.randint(3, 32128, (2, 300), generator=g)
    labels[1, -50:] = -100  # padded target
    want = _loss_and_grads(model, ids, labels, None)
    assert chunked_loss.install(model, chunk_tokens=CHUNK)
    got = _loss_and_grads(model, ids, labels, None)
    assert abs(float(got[0] - want[0])) <= 1e-5
    assert max(float((got[1][k] - want[1][k]).abs().max()) for k in want[1]) <= 1e-5


@pytest.mark.slow
def test_cli_t5_run_with_chunked_loss_gives_the_same_losses(tmp_path):
    from helpers_pref import t5_config
    from helpers_train import cli, events, losses, write_config

    runs = {}
    for kernel in ("hf", "chunked"):
        cfg = write_config(tmp_path / f"{kernel}.yaml", t5_config(tmp_path, training={"max_steps": 3},
                                                                  speed={"loss_kernel": kernel}))
        run = tmp_path / f"run-{kernel}"
        proc = cli("run", cfg, "--run-dir", run, "--quiet")
        assert proc.returncode == 0, proc.stderr
        assert events(run, "run_started")[0]["loss_kernel"] == kernel
        runs[kernel] = losses(run)
    assert runs["hf"].keys() == runs["chunked"].keys() and len(runs["chunked"]) == 3
    assert runs["chunked"][1] == pytest.approx(runs["hf"][1], abs=1e-5)  # before any update: the same loss
    for step, loss in runs["hf"].items():  # after AdamW steps: fp32 summation order only (T5's loss is ~43)
        assert runs["chunked"][step] == pytest.approx(loss, rel=1e-5), step
