"""The chunked loss (trainer/worker/train/chunked_loss.py) equals HF's causal-LM loss: same loss, same
gradients (fp32 on the CPU, max abs diff ≤ 1e-5), for Llama- and Qwen2-shaped tiny models with Qwen's
151,936-token vocabulary, full and LoRA, with the Trainer's token normalisation and without."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trainer.planning.memory import loss_chunk_tokens  # noqa: E402
from trainer.worker.loading import chunked_loss  # noqa: E402

VOCAB = 151_936
SHAPES = {
    "llama": dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
    "qwen2": dict(model_type="qwen2", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
}


def _model(kind: str, lora: bool):
    conf = transformers.AutoConfig.for_model(**dict(SHAPES[kind], vocab_size=VOCAB, max_position_embeddings=512))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(conf, dtype=torch.float32, attn_implementation="sdpa")
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
        for name, p in model.named_parameters():  # non-zero B: the adapters' gradients are not trivially equal
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
    return model


def _batch(seq: int = 150):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, seq), generator=g)
    labels = ids.clone()
    labels[0, :40] = -100  # a prompt that is not trained
    labels[1, -7:] = -100  # padding
    return ids, labels


def _loss_and_grads(model, ids, labels, num_items):
    model.zero_grad(set_to_none=True)
    kwargs = {"num_items_in_batch": num_items} if num_items is not None else {}
    loss = model(input_ids=ids, labels=labels, **kwargs).loss
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_chunked_loss_and_gradients_equal_hf(kind, lora):
    model = _model(kind, lora)
    ids, labels = _batch()
    assert (labels[:, 1:] != -100).sum() > 2 * loss_chunk_tokens(VOCAB), "the batch spans several chunks"
    items = torch.tensor(1000)  # the Trainer's labelled tokens over all accumulated micro-batches
    want = {n: _loss_and_grads(model, ids, labels, n) for n in (None, items)}
    assert chunked_loss.install(model)
    for n, (loss, grads) in want.items():
        got_loss, got_grads = _loss_and_grads(model, ids, labels, n)
        assert abs(float(got_loss - loss)) <= 1e-5, (n, float(got_loss), float(loss))
        assert got_grads.keys() == grads.keys()
        worst = max(float((got_grads[k] - grads[k]).abs().max()) for k in grads)
        assert worst <= 1e-5, (n, worst)


def test_without_labels_the_logits_come_back_unchanged():
    model = _model("llama", False)
    ids, _ = _batch(seq=16)
    before = model(input_ids=ids).logits
    chunked_loss.install(model)
    after = model(input_ids=ids).logits
    assert torch.equal(before, after)
    assert model(input_ids=ids, labels=ids).logits is None  # the full logits never exist on the loss path


def test_families_with_soft_capped_logits_keep_hf_loss():
    conf = transformers.AutoConfig.for_model(model_type="gemma2", hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                             head_dim=16, vocab_size=256)
    model = transformers.AutoModelForCausalLM.from_config(conf, attn_implementation="eager")
    assert not chunked_loss.install(model)


@pytest.mark.slow
def test_cli_run_with_chunked_loss_gives_the_same_losses(tmp_path):
    from helpers_train import cli, events, losses, tiny_config, write_config

    runs = {}
    for chunked in (False, True):
        cfg = write_config(tmp_path / f"{chunked}.yaml", tiny_config(training={"max_steps": 4}, data={"packing": False},
                                                                    speed={"chunked_loss": chunked}))
        run = tmp_path / f"run-{chunked}"
        proc = cli("run", cfg, "--run-dir", run, "--quiet")
        assert proc.returncode == 0, proc.stderr
        runs[chunked] = run
        assert events(run, "run_started")[0]["loss_kernel"] == ("chunked" if chunked else "hf")
    a, b = losses(runs[False]), losses(runs[True])
    assert a.keys() == b.keys() and len(a) == 4
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=1e-5), step


def test_loss_path_takes_liger_only_on_cuda_with_the_package_and_a_family_it_patches():
    path = chunked_loss.loss_path
    assert path(True, "cuda", "llama", liger_installed=True) == "liger"
    assert path(True, "cuda", "qwen2", liger_installed=False) == "chunked"  # no liger-kernel / Triton
    assert path(True, "cpu", "llama", liger_installed=True) == "chunked"  # Triton kernels need CUDA
    assert path(True, "cuda", "stablelm", liger_installed=True) == "chunked"  # not a Liger family
    assert path(True, "cuda", "gemma2", liger_installed=True) == "liger"  # Liger soft-caps in its kernel
    assert path(True, "cpu", "gemma2", liger_installed=False) == "hf"  # ours would not be exact
    assert path(False, "cuda", "llama", liger_installed=True) == "hf"  # speed.chunked_loss: false


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
    assert chunked_loss.install(model)
    got = _loss_and_grads(model, ids, labels, None)
    assert abs(float(got[0] - want[0])) <= 1e-5
    assert max(float((got[1][k] - want[1][k]).abs().max()) for k in want[1]) <= 1e-5


@pytest.mark.slow
def test_cli_t5_run_with_chunked_loss_gives_the_same_losses(tmp_path):
    from helpers_pref import t5_config
    from helpers_train import cli, events, losses, write_config

    runs = {}
    for chunked in (False, True):
        cfg = write_config(tmp_path / f"{chunked}.yaml", t5_config(tmp_path, training={"max_steps": 3},
                                                                   speed={"chunked_loss": chunked}))
        run = tmp_path / f"run-{chunked}"
        proc = cli("run", cfg, "--run-dir", run, "--quiet")
        assert proc.returncode == 0, proc.stderr
        assert events(run, "run_started")[0]["loss_kernel"] == ("chunked" if chunked else "hf")
        runs[chunked] = losses(run)
    assert runs[False].keys() == runs[True].keys() and len(runs[True]) == 3
    for step, loss in runs[False].items():
        assert runs[True][step] == pytest.approx(loss, abs=1e-5), step
