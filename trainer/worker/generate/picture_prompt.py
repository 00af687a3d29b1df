"""Worker side of ``trainpilot-cli chat --image``: a picture in the prompt, rendered as training rendered pictures.

The processor comes from the folder being chatted with (``final/`` and every checkpoint carry the run's processor,
``data.image_max_pixels`` applied), else from the base model with the run's cap; the prompt goes through the same
chat rules and picture expansion as the training data (``datapipe.vision_inputs``), so the image tokens and the pixels the
model sees are the ones it was trained on.
"""
from __future__ import annotations

from pathlib import Path

from trainer.core.errors import UserError
from trainer.worker.datapipe import rendering
from trainer.worker.datapipe import vision_inputs as vision


def load(cfg, tok, source: Path | None, model):
    """The ``vision.Pictures`` of a vision-language model (None for a model that takes no pictures)."""
    processor = None
    if source is not None and any((source / name).is_file() for name in vision.PROCESSOR_CONFIGS):
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(str(source))
        if getattr(processor, "image_processor", None) is None:
            processor = None
    if processor is None:
        processor = vision.load_processor(cfg, tok)
        if processor is None:
            return None
        vision.cap(processor, cfg.data.image_max_pixels)
    if not getattr(tok, "chat_template", None) and getattr(processor, "chat_template", None):
        tok.chat_template = processor.chat_template
    processor.tokenizer = tok
    token = vision.config_image_token(getattr(model, "config", None)) if model is not None else None
    return vision.Pictures(processor, token if token is not None else vision.image_token_id(cfg, processor))


def prompt(cfg, tok, pictures, message: str, image: Path | None) -> tuple[list[int], dict]:
    """``(prompt ids, the model's picture inputs)`` of ``message`` about ``image`` (or no picture), as the run's
    chat rules render it with the processor's expansion."""
    content = ([{"type": "image", "image": str(image)}] if image is not None else []) + [{"type": "text", "text": message}]
    chat = rendering.chat_rules(tok, cfg, pictures)
    try:
        ids = chat.prompt_ids([{"role": "user", "content": content}])
    except ValueError as exc:
        raise UserError(f"--image: the chat template could not place the picture ({exc})", field="--image") from None
    if image is None:
        return ids, {}
    import torch

    return ids, pictures.model_inputs([[str(image)]], torch.tensor([ids]))
