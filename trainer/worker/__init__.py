"""The worker room: the only place that imports torch, transformers, peft, deepspeed, datasets."""
